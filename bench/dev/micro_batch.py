"""The update of one GRPO step at several micro-batch sizes, the same completions each time (issue 13).

    .venv/bin/python bench/dev/micro_batch.py [--model qwen2.5-coder-0.5b] [--sizes 1 4 8]

Samples one step of the default profile's shape (4 prompts x 8 samples, 256 tokens, the \\boxed{} instruction),
then times `step.update` on those completions at each micro-batch size (weights restored between runs), with
the peak RSS after each. Run it alone.
"""

import argparse
import copy
import time
from pathlib import Path

import torch

from cpu_grpo import config, tasks
from cpu_grpo.grpo import group_advantages
from cpu_grpo.models import keep_freed_memory, set_threads
from cpu_grpo.runstate import build_run
from cpu_grpo.step import sample, update
from cpu_grpo.tracking import peak_rss_mb

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="qwen2.5-coder-0.5b")
ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
args = ap.parse_args()
set_threads()
keep_freed_memory()
cfg = config.build("default", None, {"model": args.model, "eval_size": 0, "output_dir": "/tmp/mb-bench"})
torch.manual_seed(0)
r, _ = build_run(cfg, Path("/tmp/mb-bench"), None, lambda *a: None)
batch = tasks.generate("intermediate", 4, seed=3)
t0 = time.time()
rollout = sample(r, batch)
r.sampler.release()  # as grpo_step does before its update
print(f"rollout {time.time() - t0:.1f}s, mean length {sum(map(len, rollout.completions)) / 32:.0f}")
adv, _ = group_advantages(torch.rand(32, generator=torch.Generator().manual_seed(0)), 8)
state = copy.deepcopy({k: v.detach().clone() for k, v in r.model.state_dict().items() if "lora" in k})
opt_state = copy.deepcopy(r.opt.state_dict())
for mb in args.sizes:
    r.cfg = config.build(None, None, {**cfg.to_dict(), "micro_batch_size": mb})
    r.model.load_state_dict(state, strict=False)
    r.opt.load_state_dict(opt_state)
    t0 = time.time()
    upd = update(r, None, rollout, adv)
    print(f"micro-batch {mb}: update {time.time() - t0:.1f}s, loss {upd.sums['loss']:.5f}, "
          f"peak RSS {peak_rss_mb():.0f} MB",
          flush=True)
