"""Where a default-profile rollout's time goes, op by op, and whether a compiled decode step pays (issue 49):

    .venv/bin/python bench/decode_profile.py              # 8 prompts x 8, 256 tokens: the ops' self time
    .venv/bin/python bench/decode_profile.py --compile    # the same rollouts with the decode step compiled

The run is built as `cpu-grpo train --profile default` builds it (Qwen2.5-Coder-0.5B, LoRA sampled unmerged,
matmul weights packed for oneDNN); three rollouts of intermediate prompts, the first a warm-up, the second under
torch.profiler. `--compile` wraps the decode step in `torch.compile(dynamic=True)` with the packed matmul as an
opaque custom op (inductor does not lower `mkldnn._linear_pointwise` at dynamic shapes: LoweringException) and
prints each rollout's time as it ends, the first one including the compilation. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from pathlib import Path

import torch

import cpu_grpo.engine.projections as projections
import cpu_grpo.engine.sampler as sampler_mod
from cpu_grpo import config
from cpu_grpo.data import tasks
from cpu_grpo.engine.prompts import encode_prompts
from cpu_grpo.engine.threads import set_threads
from cpu_grpo.machine.allocator import keep_freed_memory
from cpu_grpo.train import runstate


def compile_decode() -> None:
    @torch.library.custom_op("bench::linear_packed", mutates_args=())
    def linear_packed(x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [None], "")

    @linear_packed.register_fake
    def _(x, packed, b):
        return x.new_empty(*x.shape[:-1], packed.shape[0])

    projections.linear_packed = linear_packed
    sampler_mod.decode_step = torch.compile(sampler_mod.decode_step, dynamic=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--grid", default="8x8x256", help="prompts x samples x new tokens")
    args = ap.parse_args()
    print(f"threads {set_threads()}; torch {torch.__version__}", flush=True)
    keep_freed_memory()
    if args.compile:
        compile_decode()
    cfg = config.build("default", None, {"output_dir": "/tmp/bench-decode-profile"})
    run, *_ = runstate.build_run(cfg, Path(cfg.output_dir), None, lambda *a: None)
    problems = tasks.generate("intermediate", 200, seed=7)
    b, g, new = map(int, args.grid.split("x"))
    for r in range(3):
        batch = problems[r * b:(r + 1) * b]
        prompts = encode_prompts(run.tok, [ex.chat(cfg.instruction, cfg.system_prompt) for ex in batch])
        profiling = r == 1 and not args.compile
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if profiling else None
        with prof or nullcontext():
            t = time.perf_counter()
            comps = run.sampler.generate(prompts, g, run.sampling(new), torch.Generator().manual_seed(r))
            dt = time.perf_counter() - t
        n = sum(len(c) for c in comps)
        print(f"rollout {r}{' (profiled)' if profiling else ''}: {n} tokens in {dt:.1f} s, {n / dt:.0f} tok/s",
              flush=True)
        if profiling:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
