"""A seeded run's first steps, pinned: the numbers of `cpu-grpo train` do not move unless a change means them to.
Taken at da2c11e (before the Python API and the GRPO options went in) and equal at the commit that added this
test, in fp32 (bf16 too, by hand); a change that moves them changes every run's numerics and must say so."""

from __future__ import annotations

import pytest
from test_train import tiny_cfg

from cpu_grpo.rundir import read_jsonl
from cpu_grpo.train.loop import train

STEPS = [{"reward": 1.4250000715255737, "loss": -1.0679165285409908e-07, "grad_norm": 3.3580451011657715,
          "completion_len": 12.0, "reward_std": 0.2686738669872284},
         {"reward": 1.1750000715255737, "loss": -0.05808473750948906, "grad_norm": 4.3132500648498535,
          "completion_len": 11.5, "reward_std": 0.25163257122039795}]
ADVANTAGES = [[-1.161, 0.387, 1.161, -0.387], [-0.4898, 1.4693, -0.7347, -0.2449],
              [0.2672, 1.0688, 0.0, -1.3359], [1.161, -0.387, 0.387, -1.161]]


@pytest.mark.slow
def test_a_seeded_run_gives_the_pinned_steps(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=2, bf16="false", save_every=0), log=lambda *a: None)
    for got, pinned in zip(read_jsonl(out / "metrics.jsonl"), STEPS, strict=True):
        for key, value in pinned.items():
            assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert [g["advantages"] for g in read_jsonl(out / "groups.jsonl")] == ADVANTAGES
