"""The allocator: `cpu-grpo train` restarts itself once with jemalloc where the system has it, says which one it
runs with, and explains in one sentence what to install when jemalloc is asked for and missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpu_grpo.errors import UserError
from cpu_grpo.machine import allocator


def train_in_a_process(tiny_model, out, reward_file, choice, *more):
    cmd = [sys.executable, "-m", "cpu_grpo", "demo", "--model", tiny_model, "--output-dir", str(out), "--steps", "1",
           "--prompts-per-step", "2", "--num-generations", "2", "--max-new-tokens", "6", "--eval-size", "2",
           "--eval-max-new-tokens", "4", "--train-size", "20", "--rewards", f"{reward_file}:length_reward",
           "--reward-weights", "1.0", "--score-truncated", "--allocator", choice, *more]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_train_runs_with_jemalloc_where_the_system_has_it(tiny_model, tmp_path, reward_file):
    auto = train_in_a_process(tiny_model, tmp_path / "auto", reward_file, "auto")
    assert auto.returncode == 0, auto.stderr[-2000:]
    expected = "jemalloc" if allocator.find_jemalloc() else "glibc"
    assert f"allocator {expected})" in auto.stdout
    assert auto.stdout.count("run: ") == 1  # restarted before it printed anything, once
    resumed = train_in_a_process(tiny_model, tmp_path / "auto", reward_file, "auto", "--resume", "--steps", "2")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.count("resuming with the run's config") == 1  # said after the restart, once
    glibc = train_in_a_process(tiny_model, tmp_path / "glibc", reward_file, "glibc")
    assert glibc.returncode == 0, glibc.stderr[-2000:]
    assert "allocator glibc)" in glibc.stdout


@pytest.mark.slow
def test_jemalloc_asked_for_and_missing_is_one_sentence(monkeypatch):
    monkeypatch.setattr(allocator, "loaded", lambda: "glibc")
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    monkeypatch.delenv("CPU_GRPO_ALLOCATOR_RESTARTED", raising=False)
    with pytest.raises(UserError, match="apt-get install libjemalloc2"):
        allocator.restart_with("jemalloc", ["train"])
    allocator.restart_with("auto", ["train"])  # auto: glibc, no error, no restart
    with pytest.raises(UserError, match="was not started with it"):  # a program that calls train() itself
        allocator.setup("jemalloc")
    assert allocator.setup("auto") == "glibc"
