"""What each architecture on the fast path (llama.py) does differently, as a small record read off its config and
modules, and the pieces that depend on it: RMSNorm (plain or Gemma's (1 + w)) and the rotary embedding (full or
partial, one table or one per layer type, or none).

How each one departs from Llama, as transformers 5 implements it (models/*/modeling_*.py):
- qwen2: biases on q/k/v; optional sliding window on the layers past max_window_layers.
- mistral: a sliding window on every layer when config.sliding_window is set.
- qwen3: a per-head RMSNorm on q and k before the rotary embedding; optional sliding layers as qwen2.
- gemma3_text: (1 + w) RMSNorms in fp32, four per layer (after attention and after the MLP too), q/k norms,
  embeddings scaled by sqrt(hidden), GELU-tanh gate, query scaling query_pre_attn_scalar^-0.5, sliding-window
  layers between global ones, each kind with its own rotary table (local theta 10k, global 1M and its scaling).
- smollm3: no rotary embedding on the layers no_rope_layers marks 0 (every fourth).
- phi3: q/k/v and gate/up as one module each, partial rotary, longrope scaling, optional sliding window.
- llama (3.x): llama3 rope scaling and tied embeddings; yarn and longrope where a config asks: all inside the
  model's rotary module, whose tables are used as they are.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

ARCHS = ("llama", "qwen2", "mistral", "qwen3", "gemma3_text", "smollm3", "phi3")


class Arch(NamedTuple):
    """What an architecture does differently from Llama. The rest is read off its modules as they are called: the
    activation (`act_fn`: SiLU, Gemma's GELU-tanh), Gemma's embedding scale (inside its embedding module), the
    query scaling (`self_attn.scaling`: Gemma's query_pre_attn_scalar), and the rotary embedding's frequencies and
    scaling (the model's `rotary_emb`: llama3, yarn, longrope, dynamic; a partial rotary gives tables shorter than
    the head, and the rest of the head passes through)."""

    norm_offset: float  # RMSNorm scales by (offset + w): 1 for Gemma, 0 elsewhere
    qk_norm: bool  # a per-head RMSNorm on q and k before the rotary embedding (qwen3, gemma3_text)
    sandwich: bool  # norms on the attention's and the MLP's outputs too (gemma3_text)
    fused: bool  # q/k/v and gate/up come as one module each (phi3's qkv_proj, gate_up_proj)
    rope: tuple[str | None, ...]  # per layer: its rotary table ("": the model's; Gemma: its layer type); None: none
    window: tuple[int | None, ...]  # per layer: sliding window (attends to the last `window` positions); None: all


class Dims(NamedTuple):
    """A decoder's sizes, under whatever names its config uses."""

    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    ffn: int  # the MLP's inner width
    layers: int


def dims(cfg) -> Dims:
    """The sizes of any causal LM's config: Llama's names, GPT-2's (n_inner, 4 x hidden when unset; no grouped
    key-value heads) and Gemma 3's head_dim, which is not hidden / heads.

    >>> from transformers import GPT2Config
    >>> dims(GPT2Config(n_embd=64, n_head=4, n_layer=2))
    Dims(hidden=64, heads=4, head_dim=16, kv_heads=4, ffn=256, layers=2)
    """
    h, heads = cfg.hidden_size, cfg.num_attention_heads
    ffn = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * h
    return Dims(h, heads, getattr(cfg, "head_dim", None) or h // heads,
                getattr(cfg, "num_key_value_heads", None) or heads, ffn, cfg.num_hidden_layers)


def arch_of(net) -> Arch:
    """The Arch of a causal LM (or its peft wrapper) of one of ARCHS, as transformers builds it from the config."""
    base = net.get_base_model() if hasattr(net, "get_base_model") else net
    cfg, layers = base.config, base.model.layers
    n = len(layers)
    types = getattr(cfg, "layer_types", None)
    w = getattr(cfg, "sliding_window", None)  # mistral, phi3: every layer; others: the layers typed sliding
    window = tuple(w if w and (types is None or types[i] == "sliding_attention") else None for i in range(n))
    per_type = hasattr(base.model.rotary_emb, "layer_types")  # Gemma 3: local and global tables
    no_rope = getattr(cfg, "no_rope_layers", None)  # SmolLM3: 0 marks a layer without rotary embedding
    rope = tuple(None if no_rope is not None and not no_rope[i] else (types[i] if per_type else "") for i in range(n))
    return Arch(norm_offset=1.0 if cfg.model_type == "gemma3_text" else 0.0,
                qk_norm=hasattr(layers[0].self_attn, "q_norm"),
                sandwich=hasattr(layers[0], "pre_feedforward_layernorm"),
                fused=hasattr(layers[0].self_attn, "qkv_proj"), rope=rope, window=window)


def supports_config(cfg) -> bool:
    """Whether the fast forward computes what transformers computes for this config (else: the generic path)."""
    return (getattr(cfg, "model_type", "") in ARCHS
            and not getattr(cfg, "final_logit_softcapping", None) and not getattr(cfg, "attn_logit_softcapping", None)
            and not getattr(cfg, "use_bidirectional_attention", False)
            and set(getattr(cfg, "layer_types", None) or ()) <= {"full_attention", "sliding_attention"})


def supports(model) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return supports_config(base.config) and hasattr(base, "model") and hasattr(base.model, "rotary_emb")


# the generic path against the fast one (bench/architectures.py; bench/README.md, "Architectures on the fast
# path"): rollout tokens/s and update seconds, the median over its five architectures (2 layers at real width)
GENERIC_SLOWDOWN = {"rollout": 7.1, "update": 1.19, "measured": "bench/architectures.py, 2026-11-27, alone"}


def generic_path_note(cfg) -> str | None:
    """One line for a run's start when its model is off the fast path (None when it is on it)."""
    if supports_config(cfg):
        return None
    g = GENERIC_SLOWDOWN
    return (f"note: '{getattr(cfg, 'model_type', '?')}' is not on the fast path ({', '.join(ARCHS)}): sampling and "
            f"training run through the generic transformers forward, measured {g['rollout']:.1f}x slower in rollouts "
            f"and {g['update']:.1f}x in updates on the fast path's architectures ({g['measured']}).")


def norm_eps(norm) -> float:
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def rms(x: Tensor, norm, offset: float = 0.0) -> Tensor:
    if offset:  # Gemma: normalised and scaled by (1 + w) in fp32, then x's dtype
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=norm_eps(norm)) * (offset + norm.weight.float())).to(x.dtype)
    return F.rms_norm(x.float(), (x.shape[-1],), eps=norm_eps(norm)).to(x.dtype) * norm.weight


def rms_one(x: Tensor, norm, offset: float = 0.0) -> Tensor:
    """RMSNorm as one fused call (fp32 inside): for sampling, where every op of a decode step counts."""
    if offset:
        return rms(x, norm, offset)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm_eps(norm))


def layer_norms(layer, arch: Arch) -> tuple:
    """A layer's norms: (before attention, after attention or None, before the MLP, after the MLP or None)."""
    if arch.sandwich:
        return (layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                layer.post_feedforward_layernorm)
    return layer.input_layernorm, None, layer.post_attention_layernorm, None


def post_norm(y: Tensor, norm, offset: float) -> Tensor:
    """A sublayer's output, normalised where the architecture has a norm there (gemma3_text)."""
    return y if norm is None else rms(y, norm, offset)


def activation(mlp):
    """The MLP's gate activation module (phi3 names it activation_fn)."""
    return mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn


def _rope_table(rotary, x: Tensor, pos: Tensor, key: str = "") -> tuple[Tensor, Tensor]:
    """cos and a sign-folded sin, (N, 1, T, R): rotate_half(x) * sin == swap_halves(x) * signed_sin."""
    cos, sin = rotary(x, pos, key) if key else rotary(x, pos)
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def rotary_tables(inner, arch: Arch, x: Tensor, pos: Tensor) -> dict:
    """The rotary tables the layers use, each computed once: key -> (cos, signed sin)."""
    return {key: _rope_table(inner.rotary_emb, x, pos, key) for key in set(arch.rope) - {None}}


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:  # x (N, H, T, D), tables (N, 1, T, R), R <= D
    r = cos.shape[-1]
    if r < x.shape[-1]:  # partial rotary (phi3): the first R dimensions rotate, the rest pass through
        return torch.cat((apply_rope(x[..., :r], cos, signed_sin), x[..., r:]), dim=-1)
    half = r // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * signed_sin
