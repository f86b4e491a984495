"""The card of a reasoning-gym survey (experiments/rg_survey.sh): each task's evaluation compacted to one gzipped
line a problem (id, answer, pred, correct, finished), the raw files (with completions) moved out of the tree, and a
README table of base accuracy by task with its family and 95% interval.

    python experiments/rg_survey_card.py results/rg-survey RAW_DIR
"""

import gzip
import json
import re
import shutil
import sys
from pathlib import Path

from cpu_grpo.eval.stats import wilson_interval

FIELDS = ("id", "difficulty", "answer", "pred", "correct", "finished", "judge", "max_new_tokens")


def family(task: str) -> str:
    from reasoning_gym.factory import DATASETS

    return DATASETS[task][0].__module__.split(".")[1]


def main(card: Path, raw: Path) -> None:
    raw.mkdir(parents=True, exist_ok=True)
    for path in sorted(card.glob("*.jsonl")):
        records = [json.loads(line) for line in path.open()]
        with gzip.open(card / f"{path.stem}.jsonl.gz", "wt") as f:
            f.writelines(json.dumps({k: r[k] for k in FIELDS if k in r}) + "\n" for r in records)
        shutil.move(path, raw / path.name)
    rows = []
    for path in sorted(card.glob("*.jsonl.gz")):
        records = [json.loads(line) for line in gzip.open(path, "rt")]
        name = re.fullmatch(r"(?P<model>.+?)-(?P<task>[a-z0-9_]+)(?:--(?P<config>.+))?",
                            path.name.removesuffix(".jsonl.gz"))
        model, task = name["model"], name["task"] + (f":{name['config']}" if name["config"] else "")
        right, n = sum(r["correct"] for r in records), len(records)
        lo, hi = wilson_interval(right, n)
        finished = sum(r["finished"] for r in records) / n
        rows.append((family(name["task"]), task, model, n, right / n, lo, hi, finished))
    lines = ["| family | task | model | n | base accuracy (95% CI) | finished | 5-60% |",
             "|---|---|---|---:|---|---:|---|"]
    for fam, task, model, n, acc, lo, hi, fin in sorted(rows):
        lines.append(f"| {fam} | `rg:{task}` | {model} | {n} | {acc:.1%} ({lo:.1%}-{hi:.1%}) | {fin:.0%} | "
                     f"{'yes' if 0.05 <= acc <= 0.60 else 'no'} |")
    table = "\n".join(lines)
    readme = card / "README.md"
    text = readme.read_text() if readme.exists() else ""
    start, end = "<!-- survey table -->", "<!-- end of survey table -->"
    if start in text:
        text = text[:text.index(start)] + f"{start}\n{table}\n{end}" + text[text.index(end) + len(end):]
    else:
        text += f"\n{start}\n{table}\n{end}\n"
    readme.write_text(text)
    print(table)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
