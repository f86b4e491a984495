"""A reward model as a reward function (TRL's `reward_funcs=["path/to/reward-model"]`): a sequence classifier with
one label scores each prompt with its completion, the chat ones through its own chat template, as TRL scores them."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import RewardError


def is_reward_model(spec: str) -> bool:
    """Whether `spec` names a model directory (a reward model, if it is a sequence classifier)."""
    return Path(spec).expanduser().is_dir() and (Path(spec).expanduser() / "config.json").is_file()


class RewardModel:
    """`fn(completions, prompts) -> scores`: the classifier's logit for prompt + completion (TRL's reward model)."""

    def __init__(self, path: str):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        config = json.loads((Path(path).expanduser() / "config.json").read_text())
        kinds = config.get("architectures") or ["none given"]
        if not any(k.endswith("ForSequenceClassification") for k in kinds) or config.get("num_labels", 1) != 1 and \
                len(config.get("id2label") or {0: 0}) != 1:
            raise RewardError(f"reward {path}: a model directory is read as a reward model, and this one is a "
                              f"{', '.join(kinds)}: give a sequence classifier with one label "
                              "(AutoModelForSequenceClassification, num_labels=1), or a reward function.")
        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
        self.tok = AutoTokenizer.from_pretrained(path)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.__name__ = Path(path).expanduser().resolve().name

    def __call__(self, completions, prompts, **kwargs) -> list[float]:
        import torch

        texts = [self.tok.apply_chat_template(p + c, tokenize=False) if isinstance(p, list) else p + c
                 for p, c in zip(prompts, completions, strict=True)]
        enc = self.tok(texts, padding=True, padding_side="right", add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            return self.model(**enc).logits[:, 0].float().tolist()
