"""results/demo-format's table, from its cards (results/demo-format/seedS: per-problem records, summary, step log).

    python experiments/demo_format_table.py

A row a seed, on the run's 250 held-out problems before and after training (paired by id): accuracy by the last
number (the demo's judge) with its change, 95% interval and McNemar's exact p; lm-eval's strict match (`#### N`, the
number right: the format the demo asks for) before and after, with its own change and p; the run's minutes and peak.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tasks_table import change, records  # noqa: E402  (a paired change as printed; a card's records)

CARDS = ROOT / "results" / "demo-format"
HEADER = ("| seed | before | after | change (95% CI) | McNemar p | strict before | strict after | strict change "
          "(95% CI) | strict p | minutes | peak GiB | commit |\n"
          "|---|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---|")


def row(card: Path) -> str:
    before, after = records(card / "eval_before.jsonl.gz"), records(card / "eval_after.jsonl.gz")
    ids = sorted(set(before) & set(after))
    lb, la = [before[i]["correct"] for i in ids], [after[i]["correct"] for i in ids]
    sb, sa = [bool(before[i]["correct_strict"]) for i in ids], [bool(after[i]["correct_strict"]) for i in ids]
    summary = json.loads((card / "summary.json").read_text())
    peak = max(json.loads(line)["peak_rss_mb"] for line in (card / "metrics.jsonl").open()) / 1024
    pct = lambda xs: f"{100 * sum(xs) / len(xs):.1f}%"  # noqa: E731
    return (f"| {summary['seed']} | {pct(lb)} | {pct(la)} | {' | '.join(change(lb, la))} | {pct(sb)} | {pct(sa)} | "
            f"{' | '.join(change(sb, sa))} | {summary['wall_seconds'] / 60:.1f} | {peak:.1f} | "
            f"{summary['commit'][:7]} |")


def rows() -> list[str]:
    return [row(card) for card in sorted(CARDS.glob("seed*"))]


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(rows()))
