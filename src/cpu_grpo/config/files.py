"""Config files: YAML (safe, a key set twice refused, size and alias bombs refused) or JSON, read into a dict of
field overrides, and a value of either (or of a --flag) read as its field's type (`coerce`). This module must
not import torch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..errors import ConfigError

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few KB
MAX_CONFIG_NODES = 100_000  # values once every alias is expanded (a 286-byte alias bomb expands to billions)


def _expanded(node, sizes: dict) -> int:
    """How many values `node` stands for once every alias is expanded (aliases share their node); a node that
    holds itself counts as too many."""
    import yaml

    key = id(node)
    if key in sizes:
        return sizes[key]
    sizes[key] = MAX_CONFIG_NODES + 1  # while counting: a node reached again inside itself is a loop
    children = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else \
        node.value if isinstance(node, yaml.SequenceNode) else []
    total = 1
    for child in children:
        total += _expanded(child, sizes)
        if total > MAX_CONFIG_NODES:
            break
    sizes[key] = total
    return total


def load_yaml(text: str, path: Path):
    """YAML as yaml.safe_load reads it, except that a key set twice in one mapping is an error (YAML would keep
    the last one without a word), and that a file over 1 MB or over 100,000 values once its aliases are expanded
    is refused before anything is built."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError(f"{path}: {key} is set twice (lines {seen[key] + 1} and "
                                      f"{key_node.start_mark.line + 1}): delete the one you did not mean.")
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {len(text):,} characters, and a config file is a few KB (at most "
                          f"{MAX_CONFIG_BYTES:,}): give the file of fields, not data.")
    loader = Loader(text)  # a SafeLoader: plain data only
    try:
        node = loader.get_single_node()
        if node is not None and _expanded(node, {}) > MAX_CONFIG_NODES:
            raise ConfigError(f"{path}: its aliases (*name) expand to over {MAX_CONFIG_NODES:,} values, or refer to "
                              "themselves: write the values out.")
        return None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()


def load_file(path: str | Path) -> dict:
    """Read a YAML or JSON config file into a dict of field overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}: check the path.")
    text = path.read_text()
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = load_yaml(text, path)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{path}: cannot parse it ({str(e).splitlines()[0]}): fix the syntax.") from None
    if not isinstance(data, dict | None):  # an empty file is no overrides
        raise ConfigError(f"{path}: expected a mapping of field: value at the top level.")
    return data or {}


def coerce(f: dataclasses.Field, value):
    """Turn a CLI string or YAML value into the field's type, with a clear error."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if value is None:
        raise ConfigError(f"{f.name} has no value: give one, or remove the key to use the default.")
    if kind in ("int", "float") and isinstance(value, bool) or kind == "int" and isinstance(value, float):
        raise ConfigError(f"{f.name}: cannot read {value!r} as {kind}.")
    try:
        if kind.startswith("list"):
            items = value.split(",") if isinstance(value, str) else list(value)
            if f.name == "stages":  # names, name:steps, or YAML mappings (checked by parse_stage)
                return [x.strip() if isinstance(x, str) else x for x in items if not isinstance(x, str) or x.strip()]
            inner = float if "float" in kind else str
            return [inner(x.strip() if isinstance(x, str) else x) for x in items if str(x).strip()]
        if kind == "bool" or f.name == "bf16":  # bf16: a bool, as in HF's TrainingArguments, or auto (axolotl's)
            truthy, falsy = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
            if f.name == "bf16" and str(value).lower() == "auto":
                return "auto"
            if isinstance(value, bool) or str(value).lower() in truthy + falsy:
                on = value if isinstance(value, bool) else str(value).lower() in truthy
                return on if kind == "bool" else str(on).lower()
            raise ValueError(value)
        return {"int": int, "float": float, "str": str}[kind](value)
    except (ValueError, TypeError):
        raise ConfigError(f"{f.name}: cannot read {value!r} as {'auto, true or false' if f.name == 'bf16' else kind}."
                          ) from None
