"""Greedy evaluation speed against its batch size: the default profile's model with LoRA, as a run evaluates.

    .venv/bin/python bench/dev/eval_batch.py --sizes 50 100 [--task intermediate] [--n 100] [--checkpoint DIR]

The first `--n` problems of the default profile's held-out set of `--task` (seed 0), 256 tokens, evaluated once
per size in one process; prints seconds, completion tokens, tokens/s, accuracy and peak RSS. Run it alone.
"""

import argparse
import resource
import time

import torch

from cpu_grpo import checkpoint, config, curriculum, evaluate
from cpu_grpo.allocator import keep_freed_memory
from cpu_grpo.models import set_threads
from cpu_grpo.rollout import Sampler, Sampling, stop_ids
from cpu_grpo.runstate import prepare_model

ap = argparse.ArgumentParser()
ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
ap.add_argument("--task", default="intermediate")
ap.add_argument("--n", type=int, default=200)
ap.add_argument("--checkpoint", help="a run's checkpoint directory (default: the base model)")
args = ap.parse_args()
keep_freed_memory()
set_threads()
cfg = config.build("default")
model, tok = prepare_model(cfg, lambda *a: None)
if args.checkpoint:
    model = checkpoint.load_weights(model, args.checkpoint)
sampler = Sampler(model, dtype=torch.bfloat16)
examples = {s.task: s for s in curriculum.held_out(cfg)}[args.task].examples[:args.n]
greedy = Sampling(256, stop_ids(tok, model), tok.pad_token_id, 0.0)
for size in args.sizes:
    t = time.time()
    records = evaluate.run_eval(sampler, tok, examples, cfg.instruction, greedy, log=lambda *a: None, batch_size=size)
    seconds = time.time() - t
    tokens = sum(len(tok(r["completion"])["input_ids"]) for r in records)
    print(f"batch {size}: {seconds:.1f} s, {tokens} tokens, {tokens / seconds:.0f} tok/s, "
          f"{sum(r['correct'] for r in records)} right, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB",
          flush=True)
