"""Experiment trackers behind `report_to`: TensorBoard, trackio, Weights & Biases.

Each backend is imported only when named. The loop never sees them: `Tracker` (below) calls `log`, `table` and
`finish` on every open backend, and a backend that fails (not installed, bad credentials, a full disk) is
dropped after one warning; training goes on. Metric names follow TRL's GRPOTrainer where the meaning is the
same (`TRL_NAMES`), so dashboards made for TRL runs read ours; the rest keep cpu-grpo's names.
wandb runs offline unless WANDB_MODE says otherwise (`wandb sync` uploads later); trackio writes its local
SQLite store (TRACKIO_DIR, `trackio show`); TensorBoard writes event files to <run>/tensorboard.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Protocol

from ..rundir import append_jsonl

PROJECT = "cpu-grpo"

# cpu-grpo's record key -> TRL's metric name (same meaning)
TRL_NAMES = {
    "reward": "reward", "reward_std": "reward_std", "frac_zero_std": "frac_reward_zero_std",
    "completion_len": "completions/mean_length", "truncated_frac": "completions/clipped_ratio", "kl": "kl",
    "clip_frac": "clip_ratio/region_mean", "loss": "loss", "grad_norm": "grad_norm", "lr": "learning_rate",
}


def trl_metrics(record: dict) -> dict[str, float]:
    """A step record as tracker metrics: TRL's names where they exist (`reward/<fn>` -> `rewards/<fn>/mean`),
    finite numbers only.

    >>> trl_metrics({"step": 3, "reward": 0.5, "reward/format": 1.0, "kl": float("nan"), "stage": "basic"})
    {'reward': 0.5, 'rewards/format/mean': 1.0}
    """
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        name = f"rewards/{key[7:]}/mean" if key.startswith("reward/") else TRL_NAMES.get(key, key)
        out[name] = float(value)
    return out


def summary_metrics(summary: dict, forgetting: dict | None) -> dict[str, float]:
    """The end of a run as tracker summary values: each level's accuracy before and after and the paired change,
    and each cell of the forgetting matrix.

    >>> levels = {"basic": {"before": {"accuracy": 0.2}, "after": {"accuracy": 0.4},
    ...                     "delta": {"diff": 0.2, "p_value": 0.001}}}
    >>> matrix = {"rows": [{"after": "base", "cells": {"basic": {"accuracy": 0.2}}}]}
    >>> summary_metrics({"levels": levels}, matrix)  # doctest: +NORMALIZE_WHITESPACE
    {'eval/basic/before': 0.2, 'eval/basic/after': 0.4, 'eval/basic/change': 0.2, 'eval/basic/p_value': 0.001,
     'forgetting/base/basic': 0.2}
    """
    out = {}
    for level, e in summary.get("levels", {}).items():
        for when in ("before", "after"):
            if when in e:
                out[f"eval/{level}/{when}"] = e[when]["accuracy"]
        if "delta" in e:
            out[f"eval/{level}/change"], out[f"eval/{level}/p_value"] = e["delta"]["diff"], e["delta"]["p_value"]
    for row in (forgetting or {}).get("rows", []):
        for level, cell in row["cells"].items():
            out[f"forgetting/{row['after']}/{level}"] = cell["accuracy"]
    return out


class TensorBoard:
    def __init__(self, run_dir: Path, name: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(str(c).replace("\n", " ").replace("|", "/") for c in row) + " |" for row in rows]
        self.writer.add_text(key, "\n".join(lines), step)

    def finish(self, summary: dict) -> None:
        for k, v in summary.items():
            self.writer.add_scalar(k, v, 0)
        self.writer.close()


class Trackio:
    def __init__(self, run_dir: Path, name: str, config: dict):
        import trackio

        self.trackio = trackio
        trackio.init(project=PROJECT, name=name, config=config)

    def log(self, metrics: dict, step: int) -> None:
        self.trackio.log(metrics, step=step)

    def table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        import pandas as pd

        self.trackio.log({key: self.trackio.Table(dataframe=pd.DataFrame(rows, columns=columns))}, step=step)

    def finish(self, summary: dict) -> None:
        if summary:
            self.trackio.log(summary)
        self.trackio.finish()


class Wandb:
    def __init__(self, run_dir: Path, name: str, config: dict):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=name, config=config,
                              dir=str(run_dir), mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def finish(self, summary: dict) -> None:
        self.run.summary.update(summary)
        self.run.finish()


BACKENDS = {"tensorboard": TensorBoard, "trackio": Trackio, "wandb": Wandb}


def open_backends(names: list[str], run_dir: Path, name: str, config: dict, warn) -> list:
    """The backends named in `report_to` that could start; each one that could not is one warning."""
    out = []
    for backend in names:
        try:
            out.append(BACKENDS[backend](run_dir, name, config))
        except Exception as e:  # not installed, no credentials, no disk: training goes on without it
            hint = "pip install 'cpu-grpo[track]'" if isinstance(e, ImportError) else "check its settings"
            warn(f"warning: report_to {backend} is off for this run ({type(e).__name__}: {str(e)[:120]}); {hint}")
    return out


class Hooks(Protocol):
    """What a caller of the loop hears (the Python API's TrainerCallbacks): every step's record, every checkpoint
    written, and the run's summary at its end."""

    def step_end(self, record: dict) -> None: ...

    def saved(self, checkpoint: Path) -> None: ...

    def finished(self, summary: dict) -> None: ...


class Tracker:
    """metrics.jsonl and a console line for every step, and the `report_to` backends (trackers.py), each dropped
    with one warning the first time it fails; `hooks` hear each step and the end (a hook that fails stops the run:
    it is the caller's own code)."""

    def __init__(self, run_dir: Path, print_fn=print, total_steps: int | None = None, report_to: list[str] = (),
                 config: dict | None = None, hooks: Hooks | None = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.print = print_fn
        self.total = total_steps
        self.hooks = hooks
        self.backends = []
        if report_to:
            self.backends = open_backends(list(report_to), Path(run_dir), Path(run_dir).name, config or {}, print_fn)

    def log(self, record: dict) -> None:
        append_jsonl(self.path, record)
        self.print(self.line(record))
        if self.backends:
            self._each("log", trl_metrics(record), record["step"])
        if self.hooks:
            self.hooks.step_end(record)

    def table(self, key: str, columns: list[str], rows: list[list], step: int) -> None:
        self._each("table", key, columns, rows, step)

    def finish(self, summary: dict) -> None:
        self._each("finish", summary)
        self.backends = []
        if self.hooks:
            self.hooks.finished(summary)

    def _each(self, method: str, *args) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as e:  # a tracker never stops training
                self.backends.remove(backend)
                self.print(f"warning: {type(backend).__name__} failed ({type(e).__name__}: {str(e)[:120]}); "
                           "training goes on without it")

    def line(self, r: dict) -> str:
        total = f"/{self.total}" if self.total else ""
        kl = f" kl {r['kl']:.4f}" if not math.isnan(r.get("kl", math.nan)) else ""
        batches = r.get("sample_batches", 1)  # dynamic sampling: groups sampled, groups trained
        drawn = f" | {batches} batches, trained {round((1 - r['frac_skipped']) * r['groups'])}" if batches > 1 else ""
        return (f"step {r['step']}{total} | reward {r['reward']:.3f} acc {r['accuracy']:.2f}"
                f" zero-std {r['frac_zero_std']:.2f}{kl}{drawn} | len {r['completion_len']:.0f}"
                f" | {r['step_seconds']:.1f}s (rollout {r['time_rollout']:.1f} score {r['time_scoring']:.1f}"
                f" update {r['time_update']:.1f}) {r['rollout_tok_s']:.0f} tok/s"
                f" | rss {r.get('rss_mb', math.nan):.0f} MB, peak {r['peak_rss_mb']:.0f} MB")
