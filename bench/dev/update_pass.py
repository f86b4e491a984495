import time

import torch

from cpu_grpo.batching import group_logprobs
from cpu_grpo.models import keep_freed_memory, load_model, set_threads

set_threads()
keep_freed_memory()
model, tok = load_model("smollm2-135m", log=lambda *a: None)
model.train()
g = 8
prompts = [list(range(1000, 1080))]
comps = [list(range(2000, 2000 + 120 - 8 * j)) for j in range(g)]


def one():
    for s in ((0, 4), (4, 8)):
        lp, mask = group_logprobs(model, prompts, comps, [0], g, 0, 1.0, autocast=True, samples=tuple(range(*s)))
        (lp * mask).sum().backward()


one()
ts = []
for _ in range(3):
    t = time.perf_counter()
    one()
    ts.append(time.perf_counter() - t)
print(sorted(ts))
with torch.profiler.profile(record_shapes=True) as prof:
    one()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=28))
print(
    prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=28, max_shapes_column_width=60
    )
)
