"""Several runs of one recipe (seeds), side by side: every run, then the mean, min and max of each level's change.

    python experiments/seeds.py runs/demo-reward-hack-fix-seed0 runs/demo-reward-hack-fix-seed1 \
        runs/demo-reward-hack-fix-seed2 --plot results/demo-reward-hack-fix-seeds.png

Reads each run's summary.json (written by `cpu-grpo train`): one markdown row per run and level with before,
after, the paired change (bootstrap 95% CI, McNemar p), the wall time, seed and commit; then one row per level
with the changes' mean, min and max and how many runs gained significantly. `--plot` draws every run's sampled
accuracy, completion length and truncated fraction per step (metrics.jsonl) in one figure, stage boundaries dashed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cpu_grpo.eval.plots import stage_boundaries, step_records
from cpu_grpo.eval.tables import pct_cell


def rows(runs: list[Path]) -> tuple[list[str], dict[str, list[dict]]]:
    lines = ["| run | seed | commit | level | n | before (95% CI) | after (95% CI) | change (95% CI) | McNemar p "
             "| wall |", "|---|---:|---|---|---:|---|---|---|---:|---:|"]
    by_level: dict[str, list[dict]] = {}
    for run in runs:
        s = json.loads((run / "summary.json").read_text())
        for level, e in s["levels"].items():
            d = e["delta"]
            by_level.setdefault(level, []).append(d)
            lines.append(f"| {run.name} | {s.get('seed', '?')} | {s.get('commit', '?')} | {level} | "
                         f"{e['before']['n']} | {pct_cell(e['before'])} | {pct_cell(e['after'])} | "
                         f"{100 * d['diff']:+.1f} ({100 * d['ci95'][0]:+.1f} to {100 * d['ci95'][1]:+.1f}) | "
                         f"{d['p_value']:.2g} | {s['wall_seconds'] / 60:.1f} min |")
    return lines, by_level


def spread(by_level: dict[str, list[dict]]) -> list[str]:
    lines = ["| level | runs | change: mean | min | max | significant gains |", "|---|---:|---:|---:|---:|---:|"]
    for level, deltas in by_level.items():
        diffs = [100 * d["diff"] for d in deltas]
        gains = sum(d["significant"] and d["diff"] > 0 for d in deltas)
        lines.append(f"| {level} | {len(diffs)} | {sum(diffs) / len(diffs):+.1f} | {min(diffs):+.1f} | "
                     f"{max(diffs):+.1f} | {gains} of {len(diffs)} |")
    return lines


def plot(runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("accuracy", "sampled accuracy"), ("completion_len", "completion length (tokens)"),
            ("truncated_frac", "cut at the length limit")]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.6))
    for run in runs:
        metrics = step_records(run)
        for ax, (key, _) in zip(axes, keys, strict=True):
            ax.plot([m["step"] for m in metrics], [m.get(key, float("nan")) for m in metrics], label=run.name)
    bounds = stage_boundaries(step_records(runs[0]))  # the runs of one recipe share its stages
    for ax, (_, title) in zip(axes, keys, strict=True):
        for x in bounds:
            ax.axvline(x, color="gray", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--plot", type=Path, help="write the training curves of every run to this PNG")
    args = p.parse_args()
    lines, by_level = rows(args.runs)
    print("\n".join(lines + [""] + spread(by_level)))
    if args.plot:
        plot(args.runs, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
