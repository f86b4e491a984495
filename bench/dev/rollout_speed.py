"""Rollout tokens/s of the vs_trl workload (4 prompts x 8 samples x 128 new tokens, temperature 1), seeded.

    .venv/bin/python bench/dev/rollout_speed.py LABEL [threads]

For an A/B of two versions of the engine, run it alternately with PYTHONPATH pointing at each version's `src`:
the completions are the same when the two differ only in speed, so the tokens/s compare like for like.
"""

import sys
import time

import torch

from cpu_grpo import tasks
from cpu_grpo.config import TrainConfig
from cpu_grpo.models import keep_freed_memory, load_model, set_threads
from cpu_grpo.rollout import Sampler, encode_prompts, eos_ids

set_threads(int(sys.argv[2]) if len(sys.argv) > 2 else None)
keep_freed_memory()
model, tok = load_model("smollm2-135m", log=lambda *a: None)
sampler = Sampler(model)
b, g, new, reps = 4, 8, 128, 5
problems = tasks.generate("basic", b * (reps + 1), seed=7)
stops, pad = eos_ids(tok, model), tok.pad_token_id
tokens, seconds = 0, 0.0
for r in range(reps + 1):  # the first one warms up
    prompts = encode_prompts(tok, [p.question for p in problems[r * b : (r + 1) * b]], TrainConfig().instruction)
    t = time.perf_counter()
    comps = sampler.generate(prompts, g, new, stops, pad, 1.0, 0, 1.0, torch.Generator().manual_seed(r))
    if r:
        tokens, seconds = tokens + sum(len(c) for c in comps), seconds + time.perf_counter() - t
print(f"{sys.argv[1] if len(sys.argv) > 1 else ''} {tokens / seconds:.1f} tok/s ({tokens} tokens in {seconds:.1f} s)")
