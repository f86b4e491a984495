"""One sampled token for every live row of a rollout (sampler.py): each prompt's keys and values kept once in a
PrefixCache and shared by the G rows of its group (shared-prefix attention), with the fused q/k/v and gate/up
projections of projections.sampling_projections. The prefill that fills the cache is llama.cached_forward."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .arch import activation, apply_rope, arch_of, layer_norms, post_norm, rms, rms_one, rotary_tables
from .projections import LayerProjs


class PrefixCache:
    """KV cache of a rollout: each prompt's keys/values once (b rows), each sample's own tokens (N = b*G rows).

    kp (b, Hkv, D, P) keys transposed and vp (b, Hkv, P, D) per layer, from the prefill; kc (N, Hkv, D, T)
    and vc (N, Hkv, T, D) per layer for the generated tokens. `rows` are the live samples (indices into N):
    finished ones are dropped from kc/vc, never from the shared prompt part.
    """

    def __init__(self, prompt_cache, prompt_valid: Tensor, rows_per_prompt: int, max_new: int):
        self.prompt = prompt_cache
        b, g = prompt_valid.shape[0], rows_per_prompt
        self.b, self.g = b, g
        kp, vp = prompt_cache[0]
        hkv, d = kp.shape[1], kp.shape[2]
        self.comp = [(torch.zeros(b * g, hkv, d, max_new, dtype=kp.dtype),  # zeros: unwritten slots stay finite
                      torch.zeros(b * g, hkv, max_new, d, dtype=vp.dtype)) for _ in prompt_cache]
        self.bias_p = torch.zeros(prompt_valid.shape).masked_fill_(~prompt_valid, -math.inf)  # (b, P)
        self.rows = torch.arange(b * g)

    def keep(self, keep: Tensor) -> None:
        self.rows = self.rows[keep]
        for i, (k, v) in enumerate(self.comp):  # layer by layer: one layer's old copy alive at a time, not all
            self.comp[i] = (k[keep], v[keep])


def decode_step(net, projs: list[LayerProjs], cache: PrefixCache, tok: Tensor, pos: Tensor, t: int) -> Tensor:
    """Feed tok (n,) at positions pos (n,) as generated token t of every live row; return last hidden (n, H)."""
    inner, arch = net.model, arch_of(net)
    n = tok.shape[0]
    rows, b, g = cache.rows, cache.b, cache.g
    full = n == b * g
    x = inner.embed_tokens(tok)  # (n, H)
    tables = rotary_tables(inner, arch, x, pos[:, None])  # (n, 1, 1, R) each
    t_max = cache.comp[0][1].shape[2]
    own = torch.zeros(t_max).masked_fill_(torch.arange(t_max) > t, -math.inf)  # slots written so far: 0..t
    bias = torch.cat([cache.bias_p[rows // g], own.expand(n, t_max)], dim=-1)[:, None, None]  # (n, 1, 1, P+T)
    biases = {w: bias if w is None else _window_bias(bias, cache.bias_p.shape[1] + t, w) for w in set(arch.window)}
    off = arch.norm_offset
    for i, layer in enumerate(inner.layers):
        attn, pj = layer.self_attn, projs[i]
        ln_attn, ln_attn_out, ln_mlp, ln_mlp_out = layer_norms(layer, arch)
        d, hkv = attn.head_dim, cache.prompt[i][0].shape[1]
        qkv = pj.qkv(rms_one(x, ln_attn, off))
        nk = hkv * d
        nq = qkv.shape[1] - 2 * nk
        qk = qkv[:, :nq + nk].view(n, -1, 1, d)  # q and k heads, normalised and rotated together
        if arch.qk_norm:
            qk = torch.cat([rms(qk[:, :nq // d], attn.q_norm, off), rms(qk[:, nq // d:], attn.k_norm, off)], 1)
        table = tables.get(arch.rope[i])
        qk = qk if table is None else apply_rope(qk, *table)
        q, k = qk[:, :nq // d].view(n, hkv, -1, d), qk[:, nq // d:, 0]  # (n, Hkv, rep, D), (n, Hkv, D)
        kc, vc = cache.comp[i]
        kc[:, :, :, t] = k
        vc[:, :, t] = qkv[:, nq + nk:].view(n, hkv, d)
        a = _shared_prefix_attention(q, cache.prompt[i], kc, vc, biases[arch.window[i]], attn.scaling,
                                     rows, b, g, full)
        x = x + post_norm(pj.o(a.reshape(n, -1)), ln_attn_out, off)
        gate, up = pj.gate_up(rms_one(x, ln_mlp, off)).chunk(2, dim=-1)
        x = x + post_norm(pj.down(activation(layer.mlp)(gate) * up), ln_mlp_out, off)
    return rms(x, inner.norm, off)


def _window_bias(bias: Tensor, slot: int, window: int) -> Tensor:
    """The decode bias (n, 1, 1, P+T) of a sliding-window layer: the query sits at slot P+t (the prompt's P slots,
    then the row's own) and sees only the slots after slot - window (slots and positions differ by the row's
    left padding alone, so distances are the same)."""
    return bias.clone().index_fill_(-1, torch.arange(max(0, min(slot - window + 1, bias.shape[-1]))), -math.inf)


def _shared_prefix_attention(q, prompt_kv, kc, vc, bias, scale, rows, b, g, full):
    """q (n, Hkv, rep, D) of the live rows -> (n, Hkv, rep, D), over their prompt's keys and their own.

    The prompt part runs per group: the G rows' queries stacked as one (G*rep)-row matmul against the prompt's
    keys, which are read once per group instead of once per row.
    """
    kp, vp = prompt_kv
    n, hkv, rep, d = q.shape
    if full:
        qf = q
    else:  # dead rows get zero queries; their scores are computed and thrown away
        qf = q.new_zeros(b * g, hkv, rep, d)
        qf[rows] = q
    qg = qf.view(b, g, hkv, rep, d).transpose(1, 2).reshape(b, hkv, g * rep, d)
    sp = (qg @ kp).view(b, hkv, g, rep, -1).transpose(1, 2).reshape(b * g, hkv, rep, -1)  # (b*G, Hkv, rep, P)
    if not full:
        sp = sp[rows]
    p_len = sp.shape[-1]
    probs = (torch.cat([sp, q @ kc], dim=-1).float() * scale + bias).softmax(-1).to(q.dtype)
    pp, pc = probs[..., :p_len], probs[..., p_len:]
    if not full:
        ppf = pp.new_zeros(b * g, hkv, rep, p_len)
        ppf[rows] = pp
        pp = ppf
    ap = (pp.view(b, g, hkv, rep, p_len).transpose(1, 2).reshape(b, hkv, g * rep, p_len) @ vp)
    ap = ap.view(b, hkv, g, rep, d).transpose(1, 2).reshape(b * g, hkv, rep, d)
    return (ap if full else ap[rows]) + pc @ vc
