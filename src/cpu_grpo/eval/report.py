"""report.md for a run: the before/after tables with intervals, the forgetting matrix, training curves
(text and PNG plots), and sample completions that changed."""

from __future__ import annotations

import json
from pathlib import Path

from . import stats
from .evaltables import (
    accuracy_levels,
    accuracy_table,
    metric_sentences,
    metric_summary,
    metric_table,
    pct_cell,
    type_table,
)
from .metrics import with_work
from .tracking import code_version, file_safe, read_jsonl


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


def _stage_records(run: Path, after: str) -> list[dict]:
    """The per-problem records behind a forgetting-matrix row: eval_before.jsonl or evals/after-K-<stage>.jsonl."""
    if after == "base":
        return read_jsonl(run / "eval_before.jsonl")
    files = sorted(run.glob(f"evals/after-*-{file_safe(after)}.jsonl"))
    return read_jsonl(files[-1]) if files else []


def _paired_forgetting(run: Path, level: str, first: str, last: str) -> str | None:
    by_id = {r["id"]: r["correct"] for r in _stage_records(run, last) if r["difficulty"] == level}
    pairs = [(r["correct"], by_id[r["id"]]) for r in _stage_records(run, first)
             if r["difficulty"] == level and r["id"] in by_id]
    if not pairs:
        return None
    cmp = stats.paired_comparison([b for b, _ in pairs], [a for _, a in pairs])
    return stats.significance_sentence(cmp, f"{level}, from after `{first}` to after `{last}`")


def forgetting_lines(data: dict, run: Path | None = None) -> list[str]:
    """Per level whose own stage has a row (a row whose "after" is the level's name) and a later row: the
    change from that row to the last one (negative: forgotten). Paired, with an interval and McNemar's
    test, when `run` holds the per-problem records of both rows; else the plain difference."""
    rows, out = data.get("rows", []), []
    for level in data.get("levels", []):
        own = next((i for i, r in enumerate(rows) if r["after"] == level), None)
        if own is None or own == len(rows) - 1:
            continue
        first, last = rows[own]["cells"].get(level), rows[-1]["cells"].get(level)
        paired = _paired_forgetting(run, level, rows[own]["after"], rows[-1]["after"]) if run else None
        if paired:
            out.append(f"- {paired}")
        elif first and last:
            change = 100 * (last["accuracy"] - first["accuracy"])
            out.append(f"- {level}: {100 * first['accuracy']:.1f}% right after its own stage, "
                       f"{100 * last['accuracy']:.1f}% after `{rows[-1]['after']}`: {change + 0.0:+.1f} points "
                       "(unpaired: no per-problem records)")
    return out


def forgetting_table(data: dict, run: Path | None = None) -> str:
    """Markdown: the forgetting matrix (rows: after which stage; columns: the level evaluated), each cell the
    accuracy with its 95% Wilson interval, then per level the change from its own stage to the end.

    `data` is forgetting.json: {"levels": [...], "rows": [{"after": "base" | stage, "cells": {level:
    {"accuracy", "ci95", "n"}}}]}; `run`, the run directory, makes that change a paired test.

    >>> print(forgetting_table({"levels": ["basic"], "rows": [
    ...     {"after": "base", "cells": {"basic": {"accuracy": 0.2, "ci95": [0.1, 0.3], "n": 50}}},
    ...     {"after": "basic", "cells": {"basic": {"accuracy": 0.5, "ci95": [0.4, 0.6], "n": 50}}}]}))
    | after stage \\ evaluated level | basic |
    |---|---|
    | base | 20.0% (10.0-30.0, n=50) |
    | basic | 50.0% (40.0-60.0, n=50) |
    <BLANKLINE>
    """
    levels = data.get("levels", [])
    head = "| after stage \\ evaluated level | " + " | ".join(levels) + " |\n|---|" + "---|" * len(levels) + "\n"
    rows = [f"| {r['after']} | " + " | ".join(pct_cell(r["cells"].get(lv), n=True) for lv in levels) + " |"
            for r in data.get("rows", [])]
    lines = forgetting_lines(data, run)
    tail = ("\nChange on each level from right after its own stage to the end of training (forgetting when "
            "negative):\n\n" + "\n".join(lines) + "\n") if lines else ""
    return head + "\n".join(rows) + "\n" + tail


def _metrics_section(summary: dict) -> list[str]:

    if not summary.get("metrics"):
        return []
    return ["## Every metric, per level", "",
            "Accuracy under each answer extractor (lm-eval: scored as lm-evaluation-harness scores gsm8k), "
            "and the written work: a *step* is a computation `a op b = c` on one line (or a `<<a*b=c>>` "
            "annotation); reasoning quality = at least two steps; consistency = the final answer equals the "
            "result of the last step (problems without a step left out); calculations right = steps whose "
            "result is the value of the expression.", "",
            metric_table(summary["metrics"]), *[f"- {x}" for x in metric_sentences(summary["metrics"])], ""]


def _plots_section(run: Path) -> list[str]:
    from .plots import PlotError, write_plots

    try:
        paths = write_plots(run)
    except PlotError as e:
        return [f"(No plots: {e}.)", ""]
    return [f"![{p.stem}](plots/{p.name})" for p in paths] + [""]


def _training_section(run: Path, metrics: list[dict]) -> list[str]:
    if not metrics:
        return []
    seconds = sum(m["step_seconds"] for m in metrics)
    return ["## Training", "",
            f"- reward (mean of the batch): {_curve(metrics, 'reward')}",
            f"- sampled accuracy: {_curve(metrics, 'accuracy')}",
            f"- zero-variance groups: {_curve(metrics, 'frac_zero_std')}",
            f"- completion length: {_curve(metrics, 'completion_len')}",
            f"- {seconds / len(metrics):.1f} s per step on average, peak RSS "
            f"{max(m['peak_rss_mb'] for m in metrics):.0f} MB", "", *_plots_section(run)]


def _stages(summary: dict) -> str:
    stages = summary.get("stages") or [summary["task"]]
    ewc = f" with EWC (lambda {summary['ewc_lambda']:g})" if summary.get("ewc_lambda") and len(stages) > 1 else ""
    return (f"task `{summary['task']}`" if len(stages) == 1 else "stages " + ", then ".join(f"`{s}`" for s in stages)
            + ewc)


def write_report(run: Path, cfg, summary: dict) -> Path:

    metrics = read_jsonl(run / "metrics.jsonl")
    lines = [f"# GRPO run `{run.name}`", "",
             f"Model `{summary['model']}`, {_stages(summary)}, {summary['steps']} steps, "
             f"{summary['wall_seconds'] / 60:.1f} minutes wall (evaluations included).", ""]
    if summary["levels"]:
        lines += ["## Held-out accuracy, before and after (greedy)", "", accuracy_table(summary["levels"])]
        lines += [e["delta"]["sentence"] for e in summary["levels"].values() if "delta" in e]
        lines += ["", "Intervals: Wilson for accuracies; Newcombe's paired interval for the change; significant: "
                  "McNemar's exact test on the discordant pairs, p < 0.05.", ""]
        types = type_table(read_jsonl(run / "eval_before.jsonl"), read_jsonl(run / "eval_after.jsonl"))
        if types:
            lines += ["### By problem type", "", "Where a level's errors are (the generator's question templates, "
                      "named by their first words):", "", types]
    if (run / "forgetting.json").exists():
        lines += ["## Forgetting matrix (greedy accuracy)", "",
                  forgetting_table(json.loads((run / "forgetting.json").read_text()), run), ""]
    lines += _metrics_section(summary)
    lines += _training_section(run, metrics)
    lines += ["## Problems that changed", "", _samples(run), ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path


def write_summary(run: Path, cfg, steps: int, wall: float, log=print, profile: str = "", commit: str = "") -> dict:
    """summary.json and report.md for a run; prints the before/after table and the report's path. `commit`: the
    code the run started with (code_version() then; now, when not given)."""
    from .config import plan

    before, after = (with_work(read_jsonl(run / name)) for name in ("eval_before.jsonl", "eval_after.jsonl"))
    metrics = metric_summary(before, after or None) if before else {}
    levels = accuracy_levels(metrics)
    stages = [f"{st.name} ({st.task}, {st.steps} steps)" if st.name != st.task else f"{st.name} ({st.steps} steps)"
              for st in plan(cfg)]
    summary = {"model": cfg.model, "task": cfg.task, "stages": stages, "ewc_lambda": cfg.ewc_lambda,
               "profile": profile, "seed": cfg.seed, "commit": commit or code_version(), "steps": steps,
               "wall_seconds": round(wall, 1), "levels": levels, "metrics": metrics}
    (run / "summary.json").write_text(json.dumps(summary, indent=2))
    report = write_report(run, cfg, summary)
    if levels:
        log("\n" + accuracy_table(levels))
        for e in levels.values():
            if "delta" in e:
                log(e["delta"]["sentence"])
    log(f"report: {report}")
    return summary
