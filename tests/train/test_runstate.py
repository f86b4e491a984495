"""A run's progress: what a checkpoint saves of it, and what one saved before Progress existed gives back."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from cpu_grpo.train.runstate import Progress


def test_progress_comes_back_as_it_was_saved(tmp_path):
    p = Progress(step=7, stage_index=1, stage_step=3, data_pos=12, type_counts={"t": [8, 2]}, validation=0.5,
                 stage_ended=True, bad_steps=1, all_equal_steps=2, micro_cap=4)
    assert Progress.restored({"step": 7, "tag": "", "progress": asdict(p)}, tmp_path) == p


def test_a_checkpoint_saved_before_progress_resumes_from_its_own_keys(tmp_path):
    old = {"step": 5, "tag": "", "data_pos": 6, "stage_index": 1, "stage_step": 2, "all_equal_steps": 3,
           "type_counts": {"t": [4, 1]}}
    assert Progress.restored(old, tmp_path) == Progress(5, 1, 2, 6, {"t": [4, 1]}, all_equal_steps=3)
    assert Progress.restored({"step": 4, "data_pos": 8}, tmp_path) == Progress(4, 0, 4, 8)  # before stages
    # a stage's end checkpoint (tagged): ended, with the validation accuracy its stages.jsonl record holds
    (tmp_path / "stages.jsonl").write_text(json.dumps({"stage": "basic", "stage_index": 0, "end_step": 2,
                                                       "promoted": True, "validation_accuracy": 0.75}) + "\n")
    end = {"step": 2, "tag": "basic", "data_pos": 4, "stage_index": 0, "stage_step": 2}
    assert Progress.restored(end, tmp_path) == Progress(2, 0, 2, 4, validation=0.75, stage_ended=True)
    assert Progress.restored({**end, "tag": ""}, tmp_path) == Progress(2, 0, 2, 4)  # saved later in the same step


@pytest.mark.parametrize("bf16_pays", [True, False])
def test_bf16_auto_trains_in_the_faster_dtype(tiny_model, tmp_path, monkeypatch, bf16_pays):
    """bf16: auto keeps bf16 where its matmuls are fast; where this CPU runs them slower than fp32, the LoRA base,
    the sampler and training are fp32, and the log says why and how to force bf16."""
    from cpu_grpo.config import build
    from cpu_grpo.engine import models
    from cpu_grpo.machine import doctor
    from cpu_grpo.train import runstate

    monkeypatch.setattr(models, "bf16_supported", lambda: True)
    monkeypatch.setattr(runstate, "bf16_supported", lambda: True)
    monkeypatch.setattr(doctor, "bf16_pays", lambda: bf16_pays)
    cfg = build(overrides={"model": tiny_model, "use_lora": True, "bf16": "auto", "output_dir": str(tmp_path)})
    said = []
    run, _, _ = runstate.build_run(cfg, tmp_path, None, lambda *a: said.append(" ".join(map(str, a))))
    dtype = torch.bfloat16 if bf16_pays else torch.float32
    assert run.autocast is bf16_pays and run.sampler.dtype == dtype
    assert {p.dtype for n, p in run.model.named_parameters() if "lora_" not in n} == {dtype}
    assert any("slower than fp32" in s and "--bf16 true" in s for s in said) is not bf16_pays
    forced = build(overrides={"model": tiny_model, "use_lora": True, "output_dir": str(tmp_path)})  # true: default
    assert runstate.build_run(forced, tmp_path / "forced", None, lambda *a: None)[0].autocast


def test_lora_rollout_merged_samples_from_a_copy_that_follows_the_adapters(tiny_model, tmp_path):
    """`lora_rollout: merged` gives the run a sampler with the adapters merged into a copy, refreshed as they train;
    the default samples the policy's own base with them unmerged."""
    from cpu_grpo.config import build
    from cpu_grpo.train import runstate

    def run_of(**fields):
        cfg = build(overrides={"model": tiny_model, "use_lora": True, "output_dir": str(tmp_path), **fields})
        return runstate.build_run(cfg, tmp_path, None, lambda *a: None)[0]

    assert run_of().sampler.unmerged
    run = run_of(lora_rollout="merged")
    assert not run.sampler.unmerged and run.sampler.net is not run.model.get_base_model()
    name = next(n for n, _ in run.model.named_parameters() if "lora_B" in n)
    with torch.no_grad():
        run.model.get_parameter(name).add_(0.5)
    run.sampler.refresh()
    layer = run.model.get_submodule(name.rsplit(".lora_B", 1)[0])
    plain = name.removeprefix("base_model.model.").split(".lora_B")[0].replace(".base_layer", "") + ".weight"
    want = (layer.base_layer.weight + layer.get_delta_weight("default")).to(run.sampler.dtype)
    assert torch.equal(run.sampler.net.get_parameter(plain), want)
