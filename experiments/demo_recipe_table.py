"""results/demo-recipe's table, from its runs (runs/demo-recipe-*: the completions are there, not in the cards).

    python experiments/demo_recipe_table.py runs/demo-recipe-bf16-seed0 ...

A row a run: before and after on the same 250 held-out problems (paired), the change with its 95% interval and
McNemar's exact p, the run's minutes and peak memory, and what its after-training completions look like: how many
carry a `#### N` marker, how many lm-eval's strict match counts right, their mean length in characters.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from cpu_grpo.eval import stats  # noqa: E402

HEADER = ("| run | before | after | change (95% CI) | McNemar p | minutes | peak GiB | `####` | strict | chars "
          "| commit |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")


def row(run: Path) -> str:
    before = {r["id"]: r for r in map(json.loads, (run / "eval_before.jsonl").open())}
    after = {r["id"]: r for r in map(json.loads, (run / "eval_after.jsonl").open())}
    ids = sorted(set(before) & set(after))
    b, a = [before[i]["correct"] for i in ids], [after[i]["correct"] for i in ids]
    cmp = stats.paired_comparison(b, a)
    summary = json.loads((run / "summary.json").read_text())
    peak = max(json.loads(line)["peak_rss_mb"] for line in (run / "metrics.jsonl").open()) / 1024
    texts = [after[i]["completion"] for i in ids]
    change = f"{100 * cmp['diff']:+.1f} ({100 * cmp['ci95'][0]:+.1f} to {100 * cmp['ci95'][1]:+.1f})"
    change = f"**{change}**" if cmp["significant"] else change
    return (f"| {run.name.removeprefix('demo-recipe-')} | {100 * sum(b) / len(b):.1f}% | {100 * sum(a) / len(a):.1f}% "
            f"| {change} | {cmp['p_value']:.2g} | {summary['wall_seconds'] / 60:.1f} | {peak:.1f} | "
            f"{sum('####' in t for t in texts)} | {sum(bool(after[i].get('correct_strict')) for i in ids)} | "
            f"{sum(map(len, texts)) / len(texts):.0f} | {summary['commit'][:7]} |")


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(row(Path(p)) for p in sys.argv[1:]))
