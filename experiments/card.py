"""Make a run's card: the small files that recompute its claims.

    python experiments/card.py RUN_DIR results/NAME [--raw-at "commit 289024d" --raw-prefix docs/runs/NAME]

Kept: README.md (plan and result), summary.json, configs, metrics.jsonl, stages.jsonl, forgetting.json,
report.md, compare*.md and other small text, figures outside plots/, the --plots of a plots/ folder
(accuracy and reward). Each evaluation file (records with id, correct and completion) becomes NAME.jsonl.gz:
one line a problem with only the fields below (read it with zcat or gzip.open); no completion is kept.
Everything else (groups.jsonl, console logs, other plots, large files) is left out, and the card's README
lists each with its sha256 so it can be fetched where the run keeps it. RUN_DIR may be the card itself.
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

EVAL_FIELDS = ("id", "difficulty", "template", "answer", "pred", "correct", "finished", "correct_strict",
               "strict_correct", "correct_flexible", "correct_math_verify", "lm_eval_strict", "lm_eval_flexible",
               "calc_steps", "calc_correct_frac", "reasoning_quality", "consistent", "max_new_tokens")
DROPPED = ("groups.jsonl",)
SMALL = 32_000  # bytes: a larger text file that is not an evaluation is left out


def is_eval(path: Path) -> bool:
    """An evaluation file: JSON lines whose first record has an id and a correctness flag (with its completion, or
    compact: a card's base evaluation copied into a run that reuses it)."""
    if path.suffix != ".jsonl":
        return False
    with path.open() as f:
        try:
            first = json.loads(f.readline() or "{}")
        except json.JSONDecodeError:
            return False
    return {"id", "correct"} <= first.keys()


def keep(rel: Path, path: Path, plots: list[str]) -> bool:
    if rel.name in DROPPED or rel.name.startswith("console"):  # console.log, console.out, ...: raw output
        return False
    if rel.parts[0] == "checkpoints":  # weights and their tokenizer files: listed with their sha256, not kept
        return False
    if rel.parent.name == "plots":
        return rel.name in plots
    if rel.suffix == ".png" or rel.name in ("metrics.jsonl", "stages.jsonl", "summary.json", "report.md"):
        return True
    return path.stat().st_size <= SMALL


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_compact(records: list[dict], out: Path) -> None:
    lines = "".join(json.dumps({k: r[k] for k in EVAL_FIELDS if k in r}, separators=(",", ":")) + "\n"
                    for r in records)
    with open(out, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:  # mtime 0: the same bytes
        z.write(lines.encode())


def make_card(run: Path, card: Path, raw_at: str, raw_prefix: str, plots: list[str]) -> list[tuple[str, str]]:
    """Write the card; return (path, sha256) of every file left out."""
    card.mkdir(parents=True, exist_ok=True)
    removed, last_eval = [], None
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        rel = path.relative_to(run)
        out = card / rel
        if rel.name == "samples.jsonl":  # completions kept by cards made before 2026-12-05
            continue
        if is_eval(path):
            records = [json.loads(line) for line in path.open() if line.strip()]
            removed.append((str(rel), sha256(path)))  # the full file, completions included
            if rel.parts[0] == "evals" and last_eval and last_eval[0].name == "eval_after.jsonl" \
                    and records == last_eval[1]:  # a one-stage run's stage evaluation: eval_after's records again
                if out.resolve() == path.resolve():
                    path.unlink()
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            write_compact(records, out.with_name(out.name + ".gz"))
            if out.resolve() == path.resolve():
                path.unlink()
            if rel.name == "eval_after.jsonl" or last_eval is None or last_eval[0].name != "eval_after.jsonl":
                last_eval = (rel, records)
        elif keep(rel, path, plots):
            if out.resolve() != path.resolve():
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out)
        else:
            removed.append((str(rel), sha256(path)))
            if out.resolve() == path.resolve():
                path.unlink()
    for d in sorted((p for p in card.rglob("*") if p.is_dir()), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    write_readme(card, removed, raw_at, raw_prefix)
    return removed


def write_readme(card: Path, removed: list[tuple[str, str]], raw_at: str, raw_prefix: str) -> None:
    readme = card / "README.md"
    log = Path(os.path.relpath(Path("results/LOG.md").resolve(), card.resolve())).as_posix()
    text = readme.read_text() if readme.exists() else (
        f"# {card.name}\n\nThe run's numbers: `report.md` and `summary.json`; what it was for: "
        f"[results/LOG.md]({log}).\n")
    text, _, old = text.partition("\n## Raw files\n")
    text = text.rstrip() + "\n"
    listed = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", old, flags=re.M)  # a card made again keeps its list
    removed = listed + [(f"{raw_prefix}/{p}", h) for p, h in removed if f"{raw_prefix}/{p}" not in dict(listed)]
    if removed:
        where = f"{raw_at}: path and sha256 below" + (f" (`git show {raw_at.split()[-1]}:PATH`)"
                                                      if raw_at.startswith("commit") else "")
        rows = "".join(f"| `{p}` | `{h}` |\n" for p, h in removed)
        text += (f"\n## Raw files\n\nRaw files (completions, groups, console log, all plots) at {where}.\n"
                 "Each evaluation file here is `NAME.jsonl.gz`, one compact line a problem.\n\n"
                 f"| path | sha256 |\n|---|---|\n{rows}")
    readme.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the run directory (what `cpu-grpo train --output-dir` wrote)")
    ap.add_argument("card", type=Path, help="the card to write, e.g. results/NAME (may be the run directory)")
    ap.add_argument("--raw-at", default=None, help='where the raw files stay, e.g. "commit 289024d"')
    ap.add_argument("--raw-prefix", default=None, help="the run directory's path there")
    ap.add_argument("--plots", default="accuracy.png,reward.png", help="the plots/ files to keep, comma-separated")
    args = ap.parse_args()
    removed = make_card(args.run, args.card, args.raw_at or f"`{args.run}`", args.raw_prefix or str(args.run),
                        args.plots.split(","))
    print(f"{args.card}: {len(removed)} raw files listed in README.md")


if __name__ == "__main__":
    main()
