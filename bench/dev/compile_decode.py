import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
from transformers import AutoModelForCausalLM

from cpu_grpo.llama import cached_forward, fuse_projections, sampling_projections
from cpu_grpo.models import resolve_model

torch.set_num_threads(2)
path = resolve_model("smollm2-135m")
net = AutoModelForCausalLM.from_pretrained(path).bfloat16().eval()
cfg = net.config
projs = sampling_projections(net, fuse_projections(net))
N = int(sys.argv[1])
P, T = 100, 128
hd = cfg.hidden_size // cfg.num_attention_heads
cache = [
    (
        torch.zeros(N, cfg.num_key_value_heads, hd, P + T, dtype=torch.bfloat16),
        torch.zeros(N, cfg.num_key_value_heads, P + T, hd, dtype=torch.bfloat16),
    )
    for _ in range(cfg.num_hidden_layers)
]
valid = torch.ones(N, P + T, dtype=torch.bool)
tok = torch.randint(0, 1000, (N, 1))


def step(tok, pos, start):
    return net.lm_head(cached_forward(net, projs, tok, pos, cache, start, valid))


f = torch.compile(step, dynamic=True) if sys.argv[2] == "compile" else step
import torch._inductor.config as ic

ic.freezing = len(sys.argv) > 3
with torch.no_grad():
    t0 = time.perf_counter()
    for s in range(3):
        f(tok, torch.full((N, 1), P + s), P + s)
    print("warmup", time.perf_counter() - t0)
    t0 = time.perf_counter()
    for s in range(3, 23):
        l = f(tok, torch.full((N, 1), P + s), P + s)
    dt = (time.perf_counter() - t0) / 20
    print(f"{sys.argv[2]} N={N} step {dt * 1000:.1f} ms  {N / dt:.0f} tok/s")
