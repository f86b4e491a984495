"""Problems from files and datasets: GSM8K-format JSON lines (yours, or the GSM8K shipped in the package) and
Hugging Face datasets; `load_task` turns any task spec (a level, "mix", "gsm8k", a path, "hf:NAME") into Examples.

A file of your own is split like the generated levels (tasks.split_of, a hash of each question), so a held-out
problem is never trained on; the shipped GSM8K keeps its own train and test files.
"""

from __future__ import annotations

import itertools
import json
import warnings
from fractions import Fraction
from pathlib import Path

from .tasks import (
    UNKNOWN,
    Example,
    TaskError,
    canonical_number,
    generate,
    in_equal_shares,
    levels_of,
    parts_of,
    split_of,
)


def _example(row: object, id_: str) -> Example:
    """A GSM8K-style {"question", "answer": "...#### 18"} row as an Example; ValueError if malformed."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip() or not isinstance(answer, str):
        raise ValueError("needs a non-empty 'question' and an 'answer' string")
    gold = answer.rsplit("####", 1)[-1].strip().replace(",", "").replace("$", "").strip()
    if "####" not in answer or not gold:
        raise ValueError("the 'answer' must end in a '#### <number>' line")
    try:
        gold = canonical_number(Fraction(gold))
    except (ValueError, ZeroDivisionError):
        pass  # not a number: keep the text as written
    return Example(question, gold, str(row.get("difficulty") or row.get("level") or "gsm8k"), answer, id_)


def load_jsonl(path: str | Path, on_error: str = "raise", limit: int | None = None) -> list[Example]:
    """Examples from a GSM8K-format JSON-lines file, at most `limit`; on_error="skip" skips bad lines."""
    if on_error not in ("raise", "skip"):
        raise TaskError(f"on_error must be 'raise' or 'skip', got '{on_error}'.")
    p = Path(path)
    if not p.is_file():
        raise TaskError(f"data file not found: {path}: check the path, or use a generated level "
                        "(basic, intermediate, advanced, mix).")
    try:
        lines = p.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError:
        raise TaskError(f"{path}: not UTF-8 text: pass a .jsonl file, one JSON object per line.") from None
    out: list[Example] = []
    bad: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            out.append(_example(json.loads(line), f"{p.name}:{lineno}"))
        except ValueError as e:  # json.JSONDecodeError is a ValueError too
            reason = f"invalid JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
            if on_error == "raise":
                raise TaskError(f"{path}:{lineno}: {reason}. Fix the line or pass --skip-bad-lines to "
                                "skip it.") from None
            bad.append((lineno, reason))
    if bad:
        warnings.warn(f"{path}: skipped {len(bad)} malformed line(s), first at line {bad[0][0]}: {bad[0][1]}",
                      stacklevel=2)
    if not out:
        raise TaskError(f"{path}: no examples found: each line must be a JSON object with a 'question' and "
                        "an 'answer' ending in '#### <number>'.")
    return out


def load_hf(name: str = "openai/gsm8k", split: str = "test", config: str = "main",
            limit: int | None = None) -> list[Example]:
    """Examples from a GSM8K-format dataset on the Hugging Face hub (needs `datasets` and a network)."""
    try:
        import datasets
    except ImportError:
        raise TaskError("the 'datasets' package is not installed: run `pip install datasets`, "
                        "or pass a local .jsonl path instead.") from None
    try:
        rows = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, or an unknown name/config/split: all for the user to fix
        raise TaskError(f"could not load '{name}' (config '{config}', split '{split}') from the Hugging Face "
                        f"hub ({type(e).__name__}): check the name and your network, or pass a local .jsonl "
                        "path instead.") from None
    out: list[Example] = []
    for i, row in enumerate(itertools.islice(rows, limit)):
        try:
            out.append(_example(row, f"{name}:{split}:{i}"))
        except ValueError as e:
            raise TaskError(f"{name}:{split}:{i}: {e}: use a GSM8K-format dataset instead.") from None
    if not out:
        raise TaskError(f"'{name}' split '{split}' has no examples: pick another split or dataset.")
    return out


GSM8K_DIR = Path(__file__).parent / "gsm8k"  # GSM8K (Cobbe et al., 2021; MIT licence, file beside it)
DATASETS = {"gsm8k": {"train": "train.jsonl", "test": "test.jsonl", None: "test.jsonl"},
            "gsm8k-train": {"train": "train.jsonl", "test": "test.jsonl", None: "train.jsonl"}}


def load_task(spec: str, n: int | None = None, seed: int = 0, split: str | None = "train",
              on_error: str = "raise") -> list[Example]:
    """Problems named by `spec`: a level, "mix", "gsm8k", "gsm8k-train", those joined by "+", a .jsonl path or
    "hf:NAME[:split]".

    Levels give `n` problems (500 when None) of `split` (None: test). "gsm8k" is the shipped GSM8K, trained on
    its train file and held out from its test file; "gsm8k-train" is the same in a run, and its train file
    for split None (`cpu-grpo eval --task gsm8k-train`: training problems). A file of your own is split like the
    generated levels, by a hash of each question, so a held-out problem is never trained on; split None
    takes the whole file (`cpu-grpo eval`). Files give their first `n` examples of the split, in file order.
    "hf:NAME" reads `split` unless the spec names one ("hf:openai/gsm8k:test"). Joined tasks give `n` (500 when
    None) in equal shares, interleaved ("advanced+gsm8k": an advanced problem, a GSM8K one, ...).
    """
    if levels_of(spec):
        return generate(spec, 500 if n is None else n, seed, split or "test")
    if len(parts := parts_of(spec)) > 1:  # levels and the shipped GSM8K
        return in_equal_shares(parts, 500 if n is None else n,
                               lambda part, k: load_task(part, k, seed, split, on_error))
    if spec in DATASETS:
        return load_jsonl(GSM8K_DIR / DATASETS[spec][split], on_error, limit=n)
    if spec.startswith("hf:"):
        name, _, hf_split = spec[3:].partition(":")
        if not name:
            raise TaskError("'hf:' needs a dataset name: e.g. hf:openai/gsm8k or hf:openai/gsm8k:test.")
        return load_hf(name, hf_split or split or "test", limit=n)
    if spec.endswith(".jsonl") or Path(spec).is_file():
        if split is None:
            return load_jsonl(spec, on_error, limit=n)
        mine = [ex for ex in load_jsonl(spec, on_error) if split_of(ex.question) == split]
        if not mine:
            raise TaskError(f"{spec}: none of its questions falls in the {split} split (a fifth of them, by a hash "
                            "of the text, is held out): give a file with more problems.")
        return mine[:n]
    raise TaskError(UNKNOWN.format(spec))
