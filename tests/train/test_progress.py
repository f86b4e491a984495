"""A long phase says how far it is (issue 72): a step's sampling and the Fisher's sampling and gradients log the
token or sample reached, the rate and the most time left, at most every PROGRESS_EVERY seconds (0 here: always)."""

from __future__ import annotations

import pytest
from test_curriculum import stage_cfg

from cpu_grpo.engine import progress
from cpu_grpo.train.loop import train


@pytest.mark.slow
def test_sampling_and_the_fisher_say_how_far_they_are(tiny_model, tmp_path, reward_file, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)
    lines = []
    train(stage_cfg(tiny_model, tmp_path / "run", reward_file, steps=2, stages=["basic:1", "intermediate:1"],
                    eval_size=0), log=lines.append)
    lines = [x for line in lines for x in str(line).splitlines()]
    assert any(x.startswith("  step 1: sampling: token 12 of at most 12, ") and "tokens/s a row" in x for x in lines)
    assert any(x.startswith("  step 2: sampling: token ") for x in lines)
    assert any(x.startswith("  Fisher: sampling: token ") for x in lines)
    assert any(x.startswith("  Fisher: gradients: sample 2 of at most 3, ") and "samples/s" in x for x in lines)
