"""The frozen projections a sampling step runs (sampler.py, decode.py, llama.cached_forward): q/k/v and gate/up
fused into one buffer each (`fuse_projections`), each weight packed for oneDNN's bf16 matmul (`pack`) or quantized
to int8 for its u8 x s8 one (`quantize`), LoRA adapters applied beside a frozen base (`Proj`)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


def _fused_groups(layer) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The projections fuse_projections stacks into one buffer each, (parent module, names): q/k/v and gate/up
    (phi3's come as one module each already)."""
    attn = ("qkv_proj",) if hasattr(layer.self_attn, "qkv_proj") else ("q_proj", "k_proj", "v_proj")
    mlp = ("gate_up_proj",) if hasattr(layer.mlp, "gate_up_proj") else ("gate_proj", "up_proj")
    return ("self_attn", attn), ("mlp", mlp)


def fuse_projections(net, shapes: dict | None = None) -> list[tuple[Tensor, Tensor | None, Tensor]]:
    """Per layer (Wqkv, bqkv or None, Wgate_up): one buffer each, with the modules' weights made views into it.

    For a frozen copy (the sampler's): a decode step then runs two matmuls where it ran five, and copying new
    weights into the modules (Sampler.refresh) updates the fused buffers too. No extra memory. With `shapes`
    (id of a released, empty parameter -> its shape) the buffers are allocated empty instead of concatenated.
    """
    fused = []
    for layer in net.model.layers:
        qkv, gate_up = ([plain_layer(getattr(getattr(layer, parent), name)) for name in names]
                        for parent, names in _fused_groups(layer))
        wqkv = _fuse(qkv, "weight", shapes)
        bqkv = _fuse(qkv, "bias", shapes) if qkv[0].bias is not None else None
        fused.append((wqkv, bqkv, _fuse(gate_up, "weight", shapes)))
    return fused


def plain_layer(module):
    """The frozen linear layer under a LoRA wrapper (peft), or the module itself."""
    return getattr(module, "base_layer", module)


def pack(w: Tensor) -> Tensor | None:
    """A bf16 weight (out, in) in oneDNN's blocked layout for `linear_packed`, or None where that is not on offer
    (another dtype, a torch without oneDNN, a CPU it does not run on). F.linear reorders its weight on every
    call; a pre-packed one does not: on a 2-core AMD EPYC, the 0.5B Qwen's matmuls 1.02-1.27x faster at 64 rows,
    1.35-1.83x at 16, 1.4-2.9x at 1, results bitwise equal (bench/sampling_kernels.py). This is what
    inductor's weight freezing and IPEX do for CPU inference."""
    if w.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(w.detach(), 64)
    except (RuntimeError, AttributeError):  # no such kernel on this build or machine
        return None


def linear_packed(x: Tensor, packed: Tensor, b: Tensor | None = None) -> Tensor:
    """x @ w.T + b for a weight packed by `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [None], "")


class Int8(NamedTuple):
    """A weight (out, in) in int8, one scale per output channel, prepacked for oneDNN's u8 x s8 matmul (VNNI)."""

    packed: Tensor
    scale: Tensor  # (out,) fp32: w ~ int8 * scale
    zeros: Tensor  # (out,) int32: the weight's zero points (symmetric: 0)


def quantize(w: Tensor) -> Int8 | None:
    """w in int8 per output channel (symmetric, absmax / 127), or None where oneDNN's int8 matmul is not on offer."""
    scale = w.detach().float().abs().amax(-1).clamp(min=1e-8) / 127
    q = (w.detach().float() / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    try:
        return Int8(torch.ops.onednn.qlinear_prepack(q, None), scale, torch.zeros(len(scale), dtype=torch.int32))
    except (RuntimeError, AttributeError):
        return None


def linear_int8(x: Tensor, w: Int8, b: Tensor | None = None) -> Tensor:
    """x @ w.T + b in int8: each row of x (a token) quantized with its own scale to u8 around 128 (VNNI multiplies
    u8 by s8; s8 activations take oneDNN's reference kernel, ~1000x slower), the int32 sums scaled back by the
    row's and the channel's scales. Returns x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    s = rows.abs().amax(-1, keepdim=True).float().clamp_(min=1e-8) / 127
    xu = (rows.float() / s).round_().add_(128).clamp_(0, 255).to(torch.uint8)
    y = torch.ops.onednn.qlinear_pointwise(xu, 1.0, 128, w.packed, w.scale, w.zeros, None, 1.0, 0, torch.float32,
                                           "none", [], "").mul_(s)
    y = y if b is None else y.add_(b)
    return y.to(x.dtype).view(*x.shape[:-1], -1)


class Proj:
    """A frozen linear map for sampling: x @ w.T + b, plus an optional low-rank term (x @ a.T) @ bt (a LoRA
    adapter kept apart from its base weight: bt is B.T with the scaling folded in), added in place. `packed`:
    w in oneDNN's layout (`pack`), used instead of w where given; `int8`: w quantized (`quantize`), used instead
    of both."""

    __slots__ = ("w", "b", "a", "bt", "packed", "int8")

    def __init__(self, w: Tensor, b: Tensor | None = None, a: Tensor | None = None, bt: Tensor | None = None,
                 packed: Tensor | None = None, int8: Int8 | None = None):
        self.w, self.b, self.a, self.bt, self.packed, self.int8 = w, b, a, bt, packed, int8

    def __call__(self, x: Tensor) -> Tensor:
        if self.int8 is not None:
            y = linear_int8(x, self.int8, self.b)
        else:
            y = F.linear(x, self.w, self.b) if self.packed is None else linear_packed(x, self.packed, self.b)
        if self.a is not None:
            y.view(-1, y.shape[-1]).addmm_(F.linear(x, self.a).view(-1, self.a.shape[0]), self.bt)
        return y


class LayerProjs(NamedTuple):
    qkv: Proj  # q, k and v stacked
    o: Proj
    gate_up: Proj  # gate and up stacked
    down: Proj


def sampling_projections(net, fused, lora=None, int8: dict | None = None) -> list[LayerProjs]:
    """Per layer, the four projections a sampling step runs: fused q/k/v and gate/up buffers (fuse_projections),
    o and down from the modules, their weights packed for oneDNN where it runs (`pack`). `lora(modules)` ->
    (a, bt) or None gives the low-rank term of a group of modules stacked as one projection (sampler.Sampler, for
    LoRA sampled unmerged). With `int8` (a dict, kept by the caller: a weight's quantized copy by its id, made once
    for a frozen base), the weights run in int8 (`quantize`) instead."""
    out = []
    for layer, (wqkv, bqkv, wgu) in zip(net.model.layers, fused, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        (_, qkv_names), (_, gu_names) = _fused_groups(layer)
        parts = {"qkv": (wqkv, bqkv, [getattr(attn, name) for name in qkv_names]),
                 "o": (plain_layer(attn.o_proj).weight, plain_layer(attn.o_proj).bias, [attn.o_proj]),
                 "gate_up": (wgu, None, [getattr(mlp, name) for name in gu_names]),
                 "down": (plain_layer(mlp.down_proj).weight, plain_layer(mlp.down_proj).bias, [mlp.down_proj])}
        out.append(LayerProjs(**{k: Proj(w, b, *((lora and lora(mods)) or ()),
                                         **({"int8": _int8_of(w, int8)} if int8 is not None else {"packed": pack(w)}))
                                 for k, (w, b, mods) in parts.items()}))
    return out


def _int8_of(w: Tensor, kept: dict) -> Int8 | None:
    if id(w) not in kept:
        kept[id(w)] = quantize(w)
    return kept[id(w)]


def fused_names(net) -> set[str]:
    """Names of the parameters that fuse_projections makes views into its buffers."""
    return {f"model.layers.{i}.{parent}.{name}.{kind}"
            for i, layer in enumerate(net.model.layers) for parent, names in _fused_groups(layer) for name in names
            for kind in ("weight", "bias") if getattr(getattr(getattr(layer, parent), name), kind, None) is not None}


def _fuse(modules, name: str, shapes: dict | None) -> Tensor:
    ws = [getattr(m, name) for m in modules]
    dims = [shapes[id(w)] if shapes else w.shape for w in ws]
    if shapes:
        buf = torch.empty((sum(d[0] for d in dims), *dims[0][1:]), dtype=ws[0].dtype)
    else:
        buf = torch.cat([w.detach() for w in ws])
    start = 0
    for m, d in zip(modules, dims, strict=True):
        setattr(m, name, torch.nn.Parameter(buf[start:start + d[0]], requires_grad=False))
        start += d[0]
    return buf
