"""report_to: a short run written to TensorBoard, trackio and wandb (offline), read back with each library's own
reader; a tracker that is missing or fails never stops training."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest
from test_train import tiny_cfg

from cpu_grpo.rundir import read_jsonl
from cpu_grpo.train import trackers
from cpu_grpo.train.loop import train


def wandb_records(run_dir) -> list:
    """The protobuf records of the offline wandb run under run_dir. A .wandb file is a 7-byte header (":W&B",
    magic, version) and then LevelDB-log records in 32 KiB blocks: crc32c (4), length (2), type (1: whole,
    2/3/4: first/middle/last piece), data."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, block, records, pieces = path.read_bytes(), 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pieces += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            records.append(record)
            pieces = b""
        elif kind == 0:
            break
    return records


def wandb_history(run_dir) -> tuple[list[dict], dict]:
    """The history rows (with `_step`) and the final summary of the offline wandb run under run_dir."""
    rows, summary = [], {}
    for record in wandb_records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind == "summary":
            summary.update({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.summary.update})
    return rows, summary


@pytest.mark.slow
def test_a_run_reaches_every_tracker(tiny_model, tmp_path, reward_file, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is first imported
    for lib in ("tensorboard", "trackio", "wandb"):
        pytest.importorskip(lib)
    from trackio.utils import TRACKIO_DIR
    out, lines = tmp_path / "run", []
    train(tiny_cfg(tiny_model, out, reward_file, steps=2, eval_size=4, report_to=["tensorboard", "trackio", "wandb"],
                   log_completions_every=1), log=lines.append)
    trackers_said = [x for x in lines if "warning: report_to" in str(x) or "failed (" in str(x)]
    assert not trackers_said  # every tracker started and kept going
    steps = read_jsonl(out / "metrics.jsonl")
    rewards = [m["reward"] for m in steps]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward")] == [1, 2]
    assert [e.value for e in events.Scalars("reward")] == pytest.approx(rewards)
    tags = set(events.Tags()["scalars"])
    assert {"rewards/length_reward/mean", "frac_reward_zero_std", "completions/mean_length", "loss",
            "learning_rate", "eval/basic/after", "forgetting/base/basic"} <= tags
    assert "completions" in " ".join(events.Tags()["tensors"])  # the completions table, as text

    with sqlite3.connect(Path(TRACKIO_DIR) / "cpu-grpo.db") as db:
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (out.name,)).fetchall()
    logged: dict[int, dict] = {}
    for step, metrics in rows:  # a step's metrics and its completions table are separate rows
        logged.setdefault(step, {}).update(json.loads(metrics))
    assert [logged[s]["reward"] for s in (1, 2)] == pytest.approx(rewards)
    assert "rewards/length_reward/mean" in logged[1] and "completions" in logged[1]

    history, summary = wandb_history(out)
    by_step = {row["_step"]: row for row in history if "reward" in row}
    assert [by_step[s]["reward"] for s in (1, 2)] == pytest.approx(rewards)
    assert any(key.startswith("completions/") for row in history for key in row)  # the table, as an artifact
    assert "eval/basic/after" in summary and "forgetting/base/basic" in summary


@pytest.mark.slow
def test_a_missing_or_failing_tracker_never_stops_training(tiny_model, tmp_path, reward_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError

    def broken(self, metrics, step):
        raise OSError("No space left on device")

    monkeypatch.setattr(trackers.TensorBoard, "log", broken)
    lines = []
    pytest.importorskip("tensorboard")
    train(tiny_cfg(tiny_model, tmp_path / "run", reward_file, steps=2, eval_size=0,
                   report_to=["wandb", "tensorboard"]), log=lines.append)
    text = "\n".join(map(str, lines))
    assert text.count("report_to wandb is off for this run (ModuleNotFoundError") == 1 and "cpu-grpo[track]" in text
    assert text.count("TensorBoard failed (OSError: No space left on device)") == 1
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
