"""The int8 matmuls a sampler could run, against today's packed bf16 one, at a decode step's shapes (issue 70).

    flock runs/.cpu.lock .venv/bin/python bench/int8_kernels.py            # alone on the CPU
    .venv/bin/python bench/int8_kernels.py --model qwen2.5-coder-0.5b --rows 64 16

For each projection of one layer of the model (fused q/k/v, o, fused gate/up, down) and the output layer, with
`rows` rows (a decode step's live rows), the time of y = x @ W.T in bf16 with W packed for oneDNN (the sampler's
projections.Proj today) and in int8, W quantized per output channel once and x per row (token) at each call:
- `_int_mm`: torch._int_mm (int8 x int8 -> int32), the quantization of x and the scaling of y in plain torch ops;
- `fbgemm dynamic`: torch.ops.quantized.linear_dynamic (x quantized per tensor inside, fp32 in and out);
- `onednn u8`: torch.ops.onednn.qlinear_pointwise on a prepacked int8 weight (inductor's x86 int8 kernel), x
  quantized per row and shifted to u8 (zero point 128: VNNI multiplies u8 by s8), each row's scale applied after.
Each number: the best of `reps` timed calls after warm-up; a step's matmuls: every layer's in the kernel, the
output layer's in bf16 (the int8 kernels are slow at its 151,936 outputs: its own column says how slow). The error
is the relative Frobenius error of y against fp32 math on the same bf16 weights. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from cpu_grpo.engine.projections import linear_packed, pack
from cpu_grpo.engine.threads import set_threads


def shapes(cfg) -> dict[str, tuple[int, int]]:
    """(out, in) of each matmul of a decode step, one layer's and the output layer's."""
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    h, q, kv, i = cfg.hidden_size, cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i), "lm_head": (cfg.vocab_size, h)}


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: (x_q int8, scale (rows, 1) fp32) with x ~ x_q * scale."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=1e-8) / 127
    return (x.float() / scale).round_().clamp_(-127, 127).to(torch.int8), scale


def int_mm_linear(x: torch.Tensor, wt_q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x (rows, in) bf16 @ W.T with W ~ wt_q.T * w_scale (wt_q (in, out) int8, w_scale (out,)): bf16 (rows, out)."""
    x_q, x_scale = quantize_rows(x)
    return (torch._int_mm(x_q, wt_q).float() * x_scale * w_scale).to(torch.bfloat16)


def timed(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def kernels(w: torch.Tensor, x: torch.Tensor) -> dict:
    """name -> a call computing x @ w.T (w bf16 (out, in), x bf16 (rows, in)); None where the kernel is missing."""
    out = {"bf16 packed": lambda: linear_packed(x, packed, None)} if (packed := pack(w)) is not None else \
        {"bf16 packed": lambda: F.linear(x, w)}
    w_scale = w.float().abs().amax(-1).clamp(min=1e-8) / 127  # per output channel
    wt_q = (w.float() / w_scale[:, None]).round().clamp(-127, 127).to(torch.int8).t().contiguous()
    out["_int_mm"] = lambda: int_mm_linear(x, wt_q, w_scale)
    try:
        packed_dyn = torch.ops.quantized.linear_prepack(
            torch.quantize_per_channel(w.float(), w_scale.double(), torch.zeros(len(w_scale), dtype=torch.long), 0,
                                       torch.qint8), None)
        xf = x.float()
        out["fbgemm dynamic"] = lambda: torch.ops.quantized.linear_dynamic(xf, packed_dyn, True)
    except (RuntimeError, AttributeError) as e:
        out["fbgemm dynamic"] = str(e).splitlines()[0][:60]
    try:
        wq = torch.ops.onednn.qlinear_prepack(wt_q.t().contiguous(), [x.shape[0], x.shape[1]])
        ws, zero = w_scale.float(), torch.zeros(len(w_scale), dtype=torch.int32)

        def onednn():  # u8 with a zero point (VNNI's u8 x s8; s8 activations take a reference kernel: seconds)
            x_q, x_scale = quantize_rows(x)
            x_u = (x_q.to(torch.int16) + 128).to(torch.uint8)
            y = torch.ops.onednn.qlinear_pointwise(x_u, 1.0, 128, wq, ws, zero, None, 1.0, 0, torch.float32,
                                                   "none", [], "")
            return (y * x_scale).to(torch.bfloat16)  # each row's own scale, applied after: per-token int8
        onednn()
        out["onednn u8"] = onednn
    except (RuntimeError, AttributeError, TypeError) as e:
        out["onednn u8"] = str(e).splitlines()[0][:60]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 16, 1])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    from transformers import AutoConfig

    from cpu_grpo.engine.models import resolve_model

    threads = set_threads()
    cfg = AutoConfig.from_pretrained(resolve_model(args.model, log=lambda *a: None))
    layers = cfg.num_hidden_layers
    print(f"threads {threads}; {args.model}: {layers} layers; a decode step = {layers} x (qkv, o, gate_up, down) + "
          f"lm_head; cpu capability {torch.backends.cpu.get_cpu_capability()}\n")
    print("| rows | kernel | step's matmuls ms | of bf16 packed (speed) | rel. error | per matmul ms (qkv, o, "
          "gate_up, down, lm_head) |")
    print("|---|---|---|---|---|---|", flush=True)
    gen = torch.Generator().manual_seed(0)
    for rows in args.rows:
        per, err = {}, {}
        for name, (o, i) in shapes(cfg).items():
            w = (torch.randn(o, i, generator=gen) / i ** 0.5).to(torch.bfloat16)
            x = torch.randn(rows, i, generator=gen).to(torch.bfloat16)
            exact = x.float() @ w.float().t()
            for k, fn in kernels(w, x).items():
                if isinstance(fn, str):
                    per.setdefault(k, {})[name] = fn
                    continue
                per.setdefault(k, {})[name] = timed(fn, args.reps) * 1000
                y = fn().float()
                err.setdefault(k, []).append(float((y - exact).norm() / exact.norm()))
        base = layers * sum(per["bf16 packed"][n] for n in ("qkv", "o", "gate_up", "down")) + \
            per["bf16 packed"]["lm_head"]
        for k, ms in per.items():
            missing = [v for v in ms.values() if isinstance(v, str)]
            if missing:
                print(f"| {rows} | {k} | - | - | - | not on offer: {missing[0]} |")
                continue
            step = layers * sum(ms[n] for n in ("qkv", "o", "gate_up", "down")) + per["bf16 packed"]["lm_head"]
            print(f"| {rows} | {k} | {step:.1f} | {base / step:.2f}x | {max(err[k]):.4f} | "
                  f"{', '.join(f'{v:.3f}' for v in ms.values())} |", flush=True)


if __name__ == "__main__":
    main()
