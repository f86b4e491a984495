import torch
from common import MLP_SHAPES, bench

shapes = MLP_SHAPES
bw = [torch.randn(*s).bfloat16() for s in shapes]
print([n for n in dir(torch.ops.mkldnn) if "linear" in n or "reorder" in n])
for M in (1, 8, 32):
    x = torch.randn(M, 576).bfloat16()
    x2 = torch.randn(M, 1536).bfloat16()
    tb = bench(lambda: [torch.nn.functional.linear(x if w.shape[1] == 576 else x2, w) for w in bw])
    try:
        pw = [torch.ops.mkldnn._reorder_linear_weight(w, M) for w in bw]
        tp = bench(
            lambda: [
                torch.ops.mkldnn._linear_pointwise(x if w.shape[1] == 576 else x2, p, None, "none", [], "")
                for w, p in zip(bw, pw)
            ]
        )
    except Exception as e:
        tp = float("nan")
        print(e)
    print(f"M={M}: F.linear {tb * 1e3:.1f} ms | mkldnn packed {tp * 1e3:.1f} ms")
