"""What each architecture's GGUF holds, as llama.cpp's convert_hf_to_gguf.py writes it (LlamaModel, SmolLM3Model,
Qwen2Model, Qwen3Model, Gemma3Model, Phi3MiniModel): the metadata keys, the tensor names (gguf's own name map, as the
converter's map_tensor_name uses), how a tensor is changed on the way, and the extra tensors rope scaling needs.

How each one departs from llama's file:
- qwen2, qwen3: no q/k permutation (llama.cpp rotates them in NeoX order); qwen3's attn_q_norm/attn_k_norm;
  key_length/value_length (qwen3's head_dim is not hidden / heads).
- smollm3: llama's file, permutation included; llama.cpp skips the rotary embedding on every fourth layer by a
  rule of its own (no key says so), so a model whose no_rope_layers differ from that rule is refused.
- gemma3: every norm stored as 1 + w (Gemma's RMSNorm scales by 1 + w), post_attention_norm and post_ffw_norm,
  attn_q_norm/attn_k_norm, sliding_window and the local rope base; llama.cpp fixes the layout (five sliding layers,
  then a global one), the local base (10000) and the query scale (head_dim^-0.5), so models that differ are refused.
  The embedding scale (sqrt(hidden)) is llama.cpp's own.
- phi3: attn_qkv and ffn_up (gate and up fused, as in the checkpoint: llama.cpp splits them at run time), no
  permutation, rope.dimension_count for a partial rotary, sliding_window (0: none), and longrope as
  rope_factors_long/rope_factors_short with rope.scaling.attn_factor.
- llama 3 rope scaling: a rope_freqs tensor (the divisor of each frequency); linear and yarn: rope.scaling.* keys.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import UserError

# model type -> llama.cpp's architecture name (mistral is written as llama, as the converter does)
ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
         "smollm3": "smollm3", "phi3": "phi3"}
PERMUTED = ("llama", "smollm3")  # LlamaModel.modify_tensors: q/k rows to llama.cpp's interleaved rotary order
ROPE_TYPES = {"llama": ("default", "linear", "yarn", "llama3"), "smollm3": ("default", "linear", "yarn", "llama3"),
              "qwen2": ("default", "linear", "yarn"), "qwen3": ("default", "linear", "yarn"),
              "gemma3": ("default", "linear"), "phi3": ("default", "longrope")}


class GGUFError(UserError):
    """A model or request the GGUF writer cannot handle; the message names what it can."""


def _refuse(what: str) -> GGUFError:
    return GGUFError(f"{what}: export --format hf and convert with llama.cpp's convert_hf_to_gguf.py.")


def rope_parameters(config) -> tuple[dict, dict | None]:
    """(the global layers' rope parameters, the sliding layers' or None), with rope_theta always set."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    full, local = params.get("full_attention", params), params.get("sliding_attention")
    full = {"rope_theta": float(getattr(config, "rope_theta", None) or 10000.0), **full}
    full["rope_type"] = full.get("rope_type") or full.get("type") or "default"
    return full, local


def original_context(config, rope: dict, default: int | None = None) -> int:
    """The context the rope scaling extends (the rope parameters' own first: transformers 5 keeps it there)."""
    return (rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
            or default or config.max_position_embeddings)


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check(config) -> None:
    """Refuse what llama.cpp would read as another model, in one sentence."""
    arch, n = ARCHS[config.model_type], config.num_hidden_layers
    rope, local = rope_parameters(config)
    if rope["rope_type"] not in ROPE_TYPES[arch]:
        raise _refuse(f"the model uses rope scaling '{rope['rope_type']}', which llama.cpp's converter does not write "
                      f"for {arch} (it writes {', '.join(ROPE_TYPES[arch])})")
    no_rope = getattr(config, "no_rope_layers", None)
    if arch == "smollm3" and no_rope is not None and list(no_rope) != [int((i + 1) % 4 != 0) for i in range(n)]:
        raise _refuse("the model's no_rope_layers are not llama.cpp's (no rotary embedding on every fourth layer)")
    if arch == "gemma3":
        types = list(getattr(config, "layer_types", None) or [])
        if types != ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]:
            raise _refuse("the model's layer_types are not llama.cpp's Gemma 3 layout (five sliding layers, then one "
                          "global)")
        local = local or {}
        if local.get("rope_theta", 10000.0) != 10000.0 or local.get("rope_type", "default") != "default":
            raise _refuse("the model's sliding layers use a rope other than llama.cpp's fixed one (base 10000)")
        if getattr(config, "attn_logit_softcapping", None):
            raise _refuse("the model caps attention logits, which Gemma 3 in llama.cpp does not")
        if getattr(config, "query_pre_attn_scalar", None) != head_dim(config):
            raise _refuse("the model scales queries by query_pre_attn_scalar, not head_dim, as llama.cpp does")
    factors = rope.get("long_factor") or ()
    if arch == "phi3" and rope["rope_type"] == "longrope" and len(factors) != rope_dims(config) // 2:
        raise _refuse("the model's longrope factors do not cover half its rotary dimensions")


def rope_dims(config) -> int:
    """phi3: int(partial_rotary_factor * hidden) // heads, as Phi3MiniModel computes it."""
    rope, _ = rope_parameters(config)
    factor = rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor", None) or 1.0
    return int(factor * config.hidden_size) // config.num_attention_heads


def _rope_scaling_keys(w, config, rope: dict) -> None:
    """TextModel.set_gguf_parameters: linear and yarn as keys (llama3 is the rope_freqs tensor)."""
    import gguf

    kind, factor = rope["rope_type"], rope.get("factor")
    if kind == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original_context(config, rope))
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rope.get(key) is not None:
                add(rope[key])


def add_hparams(w, config, arch: str, file_type, name: str) -> None:
    """The model's shape: TextModel.set_gguf_parameters and each model class's additions (Phi3MiniModel its own)."""
    rope, local = rope_parameters(config)
    n_kv = config.num_key_value_heads or config.num_attention_heads
    w.add_name(name)
    w.add_type("model")
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_file_type(file_type)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(original_context(config, rope))
        w.add_rope_dimension_count(rope_dims(config))
        w.add_sliding_window(getattr(config, "sliding_window", None) or 0)
        return
    _rope_scaling_keys(w, config, rope)
    if arch == "gemma3":
        w.add_rope_freq_base_swa((local or {}).get("rope_theta", 10000.0))
        if getattr(config, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)
    # the converter writes them when config.json has head_dim (qwen3, gemma3 always); llama.cpp's default otherwise
    if arch in ("qwen3", "gemma3") or head_dim(config) != config.hidden_size // config.num_attention_heads:
        w.add_key_length(head_dim(config))
        w.add_value_length(head_dim(config))
    if arch in PERMUTED:
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(head_dim(config))


def name_map(arch: str, n_layers: int):
    import gguf

    return gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), n_layers)


def gguf_name(hf_name: str, n_layers: int, arch: str = "llama") -> str | None:
    """The GGUF name of a Hugging Face tensor name, or None for tensors llama.cpp does not store."""
    return name_map(arch, n_layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))


def permute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: Hugging Face's rotate-half order of q/k rows to GGUF's interleaved one."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(name: str, data: np.ndarray, arch: str, config) -> np.ndarray:
    """One tensor as the converter's modify_tensors leaves it: q/k permuted (llama, smollm3), Gemma's norms + 1."""
    if arch in PERMUTED and ".attn_q." in name:
        return permute_rope(data, config.num_attention_heads)
    if arch in PERMUTED and ".attn_k." in name:
        return permute_rope(data, config.num_key_value_heads or config.num_attention_heads)
    if arch == "gemma3" and name.endswith("norm.weight"):
        return data + 1.0
    return data


def extra_tensors(w, config, arch: str) -> list[tuple[str, np.ndarray]]:
    """generate_extra_tensors: llama 3's rope_freqs (LlamaModel), phi3's longrope factors (and their attn_factor)."""
    rope, _ = rope_parameters(config)
    if rope["rope_type"] == "llama3":
        dim, factor = head_dim(config), rope.get("factor", 8.0)
        low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
        old = original_context(config, rope, 8192)
        freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factors = []
        for freq in freqs:
            wavelen = 2 * math.pi / freq
            if wavelen < old / high:
                factors.append(1.0)
            elif wavelen > old / low:
                factors.append(factor)
            else:
                smooth = (old / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return [("rope_freqs.weight", np.array(factors, dtype=np.float32))]
    if arch == "phi3" and rope["rope_type"] == "longrope":
        orig = original_context(config, rope)
        scale = config.max_position_embeddings / orig  # the converter's formula, unless the config states the factor
        attn = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
        w.add_rope_scaling_attn_factors(rope.get("attention_factor") or attn)
        return [("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32)),
                ("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))]
    return []


# what transformers' GGUF loader must read back as the checkpoint has it, or it computes another model
SHAPE = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads", "head_dim", "rope_parameters", "query_pre_attn_scalar", "sliding_window", "layer_types",
         "no_rope_layers", "final_logit_softcapping", "tie_word_embeddings", "vocab_size")


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and abs(a - b) <= 1e-6 * abs(a)
    return a == b


def _effective(config, key: str):
    """The value a model runs with: a head_dim left out is hidden_size / num_attention_heads (a field that defaults
    to the same value is no difference)."""
    value = getattr(config, key, None)
    if key == "head_dim" and value is None and getattr(config, "num_attention_heads", None):
        return config.hidden_size // config.num_attention_heads
    return value


def misread(config, out: Path, name: str) -> str | None:
    """Why transformers' GGUF loader would not give back this model from the file (None: it does): an architecture it
    does not read (smollm3), or a setting it leaves at its default (rope scaling, a partial rotary, ...)."""
    from transformers import AutoConfig

    try:
        back = AutoConfig.from_pretrained(out, gguf_file=name)
    except ValueError:
        return f"transformers' GGUF loader does not read the architecture {config.model_type}"
    for key in SHAPE:
        mine, theirs = _effective(config, key), _effective(back, key)
        if hasattr(config, key) and not _same(mine, theirs):
            return f"transformers' GGUF loader reads its {key} as {theirs!r}, not {mine!r}"
    return None
