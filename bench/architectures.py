"""The fast path (engine/llama.py, engine/arch.py) against the generic transformers path, per architecture.

    .venv/bin/python bench/architectures.py                                # every architecture, 2 layers
    .venv/bin/python bench/architectures.py --arch qwen3 gemma3_text --layers 4 --prompts 4 --samples 8 --new 64

A random model of each architecture at its real width (hidden size, heads, head size, MLP, vocabulary, rotary and
window settings of the model named in the table) with fewer layers, in bf16 for sampling and fp32 weights under
bf16 autocast for training, as a run has them. Per path:
- rollout: prompts x samples completions of exactly `--new` tokens (random weights rarely stop), tokens/s;
- update: the training pass of those completions (group_logprobs, forward and backward, full fine-tuning), seconds;
- a step: rollout + update seconds. Best of `--reps` after a warm-up.
The generic path is what a model off the fast path gets: `model.generate` on the bf16 copy and the HF forward on
left-padded prompt + completion rows. Run on an idle machine; ratios within one run are what to compare.
"""

from __future__ import annotations

import argparse
import time

import torch

from cpu_grpo.engine import llama
from cpu_grpo.engine.batching import group_logprobs
from cpu_grpo.engine.sampler import Sampler, Sampling
from cpu_grpo.engine.threads import set_threads


def configs(layers: int) -> dict:
    """name -> (the model it takes its width from, config) with `layers` layers."""
    from transformers import Gemma3TextConfig, LlamaConfig, Phi3Config, Qwen3Config, SmolLM3Config

    n = dict(num_hidden_layers=layers)
    llama3 = dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=8192)
    rotary = 96 // 2  # Phi-4-mini: head 128, partial_rotary_factor 0.75 -> 96 rotated dimensions, 48 factors
    longrope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75, short_factor=[1.0] * rotary,
                    long_factor=[1.5] * rotary, original_max_position_embeddings=4096)
    return {
        "qwen3": ("Qwen3-0.6B", Qwen3Config(**n, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                            num_key_value_heads=8, head_dim=128, vocab_size=151936,
                                            tie_word_embeddings=True, max_position_embeddings=40960)),
        "llama": ("Llama-3.2-1B", LlamaConfig(**n, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                                              num_key_value_heads=8, head_dim=64, vocab_size=128256,
                                              tie_word_embeddings=True, rope_parameters=llama3,
                                              max_position_embeddings=131072)),
        "gemma3_text": ("Gemma-3-270M", Gemma3TextConfig(
            **n, hidden_size=640, intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
            vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * (layers // 6) +
            ["sliding_attention"] * (layers % 6 - 1) + ["full_attention"] * (layers % 6 > 0),
            max_position_embeddings=32768)),
        "smollm3": ("SmolLM3-3B", SmolLM3Config(**n, hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
                                                num_key_value_heads=4, vocab_size=128256, tie_word_embeddings=True,
                                                no_rope_layers=[int((i + 1) % 4 != 0) for i in range(layers)])),
        "phi3": ("Phi-4-mini", Phi3Config(**n, hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                                          num_key_value_heads=8, vocab_size=200064, tie_word_embeddings=True,
                                          rope_parameters=longrope, max_position_embeddings=131072,
                                          sliding_window=None, pad_token_id=0)),
    }


def measure(model, fast: bool, prompts: list[list[int]], g: int, new: int, reps: int) -> tuple[float, float]:
    """(rollout tokens/s, update seconds), best of `reps` after one warm-up."""
    sampler = Sampler(model, fast=fast)
    s = Sampling(new, (model.config.vocab_size - 1,), 0, temperature=1.0)  # a stop token random weights rarely draw
    supports = llama.supports
    llama.supports = (lambda m: supports(m)) if fast else (lambda m: False)
    try:
        roll, upd = [], []
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            comps = sampler.generate(prompts, g, s, torch.Generator().manual_seed(rep))
            t1 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            lp, mask = group_logprobs(model, prompts, comps, list(range(len(prompts))), g, 0, 1.0, autocast=True)
            (lp * mask).sum().backward()
            t2 = time.perf_counter()
            if rep:
                roll.append(sum(len(c) for c in comps) / (t1 - t0))
                upd.append(t2 - t1)
        return max(roll), min(upd)
    finally:
        llama.supports = supports


def main() -> None:
    from transformers import AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="*", default=None, help="architectures to run (default: all)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new", type=int, default=32, help="new tokens a completion")
    ap.add_argument("--prompt-len", type=int, default=80)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: one per physical core); on a "
                    "machine others are using, 1 (every parallel op otherwise waits for a descheduled thread)")
    args = ap.parse_args()
    threads = set_threads(args.threads)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} UTC, {threads} threads, {args.layers} layers, {args.prompts} prompts x "
          f"{args.samples} samples x {args.new} tokens, prompts of {args.prompt_len} tokens, best of {args.reps}")
    print("| architecture (width of) | params | fast rollout tok/s | generic tok/s | x | fast update s | generic s | x "
          "| fast step s | generic step s | x |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, (like, cfg) in configs(args.layers).items():
        if args.arch and name not in args.arch:
            continue
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).float()
        assert llama.supports(model), name
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(10, cfg.vocab_size, (args.prompt_len - 7 * i,), generator=gen).tolist()
                   for i in range(args.prompts)]
        fr, fu = measure(model, True, prompts, args.samples, args.new, args.reps)
        gr, gu = measure(model, False, prompts, args.samples, args.new, args.reps)
        tokens = args.prompts * args.samples * args.new
        fs, gs = tokens / fr + fu, tokens / gr + gu
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"| {name} ({like}, {args.layers} layers) | {params:.0f}M | {fr:.0f} | {gr:.0f} | {fr / gr:.2f} | "
              f"{fu:.2f} | {gu:.2f} | {gu / fu:.2f} | {fs:.2f} | {gs:.2f} | {gs / fs:.2f} |", flush=True)
        del model


if __name__ == "__main__":
    main()
