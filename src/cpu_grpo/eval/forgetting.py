"""The forgetting matrix: accuracy on every evaluated level (columns) before training and after each stage (rows),
written to forgetting.json during a run, and shown as a table with, per level, the paired change from right after
its own stage to the end."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..config import TrainConfig
from ..config.stages import plan
from ..rundir import file_safe, read_jsonl, stage_eval_path
from . import stats
from .tables import pct_cell


def matrix_row(label: str, records: list[dict]) -> dict:
    cells = {}
    for r in records:
        cells.setdefault(r["difficulty"], []).append(bool(r["correct"]))
    return {"after": label, "cells": {lvl: stats.accuracy_summary(v) for lvl, v in cells.items()}}


def write_forgetting(run: Path, cfg: TrainConfig) -> dict:
    """forgetting.json: accuracy per evaluated level (columns) before training and after each stage (rows)."""
    rows = [matrix_row("base", read_jsonl(Path(run) / "eval_before.jsonl"))]
    for i, stage in enumerate(plan(cfg)):
        records = read_jsonl(stage_eval_path(run, i, stage.name))
        if records:
            rows.append(matrix_row(stage.name, records))
    levels = list(dict.fromkeys(lvl for row in rows for lvl in row["cells"]))
    data = {"levels": levels, "rows": rows, "stages": [s.name for s in plan(cfg)], "written": time.time()}
    (Path(run) / "forgetting.json").write_text(json.dumps(data, indent=2))
    return data


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
