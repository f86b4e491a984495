"""Issue 4's ablation: curriculum with EWC, curriculum without EWC, the final stage only; same seed and budget.

    python bench/curriculum_ablation.py --out runs/ablation            # train the three runs, then the tables
    python bench/curriculum_ablation.py --out runs/ablation --tables   # tables only, from finished runs

Each run is `cpu-grpo train --profile default` (basic, intermediate, advanced: 10 steps each, 100 held-out
problems per level) with one change. The base model's evaluation is the same in all three (same model,
same problems, greedy), so it is computed once and copied. Until the end of stage 1 the runs with and
without EWC are the same computation (no Fisher exists yet; same seed, data and samples), so `noewc`
branches from `ewc`'s stage-1 checkpoint (`--resume`), as the committed results did. Extra arguments go to
every `cpu-grpo train` (e.g. `--threads 1`, or `--ewc-lambda 10` to try another lambda for the EWC run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from cpu_grpo import stats
from cpu_grpo.report import forgetting_table
from cpu_grpo.tracking import read_jsonl

RUNS = {  # name -> arguments on top of --profile default
    "ewc": [],
    "noewc": ["--ewc-lambda", "0"],
    "final": ["--stages", "advanced:30", "--eval-task", "basic,intermediate"],
}


def branch(src: Path, dst: Path, stage: str) -> None:
    """Copy run `src` as it was at the end of `stage` (checkpoint, logs, evaluations) into `dst`."""
    ckpt = next(c for c in sorted((src / "checkpoints").glob("step-*"))
                if (c / "STAGE_END").exists() and (c / "STAGE_END").read_text().strip() == stage)
    step = int(ckpt.name.split("-")[1])
    shutil.copytree(ckpt, dst / "checkpoints" / ckpt.name)
    for name in ("metrics.jsonl", "groups.jsonl", "stages.jsonl"):
        kept = [r for r in read_jsonl(src / name) if r.get("step", r.get("end_step", 0)) <= step]
        (dst / name).write_text("".join(json.dumps(r) + "\n" for r in kept))
    shutil.copytree(src / "evals", dst / "evals", ignore=lambda d, names: [n for n in names if stage not in n])


def train_all(out: Path, extra: list[str]) -> None:
    for name, args in RUNS.items():
        run = out / name
        if (run / "summary.json").exists():
            continue
        if name == "noewc" and not run.exists():
            branch(out / "ewc", run, "basic")
        base = out / "ewc" / "eval_before.jsonl"
        if name != "ewc" and base.exists() and not (run / "eval_before.jsonl").exists():
            run.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base, run / "eval_before.jsonl")
        resume = ["--resume"] if (run / "checkpoints").is_dir() else []
        cmd = [sys.executable, "-m", "cpu_grpo.cli", "train", "--profile", "default", "--output-dir", str(run),
               *args, *extra, *resume]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def final_row(run: Path) -> dict:
    return {r["id"]: r for r in read_jsonl(run / "eval_after.jsonl")}


def tables(out: Path) -> str:
    lines = ["# Curriculum ablation", ""]
    for name in RUNS:
        run = out / name
        data = json.loads((run / "forgetting.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        lines += [f"## `{name}`: {' '.join(RUNS[name]) or '(the default profile)'}", "",
                  f"{summary['steps']} steps, {summary['wall_seconds'] / 60:.0f} minutes wall.", "",
                  forgetting_table(data, run), ""]
    lines += ["## After training, run against run (paired, same problems)", ""]
    lines += ["| level | pair | A | B | B - A (95% CI) | McNemar p |", "|---|---|---|---|---|---|"]
    finals = {name: final_row(out / name) for name in RUNS}
    for a, b in (("noewc", "ewc"), ("final", "ewc"), ("final", "noewc")):
        ids = sorted(set(finals[a]) & set(finals[b]))
        for level in dict.fromkeys(finals[a][i]["difficulty"] for i in ids):
            sel = [i for i in ids if finals[a][i]["difficulty"] == level]
            x = [finals[a][i]["correct"] for i in sel]
            y = [finals[b][i]["correct"] for i in sel]
            cmp = stats.paired_comparison(x, y)
            lines.append(f"| {level} | {b} vs {a} | {100 * sum(x) / len(x):.1f}% | {100 * sum(y) / len(y):.1f}% | "
                         f"{100 * cmp['diff']:+.1f} ({100 * cmp['ci95'][0]:+.1f} to {100 * cmp['ci95'][1]:+.1f}) | "
                         f"{cmp['p_value']:.2g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tables", action="store_true", help="only build the tables from finished runs")
    args, extra = p.parse_known_args()
    if not args.tables:
        train_all(args.out, extra)
    text = tables(args.out)
    (args.out / "ABLATION.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
