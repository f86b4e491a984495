"""A short hand-written forward for decoder-only transformers of the Llama family, over the HF modules' weights.

Three uses, all faster on a CPU than the generic HF forward:
- `cached_forward`: a prompt's prefill into a KV cache (sampler.py);
- `decode.decode_step` (its own module): one sampled token for every live row, with each prompt's keys/values
  kept once and shared by the G rows of its group (shared-prefix attention) and fused q/k/v and gate/up
  projections (`sampling_projections`, here);
- `group_forward`: the training pass of GRPO, where the G completions of a prompt share it: the prompt is
  run once per group and its keys/values are expanded to the G rows, so prompt tokens cost 1/G of their
  usual forward and backward. Gradients flow through the shared prompt as they would through G copies;
  `prompt_forward` runs a prompt alone and keeps its pass (a `Prefix`) for a group trained in parts.
Modules are called as modules, so LoRA layers (peft) and autocast work unchanged.

One forward serves every architecture in ARCHS; what differs between them is an `Arch` record read off the
config and the modules (`arch_of`), not a copy of the forward per model.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .arch import (
    Arch,
    activation,
    apply_rope,
    arch_of,
    layer_norms,
    post_norm,
    rms,
    rms_one,
    rotary_tables,
    supports,  # noqa: F401 (llama.supports: batching.py calls it, tests patch it)
)
from .projections import LayerProjs, plain_layer


def attention(q: Tensor, kt: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Grouped-query attention as two batched matmuls; ~15x faster than CPU SDPA for one query token.

    q (N, H, T, D), kt (N, Hkv, D, S) (keys transposed), v (N, Hkv, S, D), mask (N, 1, T, S) -> (N, H, T, D)
    """
    n, h, t, d = q.shape
    hkv = kt.shape[1]
    rep = h // hkv
    q = q.reshape(n, hkv, rep * t, d)  # heads h = j*rep + r share kv head j
    scores = (q @ kt) * scale  # (N, Hkv, rep*T, S), in q's dtype (bf16 in training and sampling)
    scores = scores.view(n, hkv, rep, t, -1).masked_fill(~mask[:, :, None], -math.inf).view(n, hkv, rep * t, -1)
    # the softmax kernel works in fp32 inside; a bf16 output is what the next matmul takes anyway, and it is
    # the one tensor the backward keeps (an fp32 softmax output would be kept too: 220 MB a group here)
    return (scores.softmax(-1).to(v.dtype) @ v).view(n, h, t, d)


def _project(attn, h: Tensor, arch: Arch) -> tuple[Tensor, Tensor, Tensor]:
    h = _autocast_input(h)
    if arch.fused:  # phi3: one qkv_proj, q first, then k and v
        qkv = attn.qkv_proj(h)
        nq = plain_layer(attn.o_proj).in_features
        return qkv.split([nq, (qkv.shape[-1] - nq) // 2, (qkv.shape[-1] - nq) // 2], dim=-1)
    return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)


def _autocast_input(h: Tensor) -> Tensor:
    """h cast once to autocast's dtype for the projections that share it: autocast would cast it in each of them,
    and each cast copy is kept for the backward."""
    return h.to(torch.get_autocast_dtype("cpu")) if torch.is_autocast_enabled("cpu") else h


def _heads(x: Tensor, n: int, t: int, d: int, table: tuple | None, norm=None, offset: float = 0.0) -> Tensor:
    """(N*T, heads*D) -> (N, heads, T, D): the per-head norm (qwen3, gemma3), then the rotary embedding if any."""
    x = x.view(n, t, -1, d)
    if norm is not None:
        x = rms(x, norm, offset)
    x = x.transpose(1, 2)
    return x if table is None else apply_rope(x, *table)


def _mlp(layer, x: Tensor, arch: Arch) -> Tensor:
    _, _, ln_in, ln_out = layer_norms(layer, arch)
    mlp = layer.mlp
    h = _autocast_input(rms(x, ln_in, arch.norm_offset))
    gate, up = mlp.gate_up_proj(h).chunk(2, dim=-1) if arch.fused else (mlp.gate_proj(h), mlp.up_proj(h))
    act_fn = activation(mlp)
    act = _SwiGLU.apply(gate, up) if torch.is_grad_enabled() and _is_silu(act_fn) else act_fn(gate) * up
    return x + post_norm(mlp.down_proj(act), ln_out, arch.norm_offset)


def _is_silu(fn) -> bool:
    return isinstance(fn, torch.nn.SiLU) or type(fn).__name__ == "SiLUActivation" or fn is F.silu


class _SwiGLU(torch.autograd.Function):
    """silu(gate) * up that keeps only gate and up for the backward (autograd would also keep silu(gate) and
    the product: two more (tokens, intermediate) tensors a layer); silu is recomputed, which is cheap."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, up = ctx.saved_tensors
        gf = gate.float()
        sig = torch.sigmoid(gf)
        silu = gf * sig
        grad_f = grad.float()
        d_gate = grad_f * up.float() * sig * (1 + gf * (1 - sig))
        return d_gate.to(gate.dtype), (grad_f * silu).to(up.dtype)


def causal_mask(t: int, start: int, window: int | None = None) -> Tensor:
    """(T, start+T): query i sees keys <= start+i, and with a sliding window only those > start+i-window
    (transformers' sliding_window_overlay: kv_idx > q_idx - window)."""
    mask = torch.ones(t, start + t, dtype=torch.bool).tril(start)
    return mask if window is None else mask.triu(start - window + 1)


def _seen(mask: Tensor) -> Tensor:
    return mask | ~mask.any(-1, keepdim=True)  # a fully padded query row sees everything (its output is unused)


def cached_forward(net, projs: list[LayerProjs], ids: Tensor, pos: Tensor, cache: list[tuple[Tensor, Tensor]],
                   start: int, key_valid: Tensor) -> Tensor:
    """Run ids (N, T) at positions pos (N, T); write K/V at cache slots [start, start+T); return last hidden (N, H).

    cache holds per layer (K transposed (N, Hkv, D, S), V (N, Hkv, S, D)); key_valid (N, S) marks the slots
    that may be attended to (False for left padding). projs: the layers' projections (sampling_projections).
    """
    inner, arch = net.model, arch_of(net)
    n, t = ids.shape
    x = inner.embed_tokens(ids)  # (N, T, H)
    tables = rotary_tables(inner, arch, x, pos)  # (N, 1, T, R) each
    end = start + t
    masks = {w: _seen(key_valid[:, None, None, :end] & causal_mask(t, start, w)) for w in set(arch.window)}
    for i, layer in enumerate(inner.layers):
        attn, pj = layer.self_attn, projs[i]
        ln_attn, ln_attn_out, ln_mlp, ln_mlp_out = layer_norms(layer, arch)
        d = attn.head_dim
        nk = cache[i][0].shape[1] * d
        qkv = pj.qkv(rms_one(x, ln_attn, arch.norm_offset))
        nq = qkv.shape[-1] - 2 * nk
        table, off = tables.get(arch.rope[i]), arch.norm_offset
        q = _heads(qkv[..., :nq], n, t, d, table, attn.q_norm if arch.qk_norm else None, off)
        k = _heads(qkv[..., nq:nq + nk], n, t, d, table, attn.k_norm if arch.qk_norm else None, off)
        kc, vc = cache[i]
        kc[:, :, :, start:end] = k.transpose(-1, -2)
        vc[:, :, start:end] = qkv[..., nq + nk:].view(n, t, -1, d).transpose(1, 2)
        a = attention(q, kc[:, :, :, :end], vc[:, :, :end], masks[arch.window[i]], attn.scaling)
        x = x + post_norm(pj.o(a.transpose(1, 2).reshape(n, t, -1)), ln_attn_out, off)
        gate, up = pj.gate_up(rms_one(x, ln_mlp, off)).chunk(2, dim=-1)
        x = x + post_norm(pj.down(activation(layer.mlp)(gate) * up), ln_mlp_out, off)
    return rms(x[:, -1], inner.norm, arch.norm_offset)


class Prefix(NamedTuple):
    """A prompt pass kept for completions that run later (group_forward(prefix=...)): per layer the prompts' keys
    and values as attention takes them (after any q/k norm and the rotary embedding), (b, Hkv, P, D) each; the
    last prompt position's hidden state before the final norm (b, 1, H)."""

    kv: tuple[tuple[Tensor, Tensor], ...]
    last: Tensor

    def tensors(self) -> list[Tensor]:
        return [u for kv in self.kv for u in kv] + [self.last]

    def leaves(self) -> Prefix:
        """The same values as leaves of their own, which gather the gradients of the passes that use them."""
        def leaf(u: Tensor) -> Tensor:
            return u.detach().requires_grad_(u.requires_grad)
        return Prefix(tuple((leaf(k), leaf(v)) for k, v in self.kv), leaf(self.last))

    def backward(self, leaves: Prefix) -> None:
        """This pass's backward from the gradients its `leaves` gathered (none gathered: nothing to do)."""
        pairs = [(u, leaf.grad) for u, leaf in zip(self.tensors(), leaves.tensors(), strict=True)
                 if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([u for u, _ in pairs], [grad for _, grad in pairs])


def group_forward(model, prompt_ids: Tensor, prompt_valid: Tensor, comp_ids: Tensor, rows_per_prompt: int,
                  checkpointing: bool = False, prefix: Prefix | None = None) -> Tensor:
    """Hidden states that predict each completion token, with one prompt pass per group.

    prompt_ids/prompt_valid (b, P) left-padded; comp_ids (b*G, T) right-padded (padding is attended to
    by nothing that matters: it only follows the real tokens). Returns (b*G, T, H): row t predicts token t.
    Prompt and completion rows go through each projection as one matrix (bigger matmuls); only attention
    treats them apart. With `prefix` (prompt_forward's, of these prompts) the prompts are not run again: the
    completions attend to its keys and values, so a group split over micro-batches runs its prompt once.
    """
    return _forward(model, prompt_ids, prompt_valid, comp_ids, rows_per_prompt, checkpointing, prefix)[0]


def prompt_forward(model, prompt_ids: Tensor, prompt_valid: Tensor, checkpointing: bool = False) -> Prefix:
    """The prompts' pass alone (b, P left-padded), kept for group_forward(prefix=...)."""
    return _forward(model, prompt_ids, prompt_valid, prompt_ids.new_zeros(0, 0), 1, checkpointing, None)[1]


def _forward(model, prompt_ids: Tensor, prompt_valid: Tensor, comp_ids: Tensor, g: int, checkpointing: bool,
             prefix: Prefix | None) -> tuple[Tensor | None, Prefix]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner, arch = base.model, arch_of(base)
    run_prompts = prefix is None  # else the prompts' keys and values come from the prefix
    b, p = prompt_valid.shape
    n, t = comp_ids.shape
    split, off = (b * p if run_prompts else 0), arch.norm_offset
    p_pos = (prompt_valid.long().cumsum(-1) - 1).clamp(min=0)  # (b, P)
    c_pos = p_pos[:, -1:].repeat_interleave(g, 0) + 1 + torch.arange(t)  # (N, T)
    x = inner.embed_tokens(torch.cat([prompt_ids.reshape(-1)[:split], comp_ids.reshape(-1)]))  # (split + N*T, H)
    # one rotary call over all positions, as for a whole sequence in transformers (longrope's factors follow the
    # longest position of a call), split into prompt tables (b, 1, P, R) and completion tables (N, 1, T, R)
    tables = rotary_tables(inner, arch, x, torch.cat([p_pos.reshape(-1)[:split], c_pos.reshape(-1)])[None])
    tables_p = {k: tuple(u[0, 0, :split].reshape(-1, 1, p, u.shape[-1]) for u in cs) for k, cs in tables.items()}
    tables_c = {k: tuple(u[0, 0, split:].reshape(n, 1, t, u.shape[-1]) for u in cs) for k, cs in tables.items()}
    # keys of a completion row: its prompt's P slots, then its own T; slot P+i is completion token i
    rows = prompt_valid.repeat_interleave(g, 0)  # (b*G, P): none in a prompts-only pass (N = 0)
    valid_c = torch.cat([rows, torch.ones(len(rows), t, dtype=torch.bool)], dim=-1)[:n]
    masks = {w: (_seen(prompt_valid[:, None, None, :] & causal_mask(p, 0, w)) if run_prompts else None,  # (b,1,P,P)
                 valid_c[:, None, None, :] & causal_mask(t, p, w)) for w in set(arch.window)}  # (N, 1, T, P+T)

    def layer_fn(layer, x, i):
        attn, d = layer.self_attn, layer.self_attn.head_dim
        ln_attn, ln_attn_out, _, _ = layer_norms(layer, arch)
        q, k, v = _project(attn, rms(x, ln_attn, off), arch)
        qn, kn = (attn.q_norm, attn.k_norm) if arch.qk_norm else (None, None)
        tp, tc = tables_p.get(arch.rope[i]), tables_c.get(arch.rope[i])
        mask_p, mask_c = masks[arch.window[i]]
        parts = []
        if run_prompts:
            qp, kp = _heads(q[:split], b, p, d, tp, qn, off), _heads(k[:split], b, p, d, tp, kn, off)
            vp = v[:split].view(b, p, -1, d).transpose(1, 2)
            parts.append(attention(qp, kp.transpose(-1, -2), vp, mask_p, attn.scaling)  # (b, H, P, D)
                         .transpose(1, 2).reshape(split, -1))
        else:
            kp, vp = prefix.kv[i]
        if n:
            qc, kc = _heads(q[split:], n, t, d, tc, qn, off), _heads(k[split:], n, t, d, tc, kn, off)
            vc = v[split:].view(n, t, -1, d).transpose(1, 2)
            keys = torch.cat([kp.repeat_interleave(g, 0), kc], dim=2)  # (N, Hkv, P+T, D)
            values = torch.cat([vp.repeat_interleave(g, 0), vc], dim=2)
            parts.append(attention(qc, keys.transpose(-1, -2), values, mask_c, attn.scaling)  # (N, H, T, D)
                         .transpose(1, 2).reshape(n * t, -1))
        a = torch.cat(parts) if len(parts) > 1 else parts[0]
        x = _mlp(layer, x + post_norm(attn.o_proj(a), ln_attn_out, off), arch)
        return (x, kp, vp) if run_prompts else (x,)

    kv, checkpoint = [], checkpointing and torch.is_grad_enabled()
    for i, layer in enumerate(inner.layers):
        x, *pair = (torch.utils.checkpoint.checkpoint(layer_fn, layer, x, i, use_reentrant=False) if checkpoint
                    else layer_fn(layer, x, i))
        kv.append(tuple(pair))
    if run_prompts:
        prefix = Prefix(tuple(kv), x[:split].view(b, p, -1)[:, -1:])
    if not n:
        return None, prefix
    # the last prompt position predicts completion token 0; completion position t predicts token t+1
    last_p = prefix.last.repeat_interleave(g, 0)  # (N, 1, H)
    return rms(torch.cat([last_p, x[split:].view(n, t, -1)[:, :-1]], dim=1), inner.norm, off), prefix
