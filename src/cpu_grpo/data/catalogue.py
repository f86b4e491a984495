"""reasoning-gym's procedural tasks (PyPI `reasoning-gym`, ~100 generators with their own verifiers, pure Python,
no download) as `--task rg:NAME[:key=value,...]`: `rg:chain_sum`, `rg:basic_arithmetic:min_terms=2,max_terms=3`.

Rows are drawn from the generator seeded by the run's seed and the split, and kept in a split by a hash of the
question, as the generated tasks here are: a held-out question is never a training one. Each row is asked as
reasoning-gym asks it (its default system prompt: think, then the answer in <answer> tags) and scored by its own
`score_answer` on the last <answer>: `reasoning_gym_reward` is 1.0 where the generator's verifier gives full marks,
0.0 otherwise (its partial credits, such as 0.01 for any answer, are not "correct").
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
import zlib
from collections.abc import Sequence
from typing import Any

from .answers import completion_text
from .example import Example
from .tasks import TaskError, split_of

PREFIX = "rg:"
INSTALL = "pip install 'cpu-grpo[rg]' (or pip install reasoning-gym)"
_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def is_catalogue(spec: str) -> bool:
    return spec.startswith(PREFIX)


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise TaskError(f"--task rg:... needs reasoning-gym: {INSTALL}") from None
    return reasoning_gym


def parse(spec: str) -> tuple[str, dict]:
    """rg:NAME[:key=value,...] -> (NAME, its config's values), each value read as a Python literal where it is one.

    >>> parse("rg:basic_arithmetic:min_terms=2,max_terms=3,format=plain")
    ('basic_arithmetic', {'min_terms': 2, 'max_terms': 3, 'format': 'plain'})
    """
    name, _, rest = spec[len(PREFIX):].partition(":")
    values = {}
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise TaskError(f"{spec}: '{pair}' is not key=value: write rg:{name}:key=value,key=value.")
        try:
            values[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            values[key.strip()] = value.strip()
    return name, values


@functools.lru_cache(maxsize=64)
def _dataset(spec: str, seed: int):
    """The generator of `spec` at `seed`, checked: an unknown name names the nearest, a key its config does not
    take names those it does."""
    gym, (name, values) = _gym(), parse(spec)
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3)
        raise TaskError(f"{spec}: reasoning-gym has no task {name!r}" + (f" (did you mean {', '.join(close)}?)"
                                                                        if close else "") +
                        ": `python -c 'import reasoning_gym.factory as f; print(sorted(f.DATASETS))'` lists them.")
    config_cls = DATASETS[name][1]
    fields = sorted(getattr(config_cls, "__dataclass_fields__", {}))
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise TaskError(f"{spec}: {name}'s config takes no {', '.join(unknown)}: it takes "
                        f"{', '.join(f for f in fields if f not in ('seed', 'size'))}.")
    try:
        return gym.create_dataset(name, **{**values, "seed": seed, "size": 1_000_000})
    except (AssertionError, ValueError, TypeError) as e:
        raise TaskError(f"{spec}: reasoning-gym refused the config ({type(e).__name__}: {e}): change the values.") \
            from None


def generate(spec: str, n: int, seed: int = 0, split: str = "train") -> list[Example]:
    """Up to n distinct rows of one split: the generator's items at `seed` and the split, whose question's hash
    falls in that split (a held-out question is never trained on)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    name = parse(spec)[0]
    # reasoning-gym seeds item i with `seed + i`: seeds must lie far apart, or two runs' rows are one sequence shifted
    data_seed = zlib.crc32(f"{spec}/{split}/{seed}".encode())
    ds = _dataset(spec, data_seed)
    out, seen, misses, i = [], set(), 0, 0
    while len(out) < n and misses < 2000:
        entry, i = ds[i], i + 1
        question = entry["question"]
        if question in seen or split_of(question) != split:
            misses += 1
            continue
        misses = 0
        seen.add(question)
        messages = ({"role": "system", "content": SYSTEM_PROMPTS["default"]}, {"role": "user", "content": question})
        answer = "" if entry["answer"] is None else str(entry["answer"])  # None: any answer its verifier takes
        out.append(Example(question, answer, name, id=f"{spec}-{split}-{len(out)}", template=name, messages=messages,
                           math=False,
                           columns={"rg_task": spec, "rg_seed": data_seed, "rg_index": i - 1}))
    if n and not out:
        raise TaskError(f"{spec} gave no {split} rows: its generator makes too few distinct questions; widen its "
                        "config.")
    return out


def reasoning_gym_reward(completions: Sequence, rg_task: Sequence[str], rg_seed: Sequence[int],
                         rg_index: Sequence[int], **kwargs: Any) -> list[float]:
    """1.0 where the row's reasoning-gym verifier gives the last <answer> full marks, else 0.0."""
    out = []
    for completion, spec, seed, index in zip(completions, rg_task, rg_seed, rg_index, strict=True):
        found = _ANSWER.findall(completion_text(completion))
        ds = _dataset(spec, int(seed))
        out.append(float(bool(found) and ds.score_answer(found[-1].strip(), ds[int(index)]) == 1.0))
    return out
