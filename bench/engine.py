"""The engine alone: rollout tokens/s and training tokens/s over a grid, against this machine's matmul peak.

    .venv/bin/python bench/engine.py                       # SmolLM2-135M, default grid
    .venv/bin/python bench/engine.py --grid 4x8x128 8x8x96  # prompts x samples x new tokens

The bf16 matmul peak is measured in the same run (large square matmuls), and the training pass is reported
as a fraction of it: 6 * parameters * tokens FLOPs for forward + backward (prompt tokens counted once per
group, since the engine runs them once). Run on an idle machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cpu_grpo import tasks
from cpu_grpo.batching import group_logprobs
from cpu_grpo.config import TrainConfig
from cpu_grpo.doctor import matmul_gflops
from cpu_grpo.models import keep_freed_memory, load_model, set_threads
from cpu_grpo.rollout import Sampler, Sampling, encode_prompts, stop_ids


def decode_linear_bound(model, rows: int, reps: int = 5) -> float:
    """Tokens/s of a decode step that did nothing but its weight matmuls with `rows` rows alive: every linear of
    the model in bf16, q/k/v and gate/up fused as the sampler runs them, plus the lm_head; best of `reps`.
    Attention, norms, sampling and finished rows (which the real step has) are left out, so this is an upper bound."""
    c = model.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    h, q, kv = c.hidden_size, c.num_attention_heads * d, c.num_key_value_heads * d
    shapes = [(q + 2 * kv, h), (h, q), (2 * c.intermediate_size, h), (h, c.intermediate_size)] * c.num_hidden_layers
    weights = [torch.randn(s, dtype=torch.bfloat16) for s in shapes + [(c.vocab_size, h)]]
    inputs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in {w.shape[1] for w in weights}}

    def step():
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    step()
    return rows / min(_timed(step) for _ in range(reps))


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_cell(model, tok, sampler, b: int, g: int, new: int, reps: int) -> dict:
    cfg = TrainConfig()
    problems = tasks.generate("basic", b * (reps + 1), seed=7)
    stops, pad = stop_ids(tok, model), tok.pad_token_id
    n_params = sum(p.numel() for p in model.parameters())
    roll, train = [], []
    for r in range(reps + 1):  # the first repetition warms up
        prompts = encode_prompts(tok, [p.question for p in problems[r * b:(r + 1) * b]], cfg.instruction)
        gen = torch.Generator().manual_seed(r)
        t = time.perf_counter()
        comps = sampler.generate(prompts, g, Sampling(new, stops, pad), gen)
        t_roll = time.perf_counter() - t
        n_comp = sum(len(c) for c in comps)
        t = time.perf_counter()
        for i in range(b):  # one group per micro-batch, as train.py does by default
            lp, mask = group_logprobs(model, prompts, comps, [i], g, pad, 1.0, autocast=True)
            (lp * mask).sum().backward()
        t_train = time.perf_counter() - t
        model.zero_grad(set_to_none=True)
        seq_tokens = sum(len(p) * g for p in prompts) + n_comp
        engine_tokens = sum(len(p) for p in prompts) + n_comp
        if r:
            roll.append(n_comp / t_roll)
            train.append((seq_tokens / t_train, 6 * n_params * engine_tokens / t_train / 1e9))
    return {"cell": f"{b}x{g}x{new}", "rollout_tok_s": statistics.median(roll),
            "decode_bound_tok_s": decode_linear_bound(model, b * g),
            "train_tok_s": statistics.median(t for t, _ in train),
            "train_gflops": statistics.median(f for _, f in train)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--grid", nargs="+", default=["4x8x128", "8x8x96", "2x16x128"])
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    threads = set_threads()
    keep_freed_memory()
    peak16, peak32 = matmul_gflops(torch.bfloat16, 2.0, n=2048), matmul_gflops(torch.float32, 2.0, n=2048)
    model, tok = load_model(args.model, log=lambda *a: None)
    model.train()
    sampler = Sampler(model)
    rows = [bench_cell(model, tok, sampler, *map(int, cell.split("x")), args.reps) for cell in args.grid]
    print(f"threads {threads}; matmul peak: bf16 {peak16:.0f} GFLOP/s, fp32 {peak32:.0f} GFLOP/s\n")
    print("| prompts x samples x new tokens | rollout tok/s | decode bound tok/s | of bound | training tok/s | "
          "training GFLOP/s | of bf16 peak |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cell']} | {r['rollout_tok_s']:.0f} | {r['decode_bound_tok_s']:.0f} | "
              f"{100 * r['rollout_tok_s'] / r['decode_bound_tok_s']:.0f}% | {r['train_tok_s']:.0f} | "
              f"{r['train_gflops']:.0f} | {100 * r['train_gflops'] / peak16:.0f}% |")
    print("\ndecode bound: every row alive, nothing but the bf16 weight matmuls of one decode step (an upper bound)")


if __name__ == "__main__":
    main()
