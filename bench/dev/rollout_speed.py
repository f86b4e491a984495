"""Rollout tokens/s, seeded: by default the vs_trl workload (SmolLM2-135M, 4 prompts x 8 samples x 128 new tokens,
temperature 1); `--model`, `--lora` (the model as training builds it with use_lora), `--shape` and `--no-stop` change it.

    .venv/bin/python bench/dev/rollout_speed.py LABEL [--model X] [--lora] [--shape 4x8x128] [--no-stop]

For an A/B of two versions of the engine, run it alternately with PYTHONPATH pointing at each version's `src`:
the completions are the same when the two differ only in speed, so the tokens/s compare like for like.
"""

import argparse
import time

import torch

from cpu_grpo import tasks
from cpu_grpo.config import TrainConfig
from cpu_grpo.models import keep_freed_memory, set_threads
from cpu_grpo.rollout import Sampler, Sampling, encode_prompts, stop_ids
from cpu_grpo.runstate import prepare_model

ap = argparse.ArgumentParser()
ap.add_argument("label", nargs="?", default="")
ap.add_argument("--model", default="smollm2-135m")
ap.add_argument("--lora", action="store_true")
ap.add_argument("--shape", default="4x8x128", help="prompts x samples x new tokens")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--reps", type=int, default=5, help="rollouts timed, after one to warm up")
ap.add_argument("--no-stop", action="store_true", help="no end-of-sequence stops: every completion runs to the limit")
args = ap.parse_args()
set_threads(args.threads or None)
keep_freed_memory()
cfg = TrainConfig(model=args.model, use_lora=args.lora)
model, tok = prepare_model(cfg, log=lambda *a: None)
sampler = Sampler(model)
b, g, new = map(int, args.shape.split("x"))
problems = tasks.generate("basic", b * (args.reps + 1), seed=7)
stops, pad = [] if args.no_stop else stop_ids(tok, model), tok.pad_token_id
tokens, seconds = 0, 0.0
for r in range(args.reps + 1):
    prompts = encode_prompts(tok, [p.question for p in problems[r * b : (r + 1) * b]], cfg.instruction)
    t = time.perf_counter()
    comps = sampler.generate(prompts, g, Sampling(new, tuple(stops), pad), torch.Generator().manual_seed(r))
    if r:
        tokens, seconds = tokens + sum(len(c) for c in comps), seconds + time.perf_counter() - t
print(f"{args.label} {tokens / seconds:.1f} tok/s ({tokens} tokens in {seconds:.1f} s)", flush=True)
