"""`cpu-grpo compare A B`: two runs, or two evaluations, side by side, as markdown.

Two run directories: the config fields that differ, each run's before/after table, its final training numbers,
its forgetting matrix, and, when both runs evaluated the same problems after training, a paired test of B against
A. Two evaluation files (`cpu-grpo eval --output`, such as a base model and a trained checkpoint on GSM8K): every
metric of each level (every extractor, lm-eval's strict-match and flexible-extract among them) on the problems
both evaluated, paired.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import UserError
from ..rundir import read_jsonl
from . import metrics, stats

RUN_FILES = ("summary.json", "metrics.jsonl", "train_config.yaml")


class RunError(UserError):
    """A path that is not a run directory; the message says what to pass instead."""


def check_run(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_dir() or not any((p / f).exists() for f in RUN_FILES):
        raise RunError(f"{path} is not a run directory (no {', '.join(RUN_FILES)} in it): pass a directory "
                       "written by `cpu-grpo train`, such as runs/<run-name> (or two evaluation files).")
    return p


def _config(run: Path) -> dict:
    from ..config import load_file

    path = run / "train_config.yaml"
    return load_file(path) if path.exists() else {}


def config_diff(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(field, value in a, value in b) for every field whose values differ; a missing field is None.

    >>> config_diff({"lr": 1e-5, "steps": 30}, {"lr": 2e-5, "steps": 30, "beta": 0.0})
    [('beta', None, 0.0), ('lr', 1e-05, 2e-05)]
    """
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def final_metrics(metrics: list[dict], last: int = 5) -> dict:
    """Mean reward and sampled accuracy over the last `last` steps, mean s/step, peak RSS (MB).

    >>> final_metrics([{"reward": r, "accuracy": r / 2, "step_seconds": 10.0, "peak_rss_mb": 100.0 * r}
    ...                for r in (1.0, 2.0, 3.0)], last=2)
    {'steps': 3, 'reward (last 2)': 2.5, 'accuracy (last 2)': 1.25, 's/step': 10.0, 'peak RSS MB': 300.0}
    """
    if not metrics:
        return {}
    tail = metrics[-last:]

    def mean(key: str, recs: list[dict]) -> float:
        values = [m[key] for m in recs if isinstance(m.get(key), int | float)]
        return sum(values) / len(values) if values else math.nan

    return {"steps": len(metrics), f"reward (last {last})": mean("reward", tail),
            f"accuracy (last {last})": mean("accuracy", tail), "s/step": mean("step_seconds", metrics),
            "peak RSS MB": max((m.get("peak_rss_mb", math.nan) for m in metrics), default=math.nan)}


def _show(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return json.dumps(v) if isinstance(v, list | dict) else str(v)


def _config_section(a: Path, b: Path) -> list[str]:
    diff = config_diff(_config(a), _config(b))
    if not diff:
        return ["## Config", "", "The two configs are the same (or neither run has train_config.yaml).", ""]
    rows = [f"| {k} | {_show(va)} | {_show(vb)} |" for k, va, vb in diff]
    return ["## Config fields that differ", "", "| field | run A | run B |", "|---|---|---|", *rows, ""]


def _runs_section(a: Path, b: Path) -> list[str]:
    from .forgetting import forgetting_table
    from .tables import accuracy_table as table

    out = ["## Before and after training, each run", ""]
    for tag, run in (("A", a), ("B", b)):
        path = run / "summary.json"
        levels = json.loads(path.read_text()).get("levels") if path.exists() else None
        out += [f"Run {tag} (`{run.name}`):", "",
                table(levels).rstrip() if levels else "(no summary.json with evaluations: unfinished, or no eval set)",
                ""]
    fa, fb = final_metrics(read_jsonl(a / "metrics.jsonl")), final_metrics(read_jsonl(b / "metrics.jsonl"))
    if fa or fb:
        out += ["## End of training", "", "| | run A | run B |", "|---|---|---|"]
        out += [f"| {k} | {_show(fa.get(k, '-'))} | {_show(fb.get(k, '-'))} |" for k in (fa or fb)] + [""]
    for tag, run in (("A", a), ("B", b)):
        if (run / "forgetting.json").exists():
            out += [f"## Forgetting matrix, run {tag}", "",
                    forgetting_table(json.loads((run / "forgetting.json").read_text()), run), ""]
    return out


def _evaluation(run: Path, name: str) -> list[dict]:
    """A run's evaluation records: NAME.jsonl in a run directory, NAME.jsonl.gz in a results/ card."""
    return read_jsonl(run / f"{name}.jsonl") or read_jsonl(run / f"{name}.jsonl.gz")


def _paired_section(a: Path, b: Path) -> list[str]:
    from .tables import accuracy_table as table
    from .tables import compare

    ra, rb = _evaluation(a, "eval_after"), _evaluation(b, "eval_after")
    head = ["## Run B against run A after training (paired, same problems)", ""]
    if not ra or not rb:
        return head + ["(not both runs have eval_after.jsonl)", ""]
    if {r["id"] for r in ra} != {r["id"] for r in rb}:
        return head + ["(the two runs evaluated different problems, so no paired comparison)", ""]
    levels = compare(ra, rb)
    text = table(levels).replace("before (95% CI) | after (95% CI) | change", "run A (95% CI) | run B (95% CI) | B - A")
    sentences = [stats.significance_sentence(e["delta"], f"{lv}, B vs A") for lv, e in levels.items() if "delta" in e]
    if len(levels) > 1:
        by_id = {r["id"]: r["correct"] for r in rb}
        cmp = stats.paired_comparison([r["correct"] for r in ra], [by_id[r["id"]] for r in ra])
        sentences.append(stats.significance_sentence(cmp, "all levels, B vs A"))
    return head + [text, *sentences, ""]


def compare_evals(file_a: str | Path, file_b: str | Path, include_trained: bool = False) -> str:
    """Markdown comparing two evaluations of the same problems (records matched by id): B against A. Rows a run on
    their task trains on (records marked "split": "train") are left out, with a warning, unless `include_trained`:
    a checkpoint scores those from memory, and counting them calls memory a gain."""
    from .tables import metric_summary, metric_table, type_table

    a, b = read_jsonl(file_a), read_jsonl(file_b)
    if not a or not b or any("id" not in r or "correct" not in r for r in a + b):
        raise RunError(f"{file_a} or {file_b} is not an evaluation: pass two files written by "
                       "`cpu-grpo eval --output FILE.jsonl` (or a run's eval_before.jsonl and eval_after.jsonl).")
    shared = {r["id"] for r in a} & {r["id"] for r in b}
    if not shared:
        raise RunError(f"{file_a} and {file_b} share no problem: evaluate both with the same --task, --n and --seed.")
    trained = {r["id"] for r in a + b if r.get("split") == "train"} & shared
    warning = []
    if trained and not include_trained:
        if not shared - trained:
            raise RunError("every problem both evaluations share is a training row of its task (a run on it trains "
                           "on them): evaluate the held-out rows (`cpu-grpo eval --split held-out`), or pass "
                           "--include-trained to compare them as training rows.")
        warning = [f"**Warning: {len(trained)} of the {len(shared)} problems both evaluated are training rows of "
                   "their task** (a run on it trains on them, and a checkpoint of that run answers them from "
                   f"memory): left out. The comparison is on the {len(shared - trained)} held-out rows; "
                   "`--include-trained` keeps them.", ""]
        shared -= trained
    a, b = (metrics.with_work([r for r in x if r["id"] in shared]) for x in (a, b))
    summary = metric_summary(a, b)
    sentences = [stats.significance_sentence(e["correct"]["delta"], f"{level}, B vs A")
                 for level, e in summary.items() if "delta" in e.get("correct", {})]
    kept = "held-out and training rows" if trained and include_trained else "paired"
    lines = [f"# Evaluation A `{Path(file_a).name}` against evaluation B `{Path(file_b).name}`", "",
             f"- A: `{file_a}`", f"- B: `{file_b}`",
             f"- {len(shared)} problems evaluated by both ({kept}; 'before' is A, 'after' is B)", "", *warning,
             metric_table(summary), *sentences, ""]
    types = type_table(a, b).replace("right before | right after", "right in A | right in B")
    return "\n".join(lines + (["## By problem type", "", types] if types else []))


def compare_runs(run_a: str | Path, run_b: str | Path, include_trained: bool = False) -> str:
    """Markdown comparing two run directories, or two evaluation files; RunError if they are neither."""
    if Path(run_a).is_file() and Path(run_b).is_file():
        return compare_evals(run_a, run_b, include_trained)
    a, b = check_run(run_a), check_run(run_b)
    lines = [f"# Run A `{a.name}` against run B `{b.name}`", "", f"- A: `{a}`", f"- B: `{b}`", ""]
    lines += _config_section(a, b) + _runs_section(a, b) + _paired_section(a, b)
    return "\n".join(lines)
