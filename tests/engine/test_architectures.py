"""Every architecture on the fast path (engine/arch.py) against Hugging Face's own forward, on a tiny random model
built from its transformers config class with the fixture's tokenizer: greedy completions equal `generate`,
training log-probs equal the HF forward, gradients (full and LoRA) equal the generic path's, seeded sampling
replays, and a 3-step run resumes. The windowed models get prompts longer than their window."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import build_tiny_model
from transformers import AutoModelForCausalLM

from cpu_grpo.engine import arch, llama
from cpu_grpo.engine.batching import group_logprobs
from cpu_grpo.engine.sampler import Sampler, Sampling

WINDOW = 6
COMMON = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=1024, initializer_range=0.2)


def _configs() -> dict:
    """name -> (config class, its fields): each architecture, and the configurations the old fast path lacked."""
    from transformers import (
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        SmolLM3Config,
    )

    llama3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=16)
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16)
    longrope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                    short_factor=[1.0, 1.5], long_factor=[2.0, 3.0], original_max_position_embeddings=16)
    four = dict(num_hidden_layers=4)
    return {
        "qwen3": (Qwen3Config, dict(head_dim=8)),
        "qwen3_sliding": (Qwen3Config, dict(head_dim=8, use_sliding_window=True, sliding_window=WINDOW,
                                            max_window_layers=1)),
        "llama3_tied": (LlamaConfig, dict(rope_parameters=llama3, tie_word_embeddings=True)),
        "llama_yarn": (LlamaConfig, dict(rope_parameters=yarn)),
        "mistral_sliding": (MistralConfig, dict(sliding_window=WINDOW)),
        "qwen2_sliding": (Qwen2Config, dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
        "gemma3_text": (Gemma3TextConfig, dict(**four, head_dim=8, query_pre_attn_scalar=16, sliding_window=WINDOW,
                                               layer_types=["sliding_attention", "full_attention"] * 2,
                                               tie_word_embeddings=True)),
        "smollm3": (SmolLM3Config, dict(**four, no_rope_layers=[1, 1, 1, 0])),
        # Phi-4-mini's shape of rotary: partial (half the head) with longrope factors, fused qkv and gate_up
        "phi3": (Phi3Config, dict(rope_parameters=longrope, sliding_window=None)),
        "phi3_sliding": (Phi3Config, dict(sliding_window=WINDOW)),
    }


ARCHS = list(_configs())


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tok"))


def build(name: str, where: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A tiny random model of architecture `name` saved at `where`, with the fixture's tokenizer."""
    from transformers import AutoTokenizer

    cls, fields = _configs()[name]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = cls(**{**COMMON, **fields}, vocab_size=len(tok), eos_token_id=tok.eos_token_id,
              pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # Gemma's norms start at 0 (scale 1 + w): move them so that (1 + w) is tested
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.3)
    model.save_pretrained(where)
    tok.save_pretrained(where)
    return where


@pytest.fixture(scope="module", params=ARCHS)
def model_dir(request, tmp_path_factory, tokenizer_dir) -> Path:
    return build(request.param, tmp_path_factory.mktemp(request.param), tokenizer_dir)


@pytest.fixture
def model(model_dir):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


# the last prompt is longer than the window (6): its sliding layers see only part of it
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 14, 15, 16, 17]]


def hf_greedy(model, prompt, n, eos):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                         pad_token_id=eos)[0, len(prompt):].tolist()
    return out[:out.index(eos) + 1] if eos in out else out


def test_each_architecture_is_described(model):
    a = arch.arch_of(model)
    name = model.config.model_type
    assert arch.supports(model) and Sampler(model, dtype=torch.float32).fast
    assert a.qk_norm == (name in ("qwen3", "gemma3_text")) and a.sandwich == (name == "gemma3_text")
    assert a.fused == (name == "phi3") and a.norm_offset == (1.0 if name == "gemma3_text" else 0.0)
    if name == "smollm3":
        assert a.rope == ("", "", "", None)
    if name == "gemma3_text":
        assert a.rope == ("sliding_attention", "full_attention") * 2 and a.window == (WINDOW, None) * 2
    if getattr(model.config, "sliding_window", None) and name in ("mistral", "phi3"):
        assert a.window == (WINDOW,) * 2


def test_greedy_matches_generate_token_for_token(model):
    eos = model.config.eos_token_id
    out = Sampler(model, dtype=torch.float32).generate(PROMPTS, 2, Sampling(20, (eos,), model.config.pad_token_id, 0))
    for i, p in enumerate(PROMPTS):
        ref = hf_greedy(model, p, 20, eos)
        assert out[2 * i] == ref and out[2 * i + 1] == ref  # both rows of a group, left padding included


def test_seeded_sampling_replays_and_differs_across_seeds(model):
    sampler = Sampler(model, dtype=torch.float32)
    run = [sampler.generate(PROMPTS, 4, Sampling(12, (0,), 0), torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert run[0] == run[1] and run[0] != run[2]


def test_released_copy_comes_back_with_the_policy_weights(model):
    """The sampler frees its copy during the update and refills it after (fused buffers included: phi3's are its
    own modules' weights)."""
    sampler = Sampler(model, dtype=torch.float32)
    before = sampler.generate(PROMPTS, 2, Sampling(8, (0,), 0, temperature=0))
    sampler.release()
    assert all(p.numel() == 0 for p in sampler.net.parameters())
    assert sampler.generate(PROMPTS, 2, Sampling(8, (0,), 0, temperature=0)) == before


COMPLETIONS = [[1, 2, 3], [4], [5, 6, 7, 8], [9, 9], [12, 13, 14, 15, 16, 17, 18, 19], []]


def test_training_logprobs_equal_the_hf_forward(model):
    fast, mask = group_logprobs(model, PROMPTS, COMPLETIONS, [0, 1, 2], 2, 0, 1.0, autocast=False)
    for i, c in enumerate(COMPLETIONS):
        p = PROMPTS[i // 2]
        if c:
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1:-1]
            ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
            assert (fast[i, :len(c)] - ref).abs().max() < 1e-5
        assert mask[i].sum() == len(c)


def test_bf16_autocast_logprobs_close_to_fp32(model):
    lp32, mask = group_logprobs(model, PROMPTS, COMPLETIONS, [0, 1, 2], 2, 0, 1.0, autocast=False)
    lp16, _ = group_logprobs(model, PROMPTS, COMPLETIONS, [0, 1, 2], 2, 0, 1.0, autocast=True)
    assert ((lp32 - lp16) * mask).abs().max() < 0.1  # test_sampler's stated tolerance for bf16 on a random model


def _grads(model, monkeypatch, fast: bool, checkpointing: bool = False) -> dict:
    monkeypatch.setattr(llama, "supports", lambda m: fast)
    model.zero_grad()
    lp, mask = group_logprobs(model, PROMPTS, COMPLETIONS, [0, 1, 2], 2, 0, 1.0, autocast=False,
                              checkpointing=checkpointing)
    (lp * mask * torch.linspace(-1, 1, lp.numel()).view(lp.shape)).sum().backward()  # advantage-like weights
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_close_grads(a: dict, b: dict) -> None:
    """Both passes are fp32 and differ only in the order of their sums (the prompt once per group against once
    per row, fused against separate projections, sliced against full masks). A gradient entry is a sum over at
    most 44 tokens of products through <= 4 layers, ~10^3 rounded operations of relative error 6e-8 each, which
    accumulate like a random walk: ~2e-6 of the tensor's largest entry. The tolerance is 1e-5 of it (5x that)."""
    assert a.keys() == b.keys() and a
    for n in a:
        scale = max(1.0, b[n].abs().max().item())
        assert (a[n] - b[n]).abs().max().item() <= 1e-5 * scale, n


def test_full_gradients_equal_the_generic_path(model, monkeypatch):
    fast = _grads(model, monkeypatch, True)
    _assert_close_grads(fast, _grads(model, monkeypatch, False))
    _assert_close_grads(_grads(model, monkeypatch, True, checkpointing=True), fast)  # recomputed layer by layer


def test_lora_gradients_equal_the_generic_path(model, monkeypatch):
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    grads = [_grads(lora, monkeypatch, fast) for fast in (True, False)]
    assert all("lora_" in n for n in grads[0])
    _assert_close_grads(*grads)


def test_lora_sampled_unmerged_equals_generate(model):
    """LoRA applied apart from the frozen base (the sampler's LoRA route: phi3's fused modules carry one adapter
    each) gives what generate() gives on the peft model, and so does a copy with the adapters merged."""
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    sampler = Sampler(lora, dtype=torch.float32)
    assert sampler.unmerged
    eos = model.config.eos_token_id
    s = Sampling(12, (eos,), model.config.pad_token_id, 0)
    out = sampler.generate(PROMPTS, 1, s)
    assert out == [hf_greedy(lora, p, 12, eos) for p in PROMPTS]
    assert Sampler(lora, dtype=torch.float32, copy=True).generate(PROMPTS, 1, s) == out  # adapters merged in a copy


@pytest.mark.slow
def test_three_steps_then_resume(model_dir, tmp_path, reward_file):
    from cpu_grpo import config
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    out = tmp_path / "run"
    values = dict(model=str(model_dir), output_dir=str(out), steps=3, prompts_per_step=2, num_generations=4,
                  max_new_tokens=10, eval_size=0, save_every=2, rewards=[f"{reward_file}:length_reward"],
                  reward_weights=[1.0], learning_rate=1e-3, train_size=50, score_truncated=True)
    train(config.build(None, None, values), log=lambda *a: None)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    train(config.build(None, None, {**values, "steps": 4}), resume=True, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4] and all(m["loss"] == m["loss"] for m in metrics)
    shutil.rmtree(out)


def test_the_planner_counts_each_architecture(model):
    from cpu_grpo.machine.planner import Shapes

    shapes = Shapes.of(model.config)
    assert shapes.fast and shapes.params == sum(p.numel() for p in model.parameters())


def test_a_model_off_the_fast_path_says_so_and_still_works(tokenizer_dir, tmp_path):
    """OLMo 2 (norms after each sublayer, q/k norms over all heads) is not on the fast path: the load says so in
    one line with the measured slowdown, and sampling and training run through transformers, matching it."""
    from transformers import AutoTokenizer, Olmo2Config

    from cpu_grpo.engine.arch import GENERIC_SLOWDOWN
    from cpu_grpo.engine.models import load_model
    from cpu_grpo.machine.planner import Shapes

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(Olmo2Config(**COMMON, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                                 eos_token_id=tok.eos_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    said = []
    model, _ = load_model(str(tmp_path), log=said.append)
    assert len(said) == 1 and "'olmo2' is not on the fast path" in said[0]
    assert f"{GENERIC_SLOWDOWN['rollout']:.1f}x slower in rollouts" in said[0]
    assert not arch.supports(model) and not Shapes.of(model.config).fast
    _plan_says_so(str(tmp_path), Shapes.of(model.config))
    model.eval()
    sampler = Sampler(model, dtype=torch.float32)
    assert not sampler.fast
    eos = model.config.eos_token_id
    out = sampler.generate(PROMPTS, 1, Sampling(8, (eos,), model.config.pad_token_id, 0))
    assert out == [hf_greedy(model, p, 8, eos) for p in PROMPTS]
    test_training_logprobs_equal_the_hf_forward(model)


@pytest.mark.slow
def test_a_gpt2_model_is_planned_and_trained(tokenizer_dir, tmp_path):
    """GPT-2's config names its sizes n_embd, n_inner (unset: 4 x hidden) and has no grouped key-value heads: the
    planner's forecast and the micro-batch estimate read them (a run crashed in the forecast), and a step trains."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from cpu_grpo import cli

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=1024,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    run = tmp_path / "run"
    assert cli.main(["train", "--profile", "quick", "--model", str(tmp_path), "--steps", "1", "--eval-size", "2",
                     "--output-dir", str(run)]) == 0
    assert (run / "metrics.jsonl").read_text().count("\n") == 1


def _plan_says_so(where: str, shapes) -> None:
    """`cpu-grpo plan` of a model off the fast path: the generic path's measured factors, and a line saying so."""
    import dataclasses

    from cpu_grpo import config
    from cpu_grpo.engine.arch import GENERIC_SLOWDOWN
    from cpu_grpo.machine.planner import Machine, forecast, predict

    cfg, machine = config.build(None, None, dict(model=where)), Machine(bf16_gflops=500.0, bandwidth_gbs=20.0)
    slow, fast = predict(cfg, shapes, machine), predict(cfg, dataclasses.replace(shapes, fast=True), machine)
    assert slow.rollout_s == pytest.approx(fast.rollout_s * GENERIC_SLOWDOWN["rollout"])
    assert slow.update_s == pytest.approx(fast.update_s * GENERIC_SLOWDOWN["update"])
    assert "off the fast path" in forecast(cfg, shapes, machine, where)
    assert "off the fast path" not in forecast(cfg, dataclasses.replace(shapes, fast=True), machine, where)


def test_doctor_names_the_fast_path():
    from cpu_grpo.machine import doctor

    f = doctor.facts(0.1)
    assert set(f["fast_path"]) >= {"qwen3", "gemma3_text", "smollm3", "phi3"}
    assert "fast path   llama, qwen2" in doctor.render(f)


@pytest.mark.parametrize("name", ["qwen3", "gemma3_text", "smollm3", "phi3_sliding"])
def test_activation_estimate_tracks_each_architecture(name):
    """batching.activation_bytes (micro-batch sizing, the planner's peak) against what the training forward keeps,
    as tests/engine/test_batching.py checks it for llama: q/k norms, Gemma's extra norms and GELU counted."""
    from test_batching import kept_bytes

    from cpu_grpo.engine.batching import activation_bytes

    cls, fields = _configs()[name]
    fields = {**fields, "num_hidden_layers": 2, **({"head_dim": 32} if "head_dim" in fields else {})}
    fields.pop("layer_types", None), fields.pop("no_rope_layers", None)
    torch.manual_seed(0)
    cfg = cls(**{**COMMON, **fields, "hidden_size": 128, "intermediate_size": 512, "vocab_size": 512,
                 "pad_token_id": 0})
    model = AutoModelForCausalLM.from_config(cfg).train()
    p, t = 24, 48
    measured = (kept_bytes(model, p, t, 6) - kept_bytes(model, p, t, 2)) / 4  # a row's worth
    estimate = (activation_bytes(cfg, p, t, 6) - activation_bytes(cfg, p, t, 2)) / 4
    assert estimate == pytest.approx(measured, rel=0.1)  # 1-4% high here
