"""What the web app shows, as plain text, markdown and HTML: pure functions of a run's data. No gradio here."""

from __future__ import annotations

import html
import math
from pathlib import Path

from . import runs

ZERO_STD = "All {g} rewards are equal, so every advantage is 0: this group adds nothing to the gradient."


def duration(seconds: float | None) -> str:
    """1:02:03 or 4:05 (h:mm:ss or m:ss); '-' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def status_line(name: str, st: dict) -> str:
    """One markdown line: state, step/total, stage k/n, ETA, tokens/s, peak RSS."""
    total = f"/{st['total_steps']}" if st.get("total_steps") else ""
    parts = [f"**{name}**: {st['state']}", f"step {st['step']}{total}"]
    if st.get("stage") is not None and (st.get("stage_index") or 0) < 0:
        parts.append(f"evaluating `{st['stage']}`")
    elif st.get("stage") is not None:
        k = (st.get("stage_index") or 0) + 1
        n = f"/{st['num_stages']}" if st.get("num_stages") else ""
        inner = f" (step {st['stage_step']}/{st['stage_steps']})" if st.get("stage_steps") else ""
        parts.append(f"stage {k}{n} `{st['stage']}`{inner}")
    if st.get("eta") is not None:
        parts.append(f"ETA {duration(st['eta'])}")
    if st.get("rollout_tok_s") is not None:
        parts.append(f"rollout {st['rollout_tok_s']:.0f} tok/s")
    if st.get("train_tok_s") is not None:
        parts.append(f"update {st['train_tok_s']:.0f} tok/s")
    if st.get("peak_rss_mb") is not None:
        parts.append(f"peak RSS {st['peak_rss_mb']:.0f} MB")
    if st.get("pid"):
        parts.append(f"pid {st['pid']}")
    return " · ".join(parts)


def progress_html(st: dict) -> str:
    """A bar for the run's steps (and one for the stage, when there are stages)."""
    bars = [("run", st.get("step") or 0, st.get("total_steps"))]
    if st.get("stage_steps"):
        bars.append((f"stage {st.get('stage') or ''}", st.get("stage_step") or 0, st["stage_steps"]))
    out = []
    for label, done, total in bars:
        frac = min(1.0, done / total) if total else 0.0
        out.append(
            f'<div style="margin:4px 0"><span style="display:inline-block;width:9em">{html.escape(label)}</span>'
            f'<span style="display:inline-block;width:60%;height:10px;background:#e5e7eb;border-radius:5px">'
            f'<span style="display:block;width:{100 * frac:.1f}%;height:10px;background:#f97316;'
            f'border-radius:5px"></span></span> {done}/{total or "?"}</div>')
    return "".join(out)


def _short(text: str, limit: int) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + f" … (+{len(text) - limit} chars)"


def _signed(x) -> str:
    if not isinstance(x, int | float) or not math.isfinite(x):
        return '<span style="color:#6b7280">-</span>'
    colour = "#15803d" if x > 0 else "#b91c1c" if x < 0 else "#6b7280"
    return f'<span style="color:{colour};font-weight:600">{x:+.3f}</span>'


def _num(x) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) and math.isfinite(x) else "-"


def group_html(group: dict, limit: int = 400) -> str:
    """One group: question, answer, each completion with its reward per function, total and advantage."""
    completions = group.get("completions") or []
    rewards = group.get("rewards") or {}
    total, adv = group.get("total") or [], group.get("advantages") or []
    zero = bool(group.get("zero_std"))
    e = html.escape
    kind = e(str(group.get("difficulty") or group.get("stage") or ""))
    head = (f'<div class="group{" zero-std" if zero else ""}" style="border:1px solid #d1d5db;border-radius:8px;'
            f'padding:8px;margin:8px 0"><b>Group {e(str(group.get("group", "?")))}</b> · {kind} · answer '
            f'<code>{e(str(group.get("answer")))}</code>'
            f'<div style="margin:4px 0">{e(_short(group.get("question", ""), 600))}</div>')
    if zero:
        head += (f'<div class="zero-note" style="background:#fef3c7;padding:4px 8px;border-radius:4px">'
                 f'{e(ZERO_STD.format(g=len(completions)))}</div>')
    cols = "".join(f"<th>{e(name)}</th>" for name in rewards)
    transcripts = group.get("transcripts") or []
    rows = []
    for i, text in enumerate(completions):
        cells = "".join(f"<td>{_num(_at(v, i))}</td>" for v in rewards.values())
        shown = transcript_html(transcripts[i], limit) if i < len(transcripts) else e(_short(text, limit))
        rows.append(f'<tr><td>{i}</td><td style="white-space:pre-wrap;font-family:monospace;font-size:12px">'
                    f"{shown}</td>{cells}<td>{_num(_at(total, i))}</td>"
                    f"<td>{_signed(_at(adv, i))}</td></tr>")
    table = (f'<table style="width:100%"><tr><th>#</th><th>completion</th>{cols}<th>total</th><th>advantage</th>'
             f"</tr>{''.join(rows)}</table>")
    return head + table + "</div>"


def transcript_html(messages: list[dict], limit: int = 400) -> str:
    """A conversation with tools, turn by turn: what the model wrote, each tool's result (a failed call in red)."""
    e, out = html.escape, []
    for m in messages:
        if m.get("role") == "tool":
            colour = "#b91c1c" if str(m.get("content", "")).startswith("{'error'") else "#1d4ed8"
            out.append(f'<div class="turn tool" style="margin:2px 0 2px 16px;color:{colour}">&#8627; '
                       f'{e(str(m.get("name", "tool")))}: {e(_short(m.get("content", ""), limit))}</div>')
        else:
            out.append(f'<div class="turn {e(str(m.get("role", "")))}">{e(_short(m.get("content", ""), limit))}</div>')
    return "".join(out)


def _at(values, i):
    return values[i] if isinstance(values, list) and i < len(values) else None


def groups_html(groups: list[dict], step: int | None) -> str:
    if not groups:
        return "<p>No groups logged for this step yet.</p>"
    zero = sum(bool(g.get("zero_std")) for g in groups)
    head = (f'<p id="groups-summary">Step {step}: {len(groups)} groups, {zero} with zero reward variance '
            f"({100 * zero / len(groups):.0f}%): those teach nothing this step.</p>")
    return head + "".join(group_html(g) for g in groups)


def _acc(cell: dict | None) -> str:
    from ..eval.tables import pct_cell

    return pct_cell(cell)


def forgetting_markdown(data: dict | None) -> str:
    """The forgetting matrix: one row per moment (base, after each stage), one column per level."""
    if not data or not data.get("levels"):
        return ""
    levels = data["levels"]
    lines = ["| after | " + " | ".join(levels) + " |", "|---" * (len(levels) + 1) + "|"]
    for row in data.get("rows", []):
        cells = row.get("cells") or {}
        lines.append(f"| {row.get('after', '?')} | " + " | ".join(_acc(cells.get(lv)) for lv in levels) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(run: Path) -> str:
    """Before/after table (with intervals), forgetting matrix and headline numbers of a run."""
    from ..eval.tables import accuracy_table as table

    run = Path(run)
    summary = runs.read_json(run / "summary.json")
    parts = [f"### {run.name}"]
    metrics = runs.read_metrics(run)
    if metrics:
        last = metrics[-1]
        parts.append(f"{len(metrics)} steps logged; last step {last['step']}: reward {_num(last.get('reward'))}, "
                     f"sampled accuracy {_num(last.get('accuracy'))}, completion length "
                     f"{_num(last.get('completion_len'))}.")
    if summary and summary.get("levels"):
        parts.append(f"Model `{summary.get('model')}`, task `{summary.get('task')}`, {summary.get('steps')} steps, "
                     f"{duration(summary.get('wall_seconds'))} wall.\n\n" + table(summary["levels"]))
    else:
        parts.append("No before/after evaluation yet (it comes when the run finishes).")
    forgetting = forgetting_markdown(runs.read_json(run / "forgetting.json"))
    if forgetting:
        parts.append("**Forgetting matrix** (accuracy on each level, 95% CI):\n\n" + forgetting)
    return "\n\n".join(parts)


def compare_markdown(run_a: Path, run_b: Path) -> str:
    """cpu_grpo.eval.compare's comparison when it exists; else a note (the page shows both summaries side by side)."""
    try:
        from ..eval.compare import compare_runs
    except ImportError:
        return "_The two runs' summaries, side by side:_"
    try:
        return compare_runs(Path(run_a), Path(run_b))
    except (ValueError, OSError) as e:  # e.g. a run with no metrics yet
        return f"Cannot compare these two runs: {e}"


def eval_table(output: str) -> str:
    """The end of `cpu-grpo eval`'s output, from the heading of its first markdown table on."""
    lines = output.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if first is None:
        return ""
    heading = next((i for i in range(first - 1, max(-1, first - 3), -1) if lines[i].strip()), None)
    if heading is not None and lines[heading].strip().endswith(":"):  # e.g. "accuracy (95% CI):"
        first = heading
    return "\n".join(lines[first:]).strip() + "\n"
