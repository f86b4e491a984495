"""Step 1 of a run on GSM8K and a generated level, pinned: its rewards, advantages and completions are those of the
reference taken before tasks became general (TRL keeps whole trajectories the same way: tests/invariant/references).
The real demo model, a fixed seed; regenerate the reference only for a change that is meant to alter training.

The completions are pinned per kind of machine: bf16 kernels round differently on AMX than on AVX-512 BF16, so
sampling parts ways after a few tokens (the questions, answers, rewards and advantages of this step agree); and on
AMX they change with the thread count, so the step runs on 2 threads, not on the cores other work leaves free."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from cpu_grpo import config
from cpu_grpo.engine.models import ModelError, resolve_model

REFERENCE = Path(__file__).parent / "references" / "gsm8k_basic_step1.json"


def machine_kind() -> str:
    """The bf16 kernels torch runs here: "amx" (Intel Xeon, Sapphire Rapids on), "avx512_bf16" (AMD EPYC Zen 4 on,
    Intel Cooper Lake), else torch's CPU capability."""
    import torch

    from cpu_grpo.machine.doctor import cpu

    flags = cpu()[1]
    return "amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else \
        torch.backends.cpu.get_cpu_capability().lower()


def step_one(run_dir: Path) -> dict:
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    cfg = config.build("demo", None, dict(task="basic+gsm8k", output_dir=str(run_dir), steps=1, prompts_per_step=4,
                                          num_generations=4, max_new_tokens=48, eval_size=0, seed=3,
                                          threads=2))  # AMX's bf16 sums split by thread count
    run = train(cfg, log=lambda *a: None)
    groups = [g for g in read_jsonl(run / "groups.jsonl") if g["step"] == 1]
    return {"questions": [g["question"] for g in groups], "answers": [g["answer"] for g in groups],
            "rewards": [g["rewards"] for g in groups], "advantages": [g["advantages"] for g in groups],
            "completions_sha256": hashlib.sha256(json.dumps([g["completions"] for g in groups]).encode()).hexdigest()}


@pytest.mark.realmodel
@pytest.mark.slow
def test_step_one_of_gsm8k_and_a_level_is_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("CPU_GRPO_CACHE", str(Path.home() / ".cache" / "cpu-grpo"))
    try:
        resolve_model("smollm2-135m", log=lambda *a: None)
    except ModelError as e:
        pytest.skip(f"default model not available: {e}")
    got, want = step_one(tmp_path / "run"), json.loads(REFERENCE.read_text())
    completions, pinned = got.pop("completions_sha256"), want.pop("completions_sha256")
    assert got == want  # the same on every machine
    if machine_kind() not in pinned:
        pytest.skip(f"the step's questions, answers, rewards and advantages are as pinned; its completions are pinned "
                    f"for {', '.join(pinned)}, not for {machine_kind()}: `python tests/train/test_task_pin.py DIR` "
                    "adds them")
    assert completions == pinned[machine_kind()]


if __name__ == "__main__":  # python tests/train/test_task_pin.py OUT_DIR: the reference, this machine's completions
    import sys

    got = step_one(Path(sys.argv[1]))
    pinned = json.loads(REFERENCE.read_text())["completions_sha256"] if REFERENCE.exists() else {}
    got["completions_sha256"] = {**pinned, machine_kind(): got["completions_sha256"]}
    REFERENCE.write_text(json.dumps(got, indent=1) + "\n")
