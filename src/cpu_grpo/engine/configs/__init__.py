"""The configs the model aliases convert to, shipped with the package (NAME.json beside this file), so that a plan
needs no download (`cpu-grpo plan`)."""

from __future__ import annotations

import json
from pathlib import Path


def shipped_config(name: str):
    """The transformers config of alias `name`'s model as its fetch makes it; None for an alias without one."""
    from transformers import AutoConfig

    path = Path(__file__).with_name(f"{name}.json")
    if not path.exists():
        return None
    values = json.loads(path.read_text())
    return AutoConfig.for_model(values.pop("model_type"), **values)


def fetched(name: str) -> bool:
    """Whether alias `name`'s model is on this machine already (converted in the cache, or in the hub's cache)."""
    from ..models import ALIASES, cache_dir, hub_cache_hit

    return (cache_dir() / "models" / name / "config.json").exists() or hub_cache_hit(ALIASES[name].hub_id) is not None
