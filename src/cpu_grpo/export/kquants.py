"""Q4_K and Q6_K blocks in numpy, which the `gguf` package (0.19) can read (gguf.quants.dequantize) but not write.

Block layouts as ggml's block_q4_K and block_q6_K (256 values a block; tests/export/test_export.py reads them back with
gguf's own dequantize). The scales are found the simple way, not by llama.cpp's search (make_qkx2_quants): each
sub-block's range (Q4_K: min and max, 16 levels; Q6_K: largest magnitude, 64 levels) becomes its scale, the scales
are quantized against the block's largest, and the values are rounded with the quantized scales. The error is a
little larger than llama-quantize's; the format is the same, so llama.cpp reads the file.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _blocks(rows: np.ndarray) -> np.ndarray:
    if rows.shape[-1] % QK_K:
        raise ValueError(f"K-quant rows must hold a multiple of {QK_K} values, not {rows.shape[-1]}")
    return rows.astype(np.float32).reshape(-1, QK_K)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _six_bit(values: np.ndarray, top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-sub-block `values` (n, k) >= 0 as 6-bit integers against the block's scale top/63 (n,): (ints, scale)."""
    scale = top / 63.0
    safe = np.where(scale > 0, scale, 1.0)
    return np.clip(np.rint(values / safe[:, None]), 0, 63).astype(np.uint8), scale.astype(np.float16).astype(np.float32)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Rows of floats -> Q4_K bytes (144 a block: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles)."""
    x = _blocks(rows).reshape(-1, 8, 32)  # (n, sub-block, value)
    lo, hi = np.minimum(x.min(-1), 0.0), x.max(-1)
    scale_f, min_f = (hi - lo) / 15.0, -lo  # value = scale * q - min, q in 0..15
    sc, d = _six_bit(scale_f, scale_f.max(-1))
    mn, dmin = _six_bit(min_f, min_f.max(-1))
    step = d[:, None] * sc  # (n, 8)
    off = dmin[:, None] * mn
    q = np.clip(np.rint((x + off[..., None]) / np.where(step > 0, step, 1.0)[..., None]), 0, 15).astype(np.uint8)
    packed = np.empty((x.shape[0], 12), np.uint8)
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    q = q.reshape(-1, 4, 2, 32)  # chunks of 64 values: the first 32 in the low nibbles, the next 32 in the high
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([_f16(d), _f16(dmin), packed, qs], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * 144)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Rows of floats -> Q6_K bytes (210 a block: 128 low nibbles, 64 bytes of high 2 bits, 16 int8 scales, d)."""
    x = _blocks(rows).reshape(-1, 16, 16)  # (n, sub-block, value)
    scale_f = np.abs(x).max(-1) / 31.0  # value = scale * (q - 32), q - 32 in -32..31
    top = scale_f.max(-1)
    d = (top / 127.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale_f / np.where(d > 0, d, 1.0)[:, None]), 0, 127).astype(np.int8)
    step = d[:, None] * sc.astype(np.float32)
    q = np.clip(np.rint(x / np.where(step > 0, step, 1.0)[..., None]) + 32, 0, 63).astype(np.uint8)
    q = q.reshape(-1, 2, 128)  # two halves of 128 values
    ql = (q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)  # (n, 2, 64)
    high = (q >> 4).reshape(-1, 2, 4, 32)  # 2 bits each, four 32-value quarters per half
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)  # (n, 2, 32)
    out = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)], axis=1)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * 210)
