"""Micro-batch sizing: the activation estimate against what the training forward really keeps."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cpu_grpo.engine.batching import activation_bytes, auto_micro_rows, group_logprobs


def kept_bytes(model, prompt_len: int, completion_len: int, rows: int, autocast: bool = True) -> int:
    """Net bytes allocated by one training forward: what it leaves alive for the backward (and its output)."""
    prompts = [list(range(10, 10 + prompt_len))]
    comps = [list(range(20, 20 + completion_len)) for _ in range(rows)]
    with torch.profiler.profile(profile_memory=True) as prof:
        lp, _ = group_logprobs(model, prompts, comps, [0], rows, 0, 1.0, autocast=autocast)
    del lp
    return sum(e.self_cpu_memory_usage for e in prof.key_averages())


@pytest.mark.parametrize("autocast", [True, False])  # bf16 autocast, or training in fp32 (bf16: auto on some CPUs)
@pytest.mark.parametrize("intermediate", [256, 1024])  # MLP 2x and 8x the hidden size (SmolLM2 2.7x, Qwen2.5 5.4x)
def test_activation_estimate_tracks_what_the_forward_keeps(intermediate, autocast):
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=512, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).train()
    p, t = 24, 48
    measured = (kept_bytes(model, p, t, 6, autocast) - kept_bytes(model, p, t, 2, autocast)) / 4  # a row's worth
    width = 2 if autocast else 4
    estimate = (activation_bytes(cfg, p, t, 6, width=width) - activation_bytes(cfg, p, t, 2, width=width)) / 4
    assert estimate == pytest.approx(measured, rel=0.1)  # it reads 3-6% high here


def test_auto_micro_rows_takes_whole_groups_while_they_fit_then_parts():
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152)
    model = type("M", (), {"config": cfg})()
    one_group = activation_bytes(cfg, 80, 128, 8)
    assert auto_micro_rows(model, 80, 128, 8, budget=one_group * 1.01) == 8
    assert auto_micro_rows(model, 80, 128, 8, budget=one_group * 3) in (16, 24)
    part = auto_micro_rows(model, 80, 128, 8, budget=one_group * 0.6)
    assert 1 <= part < 8 and activation_bytes(cfg, 80, 128, part) <= one_group * 0.6
    assert auto_micro_rows(model, 80, 128, 8, budget=1) == 1
