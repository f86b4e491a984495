"""Hugging Face exports: a full model (any LoRA merged) that plain transformers loads, or a PEFT adapter.

Both carry the tokenizer with a chat template that appends the run's instruction to the user's message (prompt.py),
and a generation config whose end tokens are the run's. No file refers to cpu-grpo: `from_pretrained(dir)` and
`PeftModel.from_pretrained(base, dir)` need only transformers and peft.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import UserError

DTYPES = ("f32", "bf16", "f16")


def torch_dtype(quant: str):
    import torch

    if quant not in DTYPES:
        raise UserError(f"--format hf writes weights as {', '.join(DTYPES)}, not {quant}: quantized files are "
                        "--format gguf (bf16, f16, q8_0, q4_k_m, q4_0).")
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[quant]


def generation_config(model, tok, stops: tuple[int, ...]):
    """The run's end tokens, so that `generate` stops where training's rollouts stopped; greedy, as evaluated."""
    from transformers import GenerationConfig

    gen = GenerationConfig.from_model_config(model.config)
    gen.eos_token_id = list(stops) if len(stops) > 1 else stops[0]
    gen.pad_token_id = tok.pad_token_id
    gen.bos_token_id = tok.bos_token_id
    gen.do_sample = False
    return gen


def write_full(model, tok, out: Path, quant: str, template: str | None, stops: tuple[int, ...]) -> None:
    """The merged model in `quant` (f32: unchanged), its tokenizer and generation config, into `out`."""
    dtype = torch_dtype(quant)
    state = {k: v.to(dtype) for k, v in model.state_dict().items()}  # the model in memory stays as it is
    model.config.use_cache = True  # load_model turns it off for training
    old_dtype, model.config.dtype = model.config.dtype, dtype
    model.generation_config = generation_config(model, tok, stops)
    try:
        model.save_pretrained(out, state_dict=state, safe_serialization=True)
    finally:
        model.config.dtype = old_dtype
    _save_tokenizer(tok, out, template)


def write_adapter(ckpt: Path, tok, out: Path, base: str, template: str | None) -> None:
    """The checkpoint's LoRA adapter as PEFT writes it, its base named `base` (a hub id or a directory)."""
    files = ("adapter_config.json", "adapter_model.safetensors")
    if not (ckpt / files[0]).exists():
        raise UserError(f"checkpoint {ckpt} is a full fine-tune, not LoRA: it has no adapter to export. Use "
                        "--format hf (the whole model) or gguf.")
    for name in files:
        shutil.copy2(ckpt / name, out / name)
    cfg = json.loads((out / files[0]).read_text())
    cfg["base_model_name_or_path"] = base
    cfg["inference_mode"] = True
    (out / files[0]).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    _save_tokenizer(tok, out, template)


def _save_tokenizer(tok, out: Path, template: str | None) -> None:
    old = tok.chat_template
    tok.chat_template = template if template is not None else old
    try:
        tok.save_pretrained(out)
    finally:
        tok.chat_template = old
