"""The engine alone: rollout tokens/s and training tokens/s over a grid, against this machine's matmul peak.

    .venv/bin/python bench/engine.py                       # SmolLM2-135M, default grid
    .venv/bin/python bench/engine.py --grid 4x8x128 8x8x96  # prompts x samples x new tokens
    .venv/bin/python bench/engine.py --workload default    # the default profile's job (below)

The bf16 matmul peak and the memory bandwidth are measured in the same run (planner.Machine), and each phase is
reported as a fraction of its limit (issue 13), the time it would take at the machine's limits:
- rollout: the prefill's matmul FLOPs (2 x matmul weights x prompt tokens) at the bf16 peak, then for each decode
  step the larger of its matmul FLOPs (2 x matmul weights x the rows still alive) at the peak and the bf16 weights
  it must read (2 bytes x matmul weights) at the bandwidth;
- update: 6 x matmul weights x tokens FLOPs for forward + backward (prompt tokens counted once per group, since
  the engine runs them once) at the peak;
- step: both limits over both times. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import yaml

from cpu_grpo import config
from cpu_grpo.config import TrainConfig
from cpu_grpo.data import tasks
from cpu_grpo.engine.batching import group_logprobs
from cpu_grpo.engine.models import load_model
from cpu_grpo.engine.prompts import encode_prompts
from cpu_grpo.engine.sampler import Sampler, Sampling, stop_ids
from cpu_grpo.engine.threads import set_threads
from cpu_grpo.machine.allocator import keep_freed_memory
from cpu_grpo.machine.doctor import matmul_gflops
from cpu_grpo.machine.planner import Machine, Shapes


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


def _anon_huge_mb() -> float:
    """Anonymous memory of this process backed by transparent huge pages (Linux), in MB."""
    try:
        text = Path("/proc/self/smaps_rollup").read_text()
    except OSError:
        return float("nan")
    return next((int(line.split()[1]) / 1024 for line in text.splitlines() if line.startswith("AnonHugePages:")),
                float("nan"))


def _reset_peak() -> float:
    """Start this process's peak RSS (VmHWM) again from its RSS now (Linux: clear_refs 5); returns that RSS in MB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mb("VmRSS")


def _status_mb(key: str) -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def limits(shapes: Shapes, machine: Machine, prompts: list[list[int]], comps: list[list[int]],
           lora: bool = False) -> tuple:
    """Seconds of the rollout and of the update at the machine's limits (the module docstring says how)."""
    peak, bw, mp = machine.bf16_gflops * 1e9, machine.bandwidth_gbs * 1e9, shapes.matmul_params
    prompt_tokens = sum(len(p) for p in prompts)
    decode = sum(max(2 * mp * sum(len(c) > s for c in comps) / peak, 2 * mp / bw)
                 for s in range(max(len(c) for c in comps)))
    rollout = 2 * mp * prompt_tokens / peak + decode
    update = (4 if lora else 6) * mp * (prompt_tokens + sum(len(c) for c in comps)) / peak
    return rollout, update


def bench_cell(model, tok, sampler, machine: Machine, b: int, g: int, new: int, reps: int) -> dict:
    cfg = TrainConfig()
    problems = tasks.generate("basic", b * (reps + 1), seed=7)
    stops, pad = stop_ids(tok, model), tok.pad_token_id
    shapes = Shapes.of(model.config)
    roll, train, frac = [], [], []
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
            lim_roll, lim_train = limits(shapes, machine, prompts, comps)
            roll.append(n_comp / t_roll)
            train.append((seq_tokens / t_train, 6 * shapes.matmul_params * engine_tokens / t_train / 1e9))
            frac.append((lim_roll / t_roll, lim_train / t_train, (lim_roll + lim_train) / (t_roll + t_train)))
    return {"cell": f"{b}x{g}x{new}", "rollout_tok_s": statistics.median(roll),
            "decode_bound_tok_s": decode_linear_bound(model, b * g),
            "train_tok_s": statistics.median(t for t, _ in train),
            "train_gflops": statistics.median(f for _, f in train),
            **{k: statistics.median(f[i] for f in frac) for i, k in enumerate(("rollout_of_limit",
                                                                               "update_of_limit", "step_of_limit"))}}


def bench_default(machine: Machine, cells: list[str], reps: int, setup: str = "") -> list[dict]:
    """The default profile's job, cell by cell (prompts x samples x new tokens): rollout and update as a run does
    them, the first repetition a warm-up. `setup`: config fields changed (`k=v,k=v`), e.g. `lora_rollout=merged`
    to sample from a bf16 copy with the adapters merged (refreshed after each update) instead of unmerged, and
    `prompt_once=false`: a group trained in parts runs its prompt again in each part (the engine before
    2026-11-28 late: batching.SharedPrompts off), `rollout_quantization=int8`: rollouts in int8, the update corrected
    for them. The sampler keeps its log-probs in every setup (the int8 runs need them; the others pay alike)."""
    from unittest import mock

    from cpu_grpo.engine.batching import SharedPrompts

    fields = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in setup.split(",") if kv)}
    once = fields.pop("prompt_once", True)
    with mock.patch.object(SharedPrompts, "fit", staticmethod(lambda *a: False)) if not once else nullcontext():
        return _bench_default(machine, cells, reps, setup, fields)


def _bench_default(machine: Machine, cells: list[str], reps: int, setup: str, fields: dict) -> list[dict]:
    from cpu_grpo.train import runstate, update
    from cpu_grpo.train.rollout import Rollout

    start_mb = _reset_peak()
    base = {"output_dir": "/tmp/bench-engine-default", "learning_rate": 1e-9, **fields}  # the work, not the learning
    cfg = config.build("default", None, base)
    run, ref, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    shapes = Shapes.of(run.model.config)
    problems = tasks.generate("intermediate", 200, seed=7)
    out = []
    for cell in cells:
        b, g, new = map(int, cell.split("x"))
        cfg = config.build("default", None, {**base, "num_generations": g})
        run = dataclasses.replace(run, cfg=cfg)  # a Run is frozen (issue 66)
        roll, train, frac, mbs = [], [], [], []
        for r in range(reps + 1):
            batch = problems[r * b:(r + 1) * b]
            prompts = encode_prompts(run.tok, [ex.chat(cfg.instruction, cfg.system_prompt) for ex in batch])
            gen = torch.Generator().manual_seed(r)
            t = time.perf_counter()
            comps, logps = run.sampler.generate(prompts, g, dataclasses.replace(run.sampling(new), logprobs=True), gen)
            t_roll = time.perf_counter() - t
            corrected = run.sampler.int8 and cfg.vllm_importance_sampling_correction  # as a run: rollout.sample
            rollout = Rollout(batch, prompts, comps, [""] * len(comps), [False] * len(comps),
                              sampler_logps=logps if corrected else None)
            adv = torch.randn(len(comps), generator=gen)
            t = time.perf_counter()
            learner = update.Learner.of(run)  # as grpo_step: prepare, backward, step
            batch = update.prepare(learner, ref, rollout, adv, new)
            update.backward(learner, batch)
            run.opt.step()
            run.sampler.refresh()
            t_train = time.perf_counter() - t
            if r:
                lim_roll, lim_train = limits(shapes, machine, prompts, comps, lora=cfg.use_lora)
                n_comp = sum(len(c) for c in comps)
                roll.append(n_comp / t_roll)
                train.append((sum(len(p) * g for p in prompts) + n_comp) / t_train)
                frac.append((lim_roll / t_roll, lim_train / t_train, (lim_roll + lim_train) / (t_roll + t_train)))
                mbs.append(batch.mb)
        out.append({"setup": setup or "as-is", "cell": cell, "rollout_tok_s": statistics.median(roll),
                    "train_tok_s": statistics.median(train), "micro_batch": mbs[-1], "dtype": str(run.sampler.dtype),
                    "peak_mb": _status_mb("VmHWM"), "start_mb": start_mb,
                    **{k: statistics.median(f[i] for f in frac)
                       for i, k in enumerate(("rollout_of_limit", "update_of_limit", "step_of_limit"))}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--workload", choices=["engine", "default"], default="engine",
                    help="engine: --model, full fine-tuning, basic problems; default: the default profile's job")
    ap.add_argument("--grid", nargs="+", default=None)
    ap.add_argument("--setups", nargs="+", default=[""],
                    help="--workload default: one run of the grid per setup, e.g. '' micro_batch_size=4 "
                         "lora_rollout=merged (bench_default)")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    threads = set_threads()
    keep_freed_memory()
    peak16, peak32 = matmul_gflops(torch.bfloat16, 2.0, n=2048), matmul_gflops(torch.float32, 2.0, n=2048)
    machine = Machine(peak16, Machine.measure(1.0).bandwidth_gbs)  # the peak of large square matmuls
    if args.workload == "default":
        print(f"threads {threads}; matmul peak: bf16 {peak16:.0f} GFLOP/s; memory copy {machine.bandwidth_gbs:.0f} "
              f"GB/s\n")
        print("| setup | prompts x samples x new tokens | dtype | rollout tok/s | training tok/s | micro-batch | "
              "rollout of its limit | update of its limit | step of its limit | peak RSS (from) |")
        print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
        peaks = []
        for setup in args.setups:  # each row as it is measured: a run cut short keeps what it has
            for r in bench_default(machine, args.grid or ["8x8x256", "8x8x320"], args.reps, setup):
                peaks.append(r["peak_mb"])
                print(f"| {r['setup']} | {r['cell']} | {r['dtype'][6:]} | {r['rollout_tok_s']:.0f} | "
                      f"{r['train_tok_s']:.0f} | {r['micro_batch']} | {r['rollout_of_limit']:.0%} | "
                      f"{r['update_of_limit']:.0%} | {r['step_of_limit']:.0%} | {r['peak_mb']:.0f} MB "
                      f"({r['start_mb']:.0f}) |", flush=True)
        print(f"\npeak RSS {max(peaks):.0f} MB (the largest row's); a row's peak counts from its setup's start "
              f"(the RSS then in brackets: what earlier setups left); allocator: LD_PRELOAD="
              f"{os.environ.get('LD_PRELOAD', 'none (glibc)')}")
        return
    model, tok = load_model(args.model, log=lambda *a: None)
    model.train()
    sampler = Sampler(model)
    grid = args.grid or ["4x8x128", "8x8x96", "2x16x128"]
    rows = [bench_cell(model, tok, sampler, machine, *map(int, cell.split("x")), args.reps) for cell in grid]
    print(f"threads {threads}; matmul peak: bf16 {peak16:.0f} GFLOP/s, fp32 {peak32:.0f} GFLOP/s; memory copy "
          f"{machine.bandwidth_gbs:.0f} GB/s\n")
    print("| prompts x samples x new tokens | rollout tok/s | decode bound tok/s | of bound | training tok/s | "
          "training GFLOP/s | of bf16 peak | rollout of its limit | update of its limit | step of its limit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cell']} | {r['rollout_tok_s']:.0f} | {r['decode_bound_tok_s']:.0f} | "
              f"{100 * r['rollout_tok_s'] / r['decode_bound_tok_s']:.0f}% | {r['train_tok_s']:.0f} | "
              f"{r['train_gflops']:.0f} | {100 * r['train_gflops'] / peak16:.0f}% | {r['rollout_of_limit']:.0%} | "
              f"{r['update_of_limit']:.0%} | {r['step_of_limit']:.0%} |")
    print("\ndecode bound: every row alive, nothing but the bf16 weight matmuls of one decode step (an upper bound)")
    print(f"transparent huge pages in this process: {_anon_huge_mb():.0f} MB (THP_MEM_ALLOC_ENABLE="
          f"{os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')})")
    print("limit: the phase's matmul FLOPs at the bf16 peak, or a decode step's weight bytes at the memory copy "
          "bandwidth where that is longer (the module docstring)")


if __name__ == "__main__":
    main()
