"""A Hugging Face causal LM written as one GGUF file, in pure Python: llama (and mistral, written as llama),
qwen2, qwen3, gemma3_text, smollm3 and phi3, the fast path's architectures (engine/arch.py).

Tensor names, metadata keys and the tokenizer fields follow llama.cpp's convert_hf_to_gguf.py; what differs per
architecture (permuted q/k, Gemma's norms, fused phi3 tensors, rope scaling) is in gguf_arch.py. Norms and biases
stay F32; a tied output head is not written (llama.cpp reuses token_embd). Quantizations: bf16, f16, q8_0 and q4_0
by the `gguf` package (q4_0 keeps token_embd and output in q8_0, as llama-quantize keeps them above 4 bits), and
q4_k_m with llama-quantize's choice of type per tensor (Q6_K for the output head and for attn_v and ffn_down of
some layers, Q4_K elsewhere; rows whose length is not a multiple of 256 fall back to Q8_0 and Q5_0 as llama.cpp
does) and Q4_K/Q6_K blocks from kquants.py, since the package cannot write K-quants.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..engine.progress import ProgressLines
from . import gguf_arch
from .gguf_arch import ARCHS, GGUFError, gguf_name, permute_rope  # noqa: F401  (the writer's public names)

QUANTS = ("bf16", "f16", "q8_0", "q4_k_m", "q4_0")
UNAVAILABLE = {k: "the other K-quant mixes are not written here" for k in ("q4_k_s", "q5_k_m", "q5_k_s", "q6_k",
                                                                            "q3_k_m", "q2_k")}


def check_request(model_type: str, quant: str) -> None:
    """Refuse an architecture or a quantization this writer cannot do, naming those it can."""
    if model_type not in ARCHS:
        raise GGUFError(f"the GGUF writer does not know the architecture '{model_type}': it writes "
                        f"{', '.join(ARCHS)}; export --format hf instead and convert with llama.cpp's "
                        "convert_hf_to_gguf.py.")
    if quant not in QUANTS:
        why = UNAVAILABLE.get(quant, "it is not a quantization this writer knows")
        raise GGUFError(f"cannot write --quant {quant} ({why}): choose one of {', '.join(QUANTS)}, or write bf16 "
                        "and run llama.cpp's llama-quantize on it.")
    if quant == "q4_k_m" and ARCHS[model_type] == "phi3":
        raise GGUFError("cannot write --quant q4_k_m of a phi3 model (llama-quantize makes its fused attn_qkv Q5_K, "
                        "which this writer cannot make): write bf16 and run llama.cpp's llama-quantize on it.")


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers and every third one between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _q4_k_m(name: str, n_layers: int, tied: bool):
    from gguf import GGMLQuantizationType as T

    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return T.Q6_K
    if name.endswith((".attn_v.weight", ".ffn_down.weight")) and more_bits(int(name.split(".")[1]), n_layers):
        return T.Q6_K
    return T.Q4_K


def tensor_type(name: str, data: np.ndarray, quant: str, n_layers: int = 0, tied: bool = False):
    """The GGML type of one tensor under `quant`: 1-D tensors F32; rows that do not fit the block size fall back
    (Q4_K to Q5_0, Q6_K to Q8_0, as llama-quantize does; anything else to F16)."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as T

    if data.ndim < 2:
        return T.F32
    if quant == "q4_k_m":
        wanted = _q4_k_m(name, n_layers, tied)
    else:
        wanted = {"bf16": T.BF16, "f16": T.F16, "q8_0": T.Q8_0, "q4_0": T.Q4_0}[quant]
    if quant == "q4_0" and name in ("token_embd.weight", "output.weight"):
        wanted = T.Q8_0
    if data.shape[-1] % GGML_QUANT_SIZES[wanted][0]:
        wanted = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}.get(wanted, T.F16)
    return wanted if data.shape[-1] % GGML_QUANT_SIZES[wanted][0] == 0 else T.F16


def quantize(data: np.ndarray, qtype) -> np.ndarray:
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    from . import kquants

    if qtype == T.Q4_K:
        return kquants.quantize_q4_k(data)
    if qtype == T.Q6_K:
        return kquants.quantize_q6_k(data)
    return quants.quantize(data, qtype)


def file_type(quant: str):
    from gguf import LlamaFileType as F

    return {"bf16": F.MOSTLY_BF16, "f16": F.MOSTLY_F16, "q8_0": F.MOSTLY_Q8_0, "q4_0": F.MOSTLY_Q4_0,
            "q4_k_m": F.MOSTLY_Q4_K_M}[quant]


def pre_tokenizer_name(tok_json: dict) -> str:
    """llama.cpp's name for the pre-tokenizer (tokenizer.ggml.pre): the one its get_vocab_base_pre finds by hash for
    these families, told here by the split the tokenizer makes (a fine-tune keeps it; a hash needs the exact vocab)."""
    text = json.dumps(tok_json.get("pre_tokenizer") or {})
    if '"individual_digits": true' in text:
        return "smollm"  # SmolLM/SmolLM2: digits split one by one, then GPT-2's byte level
    if "\\\\p{Lu}\\\\p{Lt}" in text:
        return "gpt-4o"  # o200k's split (Phi-4-mini)
    if "\\\\p{N}{1,3}" in text:
        return "llama-bpe"  # Llama 3's split (SmolLM3 too)
    if "\\\\p{L}+|\\\\p{N}|" in text:
        return "qwen2"  # Qwen2.5's and Qwen3's: digits one by one
    return "gpt-2"  # GPT-2's byte-level split (llama.cpp's name; "gpt2" is the tokenizer model)


def add_tokenizer(w, tok, tok_dir: Path, vocab_size: int, template: str | None) -> None:
    """Vocabulary, token types, merges, special tokens and the chat template (convert_hf_to_gguf's _set_vocab_gpt2)."""
    import gguf

    # the tokenizer as the run used it (its class may impose a split of its own: Qwen2Tokenizer), else its file
    tok_json_path = Path(tok_dir) / "tokenizer.json"
    backend = getattr(tok, "backend_tokenizer", None)
    tok_json = json.loads(backend.to_str()) if backend is not None else \
        json.loads(tok_json_path.read_text()) if tok_json_path.exists() else {}
    byte_level = "ByteLevel" in json.dumps(tok_json.get("pre_tokenizer"))
    if (tok_json.get("model") or {}).get("type") != "BPE" or not byte_level:
        raise GGUFError("the GGUF writer knows byte-level BPE tokenizers (GPT-2 style: SmolLM2, Qwen2.5, Llama 3) and "
                        "this model has another kind (SentencePiece: Gemma 3, Phi-3): export --format hf and convert "
                        "with llama.cpp.")
    reverse = {i: t for t, i in tok.get_vocab().items()}
    added = {i: a for i, a in tok.added_tokens_decoder.items()}
    tokens, types = [], []
    for i in range(max(vocab_size, len(reverse))):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_tokenizer_name(tok_json))
    w.add_token_list(tokens)
    w.add_token_types(types)
    special = gguf.SpecialVocab(tok_dir, load_merges=True, n_vocab=len(tokens))
    special.chat_template = template
    # prompts were encoded without special tokens added (prompts.encode_prompts): say so, or llama.cpp adds a BOS
    special.add_special_token = {"bos": False}
    for kind in ("bos", "eos", "pad"):  # the ids the run used (its tokenizer's), whatever tokenizer.json says
        if getattr(tok, f"{kind}_token_id", None) is not None:
            special.special_token_ids[kind] = getattr(tok, f"{kind}_token_id")
    special.add_to_gguf(w)


def _array(t) -> np.ndarray:
    import torch

    return t.detach().to(torch.float32).cpu().numpy()


def add_tensors(w, model, quant: str, log=print) -> dict[str, int]:
    """Every tensor llama.cpp needs, converted and quantized (rope scaling's extra tensors first, as the converter
    writes them); returns how many tensors of each GGML type."""
    config = model.config
    arch, n = ARCHS[config.model_type], config.num_hidden_layers
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors = gguf_arch.extra_tensors(w, config, arch)
    for hf_name, tensor in model.state_dict().items():
        name = gguf_name(hf_name, n, arch)
        if name is None and not hf_name.endswith("rotary_emb.inv_freq"):
            raise GGUFError(f"the GGUF writer does not know the tensor {hf_name}: export --format hf instead.")
        if name is not None and not (tied and name == "output.weight"):
            tensors.append((name, gguf_arch.convert(name, _array(tensor), arch, config)))
    counts: dict[str, int] = {}
    tick = ProgressLines(log, f"  writing {quant}", "tensor", "tensors/s")  # a 0.5B in q4_k_m: minutes
    for i, (name, data) in enumerate(tensors):
        qtype = tensor_type(name, data, quant, n, tied)
        w.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
        tick(i + 1, len(tensors))
    tick.end()
    return counts


def write(model, tok, tok_dir: Path, path: Path, quant: str, name: str, template: str | None,
          log=print) -> dict[str, int]:
    """Write `model` (a merged, plain transformers model) and its tokenizer to the GGUF file `path`."""
    import gguf

    config = model.config
    check_request(config.model_type, quant)
    gguf_arch.check(config)
    arch = ARCHS[config.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    gguf_arch.add_hparams(w, config, arch, file_type(quant), name)
    w.add_quantization_version(2)
    add_tokenizer(w, tok, tok_dir, config.vocab_size, template)
    counts = add_tensors(w, model, quant, log)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts
