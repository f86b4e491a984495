"""A real full disk: the run directory on a small tmpfs, filled by another file (needs root, to mount it).

Wherever the disk fills (the lock file, a log line; checkpoints: test_train.py), the run stops with one sentence
naming the disk and the way on, no traceback, and after space is freed the same command with --resume finishes,
each step logged once.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from cpu_grpo.cli import main
from cpu_grpo.rundir import read_jsonl


@pytest.fixture
def disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (run the suite as root, as CI does)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_kb: int) -> Path:
    """A file that takes all of the disk but `leave_kb` KB."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError as e:
            assert e.errno == errno.ENOSPC
    filler.write_bytes(b"\0" * max(0, filler.stat().st_size - leave_kb * 1024))
    return filler


def said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("cpu-grpo:")]


def args(model: str, out: Path, reward: Path, *more: str) -> list[str]:
    return ["train", "--profile", "demo", "--model", model, "--output-dir", str(out), "--steps", "8",
            "--save-every", "0", "--eval-size", "0", "--prompts-per-step", "2", "--num-generations", "4",
            "--max-new-tokens", "12",
            "--rewards", f"{reward}:length_reward", "--reward-weights", "1", "--score-truncated", *more]


@pytest.mark.slow
def test_a_full_disk_at_the_lock_and_at_a_log_line_is_one_sentence(disk, tiny_model, reward_file, capsys):
    out = disk / "run"
    filler = fill(disk, 0)
    assert main(args(tiny_model, out, reward_file)) == 2
    err = capsys.readouterr().err
    assert f"the disk holding {out} is full" in err and "run the same command again" in err, err
    assert "Traceback" not in err and len(said(err)) == 1

    filler.unlink()
    filler = fill(disk, 24)  # the config and the first steps' logs fit, not 8 steps of them
    assert main(args(tiny_model, out, reward_file)) == 2
    err = capsys.readouterr().err
    assert "is full" in err and "continue with --resume" in err, err
    assert any(f"while writing {name}" in err for name in ("metrics.jsonl", "groups.jsonl", "status.json")), err
    assert "Traceback" not in err and len(said(err)) == 1
    logged = read_jsonl(out / "metrics.jsonl")
    assert 0 < len(logged) < 8

    filler.unlink()
    assert main(args(tiny_model, out, reward_file, "--resume")) == 0
    steps = [m["step"] for m in read_jsonl(out / "metrics.jsonl")]
    assert steps == list(range(1, 9)), (steps, (out / "metrics.jsonl").read_text()[-2000:])
