"""report.md for a run: the before/after tables with intervals, the forgetting matrix, training curves
(text and PNG plots), and sample completions that changed."""

from __future__ import annotations

import json
from pathlib import Path

from ..rundir import code_version, read_jsonl
from .forgetting import forgetting_table
from .metrics import with_work
from .stats import against_constant
from .tables import (
    accuracy_levels,
    accuracy_table,
    metric_sentences,
    metric_summary,
    metric_table,
    type_table,
)


def _curve(metrics: list[dict], key: str, points: int = 8) -> str:
    if not metrics:
        return "-"
    idx = sorted({round(i * (len(metrics) - 1) / max(1, points - 1)) for i in range(points)})
    return ", ".join(f"{metrics[i]['step']}: {metrics[i].get(key, float('nan')):.3f}" for i in idx)


def _samples(run: Path, k: int = 3) -> str:
    before = {r["id"]: r for r in read_jsonl(run / "eval_before.jsonl")}
    after = read_jsonl(run / "eval_after.jsonl")
    changed = [(before[r["id"]], r) for r in after if r["id"] in before and r["correct"] != before[r["id"]]["correct"]]
    shown = [(b, r) for b, r in changed if "completion" in b and "completion" in r][:k]
    if changed and not shown:  # a base evaluation reused from a results card, whose records keep no text
        return f"(problems changed: {len(changed)}; their records keep no completions to show)"
    out = []
    for b, r in shown:
        answer = f" (answer {r['answer']})" if str(r.get("answer") or "").strip() else ""
        out.append(f"**{r['question']}**{answer}\n\n"
                   f"- before ({'right' if b['correct'] else 'wrong'}): {b['completion'].strip()[:600]!r}\n"
                   f"- after ({'right' if r['correct'] else 'wrong'}): {r['completion'].strip()[:600]!r}\n")
    return "\n".join(out) or "(no problem changed between before and after)"


def _metrics_section(summary: dict) -> list[str]:

    if not summary.get("metrics"):
        return []
    if all("judge" in entries.get("correct", {}) for entries in summary["metrics"].values()):  # by a reward
        return ["## Accuracy, per level", "", "Right is what the run's judging reward says (its correct_reward, else "
                "its first reward, scoring 1): no answer is extracted, and the math metrics do not apply.", "",
                metric_table(summary["metrics"]), *[f"- {x}" for x in metric_sentences(summary["metrics"])], ""]
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


def _tools_section(run: Path) -> list[str]:
    """With tools: each held-out evaluation's calls a problem, failed calls, and answers given without a call."""
    rows = []
    for name in ("eval_before", "eval_after"):
        records = [r for r in read_jsonl(run / f"{name}.jsonl") if "tool_calls" in r]
        if records:
            n, calls = len(records), sum(r["tool_calls"] for r in records)
            without = [r for r in records if not r["tool_calls"]]
            rows.append(f"| {name.removeprefix('eval_')} | {n} | {calls / n:.2f} | "
                        f"{sum(r['tool_failures'] for r in records)} of {calls} | {len(without)} "
                        f"({sum(r['correct'] for r in without)} right) |")
    if not rows:
        return []
    return ["## Tools (held-out problems)", "", "| model | problems | calls a problem | failed calls | answered "
            "without a call |", "|---|---:|---:|---:|---|", *rows, ""]


def write_report(run: Path, cfg, summary: dict) -> Path:

    metrics = read_jsonl(run / "metrics.jsonl")
    lines = [f"# GRPO run `{run.name}`", "",
             f"Model `{summary['model']}`, {_stages(summary)}, {summary['steps']} steps, "
             f"{summary['wall_seconds'] / 60:.1f} minutes wall (evaluations included).", ""]
    if summary["levels"]:
        lines += ["## Held-out accuracy, before and after (greedy)", "", accuracy_table(summary["levels"])]
        lines += [e["delta"]["sentence"] for e in summary["levels"].values() if "delta" in e]
        lines += [e["constant"]["sentence"] for e in summary["levels"].values() if "constant" in e]
        lines += ["", "Intervals: Wilson for accuracies; Newcombe's paired interval for the change; significant: "
                  "McNemar's exact test on the discordant pairs, p < 0.05.", ""]
        types = type_table(read_jsonl(run / "eval_before.jsonl"), read_jsonl(run / "eval_after.jsonl"))
        if types:
            lines += ["### By problem type", "", "Where a level's errors are (the generator's question templates, "
                      "named by their first words):", "", types]
    lines += _tools_section(run)
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
    from ..config.stages import plan

    before, after = (with_work(read_jsonl(run / name)) for name in ("eval_before.jsonl", "eval_after.jsonl"))
    metrics = metric_summary(before, after or None) if before else {}
    levels = accuracy_levels(metrics)
    for level, entry in levels.items():  # a change that one answer given to every problem matches is no learning
        mine = [r for r in after if r.get("difficulty") == level]
        if "delta" in entry and mine and (check := against_constant([r.get("answer", "") for r in mine],
                                                                     [bool(r["correct"]) for r in mine], level)):
            entry["constant"] = check
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
            if "constant" in e:
                log(e["constant"]["sentence"])
    log(f"report: {report}")
    return summary
