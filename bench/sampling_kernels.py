"""Sampling's two kernels alone, before and after issue 49's changes, at the default profile's shapes (the 0.5B
Qwen2: width 896, MLP 4864, q/k/v 1152, 151,936 words):

    .venv/bin/python bench/sampling_kernels.py

- every matmul of a decode step as F.linear runs it (oneDNN reorders the weight on each call) and on a weight
  packed once (engine.projections.pack, what inductor's freezing and IPEX do), at 1, 16 and 64 rows: GFLOP/s, and
  whether the results are bitwise equal;
- one token drawn per row at temperature 0.7 from 64 rows of bf16 logits: the former draw (softmax and a
  cumulative sum over all words) and engine.sampler.sample_token (two levels, a kept buffer): ms a call.
`--zentorch` (AMD's ZenDNN plugin, issue 49's lever; `pip install zentorch==2.13.0.2`, the build for torch 2.13)
adds its matmuls at 64 rows: bf16 on its own packed weight, and int8 (weights per channel, activations quantised
per call: `zentorch_dynamic_qlinear`) on a plain and a packed weight, each with its error against the exact
product of the same int8 weights.
Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from cpu_grpo.engine.projections import linear_packed, pack
from cpu_grpo.engine.sampler import sample_token, sample_work

SHAPES = {"q/k/v": (1152, 896), "o": (896, 896), "gate/up": (9728, 896), "down": (896, 4864), "lm_head": (151936, 896)}


def seconds(fn, reps: int) -> float:
    for _ in range(2):
        fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def former_draw(logits, temperature, generator):
    """sample_token before 2026-11-28 (no top-k/top-p): softmax and a cumulative sum over every word."""
    cdf = (logits.float() / temperature).softmax(-1).cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


def zentorch_row(zt, name: str, n: int, k: int) -> str:
    w = torch.randn(n, k, dtype=torch.bfloat16)
    x = torch.randn(64, k, dtype=torch.bfloat16)
    scale = w.float().abs().amax(1) / 127
    wq = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    packed, zbf = pack(w), zt.zentorch_weight_prepack_for_linear(w)
    zq = zt.zentorch_weight_prepack_for_dynamic_qlinear(wq)
    ref = x.float() @ (wq.float() * scale[:, None]).t()  # what int8 should give

    def err(y):
        return f"{((y.float() - ref).norm() / ref.norm()).item():.3f}"

    runs = [lambda: linear_packed(x, packed), lambda: zt.zentorch_linear_unary(x, zbf, is_weight_prepacked=True),
            lambda: zt.zentorch_dynamic_qlinear(x, wq, scale),
            lambda: zt.zentorch_dynamic_qlinear(x, zq, scale, is_weight_prepacked=True)]
    rate = [2 * 64 * n * k / 1e9 / seconds(fn, 5 if n > 100_000 else 30) for fn in runs]
    return (f"| {name} {n} x {k} | {rate[0]:.0f} | {rate[1]:.0f} | {rate[2]:.0f} | {err(runs[2]())} | "
            f"{rate[3]:.0f} | {err(runs[3]())} |")


def zentorch_table() -> None:
    try:
        import zentorch  # noqa: F401 (registers torch.ops.zentorch)
    except ImportError:
        raise SystemExit("--zentorch needs AMD's plugin: pip install zentorch==2.13.0.2 (for torch 2.13)") from None

    zt = torch.ops.zentorch
    print("\n| matmul (out x in) at 64 rows | packed GFLOP/s | zentorch bf16 | zentorch int8 | int8 error | "
          "zentorch int8, packed weight | its error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, (n, k) in SHAPES.items():
        print(zentorch_row(zt, name, n, k), flush=True)
    print("error: |y - x Wq^T| / |x Wq^T| against the exact product with the same int8 weights (the activations' "
          "quantisation alone; random inputs, no outliers)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zentorch", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; torch {torch.__version__}\n")
    print("| matmul (out x in) | rows | F.linear GFLOP/s | packed GFLOP/s | packed / F.linear | bitwise equal |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16)
        packed = pack(w)
        if packed is None:
            raise SystemExit("no oneDNN bf16 linear on this build or machine: nothing to compare")
        for rows in (1, 16, 64):
            x = torch.randn(rows, k, dtype=torch.bfloat16)
            reps = 5 if n > 100_000 else 30
            plain = seconds(lambda x=x, w=w: F.linear(x, w), reps)
            fast = seconds(lambda x=x, p=packed: linear_packed(x, p), reps)
            flops = 2 * rows * n * k / 1e9
            same = torch.equal(F.linear(x, w), linear_packed(x, packed))
            print(f"| {name} {n} x {k} | {rows} | {flops / plain:.0f} | {flops / fast:.0f} | "
                  f"{plain / fast:.2f}x | {same} |")
    logits = (torch.randn(64, 151936) * 3).bfloat16()
    work = sample_work(64, logits.shape[1])
    gen = torch.Generator().manual_seed(0)
    before = seconds(lambda: former_draw(logits, 0.7, gen), 20)
    after = seconds(lambda: sample_token(logits, 0.7, 0, 1.0, gen, work), 20)
    print(f"\none token for each of 64 rows (151,936 words, T 0.7): former draw {1e3 * before:.1f} ms, "
          f"sample_token {1e3 * after:.1f} ms ({before / after:.1f}x)")
    if args.zentorch:
        zentorch_table()


if __name__ == "__main__":
    main()
