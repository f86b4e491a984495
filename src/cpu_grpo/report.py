"""report.md for a run: the before/after table with intervals, the training curve, samples."""

from __future__ import annotations

from pathlib import Path

from .tracking import read_jsonl


def _curve(metrics: list[dict], key: str, points: int = 8) -> str:
    if not metrics:
        return "-"
    idx = sorted({round(i * (len(metrics) - 1) / max(1, points - 1)) for i in range(points)})
    return ", ".join(f"{metrics[i]['step']}: {metrics[i].get(key, float('nan')):.3f}" for i in idx)


def _samples(run: Path, k: int = 3) -> str:
    before = {r["id"]: r for r in read_jsonl(run / "eval_before.jsonl")}
    after = read_jsonl(run / "eval_after.jsonl")
    changed = [r for r in after if r["id"] in before and r["correct"] != before[r["id"]]["correct"]][:k]
    out = []
    for r in changed:
        b = before[r["id"]]
        out.append(f"**{r['question']}** (answer {r['answer']})\n\n"
                   f"- before ({'right' if b['correct'] else 'wrong'}): {b['completion'].strip()[:600]!r}\n"
                   f"- after ({'right' if r['correct'] else 'wrong'}): {r['completion'].strip()[:600]!r}\n")
    return "\n".join(out) or "(no problem changed between before and after)"


def write_report(run: Path, cfg, summary: dict) -> Path:
    from .evaluate import table

    metrics = read_jsonl(run / "metrics.jsonl")
    lines = [f"# GRPO run `{run.name}`", "",
             f"Model `{summary['model']}`, task `{summary['task']}`, {summary['steps']} steps, "
             f"{summary['wall_seconds'] / 60:.1f} minutes wall (evaluations included).", ""]
    if summary["levels"]:
        lines += ["## Held-out accuracy, before and after (greedy)", "", table(summary["levels"])]
        lines += [e["delta"]["sentence"] for e in summary["levels"].values() if "delta" in e]
        lines += ["", "Intervals: Wilson for accuracies; paired bootstrap (10,000 resamples) for the change; "
                  "McNemar's exact test on the discordant pairs.", ""]
    if metrics:
        seconds = sum(m["step_seconds"] for m in metrics)
        lines += ["## Training", "",
                  f"- reward (mean of the batch): {_curve(metrics, 'reward')}",
                  f"- sampled accuracy: {_curve(metrics, 'accuracy')}",
                  f"- zero-variance groups: {_curve(metrics, 'frac_zero_std')}",
                  f"- completion length: {_curve(metrics, 'completion_len')}",
                  f"- {seconds / len(metrics):.1f} s per step on average, peak RSS "
                  f"{max(m['peak_rss_mb'] for m in metrics):.0f} MB", ""]
    lines += ["## Problems that changed", "", _samples(run), ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path
