"""PNG plots of a run's training curves from its metrics.jsonl (matplotlib, Agg backend, imported lazily).

One figure per quantity: the reward (total and each reward function's `reward/<fn>`), the sampled
accuracy, the fraction of zero-variance groups, the completion length and, when logged, the EWC
penalty. A dashed vertical line marks each stage boundary when records carry `stage_index`.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..rundir import read_jsonl

# file stem -> (title, y label, keys to draw; a trailing "/" means every key with that prefix)
PLOTS = {
    "reward": ("Reward (mean over the batch)", "reward", ["reward", "reward/"]),
    "accuracy": ("Sampled accuracy during training", "fraction correct", ["accuracy"]),
    "frac_zero_std": ("Groups whose rewards are all equal (no signal)", "fraction of groups", ["frac_zero_std"]),
    "completion_len": ("Completion length", "tokens", ["completion_len"]),
    "ewc_penalty": ("EWC penalty", "penalty", ["ewc_penalty"]),
    "grad_norm": ("Gradient norm before clipping: policy + EWC, and EWC's part", "norm",
                  ["grad_norm", "ewc_grad_norm"]),
}


class PlotError(RuntimeError):
    """Plots cannot be drawn here (matplotlib missing); the message says what to do."""


def stage_boundaries(metrics: list[dict]) -> list[float]:
    """The x positions (half-way between two steps) where `stage_index` changes.

    >>> stage_boundaries([{"step": 1, "stage_index": 0}, {"step": 2, "stage_index": 0}, {"step": 3, "stage_index": 1}])
    [2.5]
    """
    out, last = [], None  # (step, stage_index) of the latest record that has one
    for m in metrics:
        if "stage_index" not in m:
            continue
        if last is not None and m["stage_index"] != last[1]:
            out.append((last[0] + m["step"]) / 2)
        last = (m["step"], m["stage_index"])
    return out


def series(metrics: list[dict], keys: list[str]) -> dict[str, tuple[list[int], list[float]]]:
    """{key: (steps, values)} for each key (prefix keys expanded), skipping missing and non-finite values.

    >>> series([{"step": 1, "reward": 0.5, "reward/format": 0.2}, {"step": 2, "reward": float("nan")}], ["reward/"])
    {'reward/format': ([1], [0.2])}
    """
    names: list[str] = []
    for key in keys:
        found = sorted({k for m in metrics for k in m if k.startswith(key)}) if key.endswith("/") else [key]
        names += [n for n in found if n not in names]
    out = {}
    for name in names:
        pts = [(m["step"], float(m[name])) for m in metrics
               if isinstance(m.get(name), int | float) and not isinstance(m[name], bool) and math.isfinite(m[name])]
        if pts:
            out[name] = ([s for s, _ in pts], [v for _, v in pts])
    return out


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotError("matplotlib is not installed: run `pip install matplotlib` to get the plots") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def step_records(run: Path) -> list[dict]:
    """The run's metrics.jsonl, one record a step in step order: a resumed run may log a step twice, the later one
    counts."""
    by_step = {m["step"]: m for m in read_jsonl(Path(run) / "metrics.jsonl") if isinstance(m.get("step"), int)}
    return [by_step[s] for s in sorted(by_step)]


def write_plots(run: Path) -> list[Path]:
    """Draw the run's curves under `<run>/plots/`; returns the PNG paths (none without metrics.jsonl)."""
    metrics = step_records(run)
    if not metrics:
        return []
    plt = _pyplot()
    out_dir = Path(run) / "plots"
    out_dir.mkdir(exist_ok=True)
    bounds = stage_boundaries(metrics)
    paths = []
    for stem, (title, ylabel, keys) in PLOTS.items():
        lines = series(metrics, keys)
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
        for name, (steps, values) in lines.items():
            ax.plot(steps, values, label=name, linewidth=1.8 if "/" not in name else 1.0)
        for x in bounds:
            ax.axvline(x, color="gray", linestyle="--", linewidth=0.8)
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
