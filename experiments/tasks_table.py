"""results/TASKS.md's table, from the task suite's cards (results/task-suite/NAME-seedS/): one row a run.

    python experiments/tasks_table.py          # prints the rows; paste them between TASKS.md's table markers

For each run: the model, the before and after accuracy on the same held-out problems (paired by id), the change
with its 95% interval and McNemar's exact p, the run's minutes (summary.json's wall time) and peak memory (the
largest peak RSS its step log recorded), and what one answer given to every problem would score (the held-out set's
most common answer, where one covers a fifth or more of it: stats.against_constant, as in each run's report; "-"
otherwise), the bar an "after" must clear before it says anything about the task. tests/test_results.py recomputes
the table and compares it with TASKS.md.
"""

import gzip
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from cpu_grpo.eval import stats  # noqa: E402

SUITE = ROOT / "results" / "task-suite"
HEADER = ("| task | seed | model | n | base | after | one answer | change (95% CI) | McNemar p | minutes | peak GiB |\n"
          "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|")


def records(path: Path) -> dict[str, dict]:
    with gzip.open(path, "rt") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def change(before: list[bool], after: list[bool]) -> tuple[str, str]:
    """The paired change from `before` to `after` (the same problems in the same order) with its 95% interval, bold
    where McNemar's exact p < 0.05, and p."""
    cmp = stats.paired_comparison(before, after)
    lo, hi = cmp["ci95"]
    text = f"{100 * cmp['diff']:+.1f} ({100 * lo:+.1f} to {100 * hi:+.1f})"
    return (f"**{text}**" if cmp["significant"] else text), f"{cmp['p_value']:.2g}"


def row(card: Path) -> str:
    """One table line for one run's card."""
    name, seed = re.fullmatch(r"(.+)-seed(\d+)", card.name).groups()
    summary = json.loads((card / "summary.json").read_text())
    before, after = records(card / "eval_before.jsonl.gz"), records(card / "eval_after.jsonl.gz")
    ids = sorted(set(before) & set(after))
    b, a = [bool(before[i]["correct"]) for i in ids], [bool(after[i]["correct"]) for i in ids]
    changed, p = change(b, a)
    steps = [json.loads(line) for line in (card / "metrics.jsonl").read_text().splitlines() if line.strip()]
    peak = max(s.get("peak_rss_mb", 0) for s in steps) / 1024
    # the report's check; cards written before 2026-12-04 say "None" where reasoning-gym gives no one answer
    constant = stats.against_constant([None if after[i].get("answer") == "None" else after[i].get("answer")
                                       for i in ids], a)
    one = f"{100 * constant['accuracy']:.1f}%" if constant else "-"
    return (f"| {name} | {seed} | {summary['model']} | {len(ids)} | {100 * sum(b) / len(b):.1f}% | "
            f"{100 * sum(a) / len(a):.1f}% | {one} | {changed} | {p} | "
            f"{summary['wall_seconds'] / 60:.0f} | {peak:.1f} |")


def rows() -> list[str]:
    """Every card's line, by task then seed."""
    cards = [c for c in SUITE.glob("*-seed*") if (c / "summary.json").exists()]
    return [row(c) for c in sorted(cards, key=lambda c: (c.name.rsplit("-seed", 1)[0], int(c.name.rsplit("seed")[-1])))]


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(rows()))
