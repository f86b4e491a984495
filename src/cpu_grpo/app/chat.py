"""The Try tab's models: load a base model or a checkpoint once, answer a question greedily."""

from __future__ import annotations

import threading

_models: dict[str, tuple] = {}  # spec -> (model, tokenizer, sampler, eos ids), newest last
_lock = threading.Lock()  # one generation at a time: the CPU is shared with training anyway
KEEP = 2


def _get(spec: str) -> tuple:
    import torch

    from ..engine.models import bf16_supported, load_model
    from ..engine.sampler import Sampler, stop_ids

    if spec in _models:
        _models[spec] = _models.pop(spec)  # most recently used goes last
        return _models[spec]
    model, tok = load_model(spec, log=lambda *a: None)
    model.eval()
    sampler = Sampler(model, dtype=torch.bfloat16 if bf16_supported() else torch.float32)
    _models[spec] = (model, tok, sampler, stop_ids(tok, model))
    while len(_models) > KEEP:
        _models.pop(next(iter(_models)))
    return _models[spec]


def answer(spec: str, question: str, instruction: str = "", max_new_tokens: int = 256) -> str:
    """The model's greedy answer to one question, in the chat format training uses."""
    from ..engine.prompts import encode_prompts
    from ..engine.sampler import Sampling

    spec, question = (spec or "").strip(), (question or "").strip()
    if not spec or not question:
        return "Choose a model and write a question."
    with _lock:
        try:
            model, tok, sampler, stops = _get(spec)
        except (OSError, ValueError) as e:
            return f"Cannot load {spec}: {e}"
        prompts = encode_prompts(tok, [question], instruction)
        out = sampler.generate(prompts, 1, Sampling(int(max_new_tokens), stops, tok.pad_token_id, temperature=0.0))
    return tok.decode(out[0], skip_special_tokens=True)
