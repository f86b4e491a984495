import warnings

import torch
from common import MLP_SHAPES, bench

warnings.filterwarnings("ignore")


shapes = MLP_SHAPES
ws = [torch.randn(*s) for s in shapes]
qs = []
for w in ws:
    s = w.abs().amax(1) / 127
    qs.append(((w / s[:, None]).round().to(torch.int8).t().contiguous(), s))


def lin8(x, qt, s):
    xs = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
    xq = (x / xs).round().to(torch.int8)
    return torch._int_mm(xq, qt).float() * xs * s


for M in (1, 8, 17, 32):
    x = torch.randn(M, 576)
    x2 = torch.randn(M, 1536)
    try:
        t = bench(lambda: [lin8(x if q.shape[0] == 576 else x2, q, s) for q, s in qs])
        print(f"M={M} per-token int8 _int_mm {t * 1e3:.1f} ms")
    except Exception as e:
        print(M, e)
