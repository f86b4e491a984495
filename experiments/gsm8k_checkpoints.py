"""Greedy accuracy of several models on the real GSM8K, paired against the first one.

    python experiments/gsm8k_checkpoints.py --data ../shared/data/gsm8k/test.jsonl --out runs/gsm8k \\
        base=smollm2-135m after-basic=runs/after-demo/ewc/checkpoints/step-000030 ...

Runs `cpu-grpo eval --n 100` on each model (skipped when its output exists), then prints one markdown row per
model: accuracy as we score it, lm-evaluation-harness strict-match and flexible-extract (Wilson 95%), and the
paired change against the first model (bootstrap 95% CI, McNemar p).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cpu_grpo.eval import stats
from cpu_grpo.rundir import read_jsonl


def cell(records: list[dict], field: str) -> str:
    s = stats.accuracy_summary([bool(r[field]) for r in records])
    return f"{100 * s['accuracy']:.0f}% ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="GSM8K test.jsonl")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--n", type=int, default=100)
    p.add_argument("models", nargs="+", metavar="LABEL=MODEL")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, base = [], None
    for spec in args.models:
        label, _, model = spec.partition("=")
        out = args.out / f"{label}.jsonl"
        if not out.exists():
            subprocess.run([sys.executable, "-m", "cpu_grpo.cli", "eval", "--model", model, "--task", args.data,
                            "--n", str(args.n), "--output", str(out)], check=True)
        recs = read_jsonl(out)
        base = base or {r["id"]: r for r in recs}
        cmp = stats.paired_comparison([base[r["id"]]["correct"] for r in recs], [r["correct"] for r in recs])
        change = (f"{100 * cmp['diff']:+.0f} ({100 * cmp['ci95'][0]:+.0f} to {100 * cmp['ci95'][1]:+.0f}), "
                  f"p {cmp['p_value']:.2g}") if rows else ""
        rows.append(f"| {label} | {cell(recs, 'correct')} | {cell(recs, 'lm_eval_strict')} | "
                    f"{cell(recs, 'lm_eval_flexible')} | {change} |")
    print("| model | auto | lm-eval strict-match | lm-eval flexible-extract | change vs first (paired 95% CI, p) |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
