import resource
import time

import torch

torch.set_num_threads(2)
ps = [torch.nn.Parameter(torch.randn(1536, 576)) for _ in range(90)] + [torch.nn.Parameter(torch.randn(49152, 576))]
for p in ps:
    p.grad = torch.randn_like(p)
for kw in ({}, {"fused": True}, {"foreach": True}):
    o = torch.optim.AdamW(ps, lr=1e-6, **kw)
    o.step()
    t = time.perf_counter()
    o.step()
    o.step()
    print(kw, (time.perf_counter() - t) / 2, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
