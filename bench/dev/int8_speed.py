import warnings

import torch
from common import MLP_SHAPES, bench

warnings.filterwarnings("ignore")


shapes = MLP_SHAPES
ws = [torch.randn(*s) for s in shapes]
bw = [w.bfloat16() for w in ws]
byts = sum(w.numel() for w in ws)


def q8(w):
    s = w.abs().amax(1) / 127
    return (w / s[:, None]).round().to(torch.int8), s.bfloat16()


qw = [q8(w) for w in ws]

lins = []
for w in ws:
    l = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    l.weight.data = w
    lins.append(torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(l), {torch.nn.Linear}, dtype=torch.qint8))
with torch.no_grad():
    for M in (1, 8, 32):
        x = torch.randn(M, 576).bfloat16()
        xf = x.float()
        tb = bench(
            lambda: [
                torch.nn.functional.linear(x if w.shape[1] == 576 else torch.randn(M, 1536, dtype=torch.bfloat16), w)
                for w in bw
            ]
        )
        x2 = torch.randn(M, 1536, dtype=torch.bfloat16)
        tw = bench(lambda: [torch._weight_int8pack_mm(x if w.shape[1] == 576 else x2, w, s) for w, s in qw])
        x2f = x2.float()
        tq = bench(lambda: [l(xf if l[0].in_features == 576 else x2f) for l in lins])
        print(
            f"M={M}: bf16 {tb * 1e3:.1f} ms | w8 pack_mm {tw * 1e3:.1f} ms | fbgemm dyn {tq * 1e3:.1f} ms  (GF bf16 {2 * M * byts / tb / 1e9:.0f})"
        )
