import time

import torch

torch.set_num_threads(2)


def bench(f, n=10):
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


shapes = [(3072, 576), (576, 1536)] * 30
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
