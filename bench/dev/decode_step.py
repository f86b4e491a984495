import sys
import time

import torch

from cpu_grpo.llama import PrefixCache, cached_forward, decode_step
from cpu_grpo.models import keep_freed_memory, load_model, set_threads
from cpu_grpo.rollout import Sampler, left_pad

set_threads()
keep_freed_memory()
model, tok = load_model("smollm2-135m", log=lambda *a: None)
s = Sampler(model)
net = s.net
cfg = net.config
b, g = 4, 8
P = 80
ids, valid = left_pad([list(range(100, 100 + P))] * b, 0)
pos = valid.long().cumsum(-1) - 1
pc = [(torch.zeros(b, 3, 64, P, dtype=net.dtype), torch.zeros(b, 3, P, 64, dtype=net.dtype)) for _ in range(30)]
with torch.no_grad():
    cached_forward(net, s.projs, ids, pos, pc, 0, valid)
    cache = PrefixCache(pc, valid, g, 128)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    if n < 32:
        cache.keep(torch.arange(32)[:n])
    tk = torch.randint(0, 1000, (n,))
    ps = torch.full((n,), P)
    for t in range(3):
        net.lm_head(decode_step(net, s.projs, cache, tk, ps + t, t))
    t0 = time.perf_counter()
    for t in range(3, 43):
        net.lm_head(decode_step(net, s.projs, cache, tk, ps + t, t))
    dt = (time.perf_counter() - t0) / 40
    print(f"n={n} decode step {dt * 1e3:.1f} ms = {n / dt:.0f} tok/s")
    if len(sys.argv) > 2:
        with torch.profiler.profile() as prof:
            for t in range(43, 48):
                net.lm_head(decode_step(net, s.projs, cache, tk, ps + t, t))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
