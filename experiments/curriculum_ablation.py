"""Issue 4's ablation: curriculum with EWC, curriculum without EWC, the final stage only; same seed and budget.

    python experiments/curriculum_ablation.py --out runs/ablation            # train the runs, then the tables
    python experiments/curriculum_ablation.py --out runs/ablation --tables   # tables only, from finished runs
    python experiments/curriculum_ablation.py --out runs/after-demo \
        --from runs/demo-engine-bf16-head-seed0/checkpoints/step-000030
    python experiments/curriculum_ablation.py --out runs/forgetting --forgetting --seed 0

Budget: 30 steps of 8 prompts x 8 samples, 100 held-out problems per level, seed 0 (the defaults otherwise).
- ewc:   basic:10, intermediate:10, advanced:10, EWC lambda 1
- noewc: the same, lambda 0
- final: advanced:30
With --forgetting (issue 12's target 4): the demo profile's 30 basic steps, then 20 advanced steps at 5x its
learning rate (FORGETTING_CONFIG), with EWC lambda 100 (`ewc`), 1,000 and 10,000, decoupled EWC at lambda 1e4
and 1e6 (`--ewc-decoupled`), and without (`noewc`); all but `ewc` branch from its stage-1 checkpoint. `--arms`
picks some of them.
With --from CKPT (a 30-step basic run such as the demo's), stage 1 is that checkpoint: the runs are
basic:30 (taken from CKPT), intermediate:10, with EWC lambda 1, 10, 100 and without.
The base model's evaluation is the same in all runs (same model, same problems, greedy), so it is computed
once and copied. Until the end of stage 1 the runs with and without EWC are the same computation (no
Fisher exists yet; same seed, data and samples), so `noewc` branches from `ewc`'s stage-1 checkpoint
(`--resume`), as the committed results did. Extra arguments go to every `cpu-grpo train` (e.g. `--threads 1`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from cpu_grpo import config
from cpu_grpo.config.stages import plan
from cpu_grpo.eval import stats
from cpu_grpo.eval.forgetting import forgetting_table
from cpu_grpo.rundir import read_jsonl

CURRICULUM = ["--stages", "basic:10,intermediate:10,advanced:10", "--steps", "30", "--ewc-lambda", "1"]
RUNS = {  # name -> arguments on top of --profile default
    "ewc": CURRICULUM,
    "noewc": [*CURRICULUM, "--ewc-lambda", "0"],
    "final": ["--stages", "advanced:30", "--steps", "30", "--eval-task", "basic,intermediate"],
}
FROM_CKPT = {  # with --from: stage 1 is the given 30-step basic checkpoint
    "ewc": ["--stages", "basic:30,intermediate:10", "--steps", "40", "--ewc-lambda", "1"],
    "noewc": ["--stages", "basic:30,intermediate:10", "--steps", "40", "--ewc-lambda", "0"],
    "ewc10": ["--stages", "basic:30,intermediate:10", "--steps", "40", "--ewc-lambda", "10"],  # the lambda sweep
    "ewc100": ["--stages", "basic:30,intermediate:10", "--steps", "40", "--ewc-lambda", "100"],
}

# --forgetting (issue 12, target 4): the demo (SmolLM2-135M, full fine-tuning, 30 basic steps), then a stage that
# can damage what it taught: 20 advanced steps at 5x the learning rate, their answers cut at 96 tokens
FORGETTING_CONFIG = {"stages": [{"name": "basic", "steps": 30},
                                {"name": "advanced", "steps": 20, "learning_rate": 1e-4}], "steps": 50}
FORGETTING = {"ewc": ["--ewc-lambda", "100"], "noewc": ["--ewc-lambda", "0"],
              "ewc1000": ["--ewc-lambda", "1000"], "ewc10000": ["--ewc-lambda", "10000"],
              # decoupled: a pull of min(1, lr * lambda * F) towards the anchor after each step (EWC.pull)
              "ewc-pull1e4": ["--ewc-lambda", "1e4", "--ewc-decoupled", "true"],
              "ewc-pull1e6": ["--ewc-lambda", "1e6", "--ewc-decoupled", "true"]}


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


def seed_from(ckpt: Path, run: Path) -> None:
    """Start `run` at the end of stage 1 from a finished basic-only run's checkpoint (and its step log), with
    the base model's evaluation on the run's held-out problems (else the run would evaluate the checkpoint)."""
    shutil.copytree(ckpt, run / "checkpoints" / ckpt.name)
    shutil.copyfile(ckpt.parents[1] / "metrics.jsonl", run / "metrics.jsonl")
    parts = []
    for level in ("basic", "intermediate"):  # seed 1 = a run's seed 0 + 1: the same 100 problems
        out = run / f".base-{level}.jsonl"
        subprocess.run([sys.executable, "-m", "cpu_grpo.cli", "eval", "--task", level, "--n", "100", "--seed", "1",
                        "--output", str(out)], check=True)
        parts.append(out.read_text())
    (run / "eval_before.jsonl").write_text("".join(parts))


def train_all(out: Path, extra: list[str], ckpt: Path | None = None, forgetting: bool = False,
              arms: list[str] | None = None) -> None:
    profile, runs = ("default", FROM_CKPT if ckpt else RUNS) if not forgetting else ("demo", FORGETTING)
    runs = {k: v for k, v in runs.items() if k == "ewc" or not arms or k in arms}  # ewc: stage 1 for the others
    if forgetting:
        out.mkdir(parents=True, exist_ok=True)
        (out / "forgetting.yaml").write_text(yaml.safe_dump(FORGETTING_CONFIG, sort_keys=False))
        extra = ["--config", str(out / "forgetting.yaml"), *extra]
    for name, args in runs.items():
        run = out / name
        if (run / "summary.json").exists():
            continue
        if name == "ewc" and ckpt and not run.exists():
            seed_from(ckpt, run)
        if name not in ("ewc", "final") and not run.exists():  # the same stage 1 and Fisher as `ewc`
            branch(out / "ewc", run, "basic")
        base = out / "ewc" / "eval_before.jsonl"
        if name != "ewc" and base.exists() and not (run / "eval_before.jsonl").exists():
            run.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base, run / "eval_before.jsonl")
        resume = ["--resume"] if (run / "checkpoints").is_dir() else []  # one arguments list: last value wins
        cmd = [sys.executable, "-m", "cpu_grpo.cli", "train", "--profile", profile, "--output-dir", str(run),
               *args, *extra, *resume]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def final_row(run: Path) -> dict:
    return {r["id"]: r for r in read_jsonl(run / "eval_after.jsonl")}


def tables(out: Path, names: list[str]) -> str:
    lines = ["# Curriculum ablation", ""]
    for name in names:
        run = out / name
        data = json.loads((run / "forgetting.json").read_text())
        summary = json.loads((run / "summary.json").read_text())
        cfg = config.build(None, str(run / "train_config.yaml"))
        stages = ", ".join(f"{st.task} {st.steps}" for st in plan(cfg))
        ewc = f"EWC lambda {cfg.ewc_lambda:g}" if len(cfg.stages) > 1 else "one stage (no EWC)"
        lines += [f"## `{name}`: {stages} steps; {ewc}", "",
                  f"{summary['steps']} steps, {summary['wall_seconds'] / 60:.0f} minutes wall.", "",
                  forgetting_table(data, run), ""]
    lines += ["## After training, run against run (paired, same problems)", ""]
    lines += ["| level | pair | A | B | B - A (95% CI) | McNemar p |", "|---|---|---|---|---|---|"]
    finals = {name: final_row(out / name) for name in names}
    pairs = [("noewc", "ewc"), ("final", "ewc"), ("final", "noewc"),
             *[("noewc", n) for n in names if n.startswith("ewc") and n != "ewc"]]
    for a, b in [(a, b) for a, b in pairs if {a, b} <= set(names)]:
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
    p.add_argument("--from", dest="ckpt", type=Path, default=None, help="a 30-step basic checkpoint as stage 1")
    p.add_argument("--forgetting", action="store_true", help="the demo, then a damaging stage, with and without EWC")
    p.add_argument("--arms", default="", help="only these runs, comma-separated (and `ewc`, whose stage 1 they share)")
    args, extra = p.parse_known_args()
    if not args.tables:
        train_all(args.out, extra, args.ckpt, args.forgetting, [a for a in args.arms.split(",") if a])
    names = [n for n in {**RUNS, **FROM_CKPT, **FORGETTING} if (args.out / n / "summary.json").exists()]
    text = tables(args.out, names)
    (args.out / "ABLATION.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
