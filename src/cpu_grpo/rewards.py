"""Reward functions for math word problems, with TRL's signature `f(completions, **columns) -> list[float]`.

`completions` is a list of strings, or (TRL conversational format) a list of message lists, in which
case the content of the last message is scored. Dataset columns arrive as keyword lists aligned with
`completions` (`answer=[...]`, `prompts=[...]`, ...), so every reward accepts `**kwargs`, and a reward
function written for TRL works here unchanged. `load_reward` turns a string from a config or the
command line into such a function.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .errors import UserError

RewardFn = Callable[..., list[float]]


class RewardError(UserError):
    """A reward spec or reward input a user can fix; the message says how."""


# ---------------------------------------------------------------------------- text and numbers

# A number as models and GSM8K write it: optional sign and/or "$", thousands separators in groups
# of three, decimals, an optional "/denominator". The minus is not taken when it follows a word
# character or ")", so "10-4" yields "10" and "4", not "-4".
_NUM = r"(?:(?<![\w)])-\$?|\$-?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?"
_NUM_RE = re.compile(_NUM)
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval-harness gsm8k "strict-match"
_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval-harness gsm8k "flexible-extract"
_ANSWER_PHRASE_RE = re.compile(r"the\s+(?:final\s+)?answer\s+is|answer\s*:", re.IGNORECASE)
_FRAC_RE = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_PLAIN_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_MARKER_RE = re.compile(r"####[ \t]*(" + _NUM + ")")
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")  # \boxed{...}, one level of inner braces
_ARITH_RE = re.compile(r"\d\s*(?:[-+*/×÷x]|\\times|\\cdot|\\div)\s*\(?\$?\d")
_ENDING_RE = re.compile(r"[\s.,;:!*_`)\]$\\]*")  # what may follow a final answer: spaces, closing punctuation


def completion_text(c: str | Sequence[dict[str, Any]] | dict[str, Any]) -> str:
    """The text of one completion: the string itself, or the content of the last message.

    >>> completion_text([{"role": "assistant", "content": "#### 4"}])
    '#### 4'
    """
    if isinstance(c, str):
        return c
    if isinstance(c, dict):
        c = [c]
    if not isinstance(c, Sequence):
        raise RewardError(f"a completion must be a string or a list of message dicts, got {type(c).__name__}")
    if len(c) == 0:
        return ""
    content = c[-1].get("content") or ""
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "..."}]
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def parse_number(s: str) -> float | None:
    """A number string as written by a person or a model, as a float; None if it is not one.

    >>> [parse_number(s) for s in ["1,234", "$18", "3.50", "-5", "18.", "1/2", "50%", "-$5", "ten"]]
    [1234.0, 18.0, 3.5, -5.0, 18.0, 0.5, 50.0, -5.0, None]
    """
    t = s.strip().replace(",", "").replace("$", "").removesuffix("%").rstrip(".")
    num, slash, den = t.partition("/")
    if not _PLAIN_RE.fullmatch(num) or (slash and not _PLAIN_RE.fullmatch(den)):
        return None
    if not slash:
        return float(num)
    return float(num) / float(den) if float(den) != 0 else None


def _clean(s: str) -> str | None:
    s = s.strip().rstrip(".,")
    return s if any(ch.isdigit() for ch in s) else None


def _number_after(text: str) -> str | None:
    """The first number on the first line of `text` that has any letter or digit."""
    for line in text.splitlines():
        if any(ch.isalnum() for ch in line):
            m = _NUM_RE.search(line)
            return _clean(m.group()) if m else None
    return None


def _last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}, braces matched; None if absent or unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : i]
    return None


def _boxed_number(content: str) -> str | None:
    content = _FRAC_RE.sub(r"\1/\2", content).replace("{,}", ",")
    for latex_space in ("\\!", "\\,", "\\ "):
        content = content.replace(latex_space, "")
    m = _NUM_RE.search(content.replace("\\$", "$"))
    return _clean(m.group()) if m else None


def _extract_auto(text: str) -> str | None:
    marker = text.rfind("####")
    if marker >= 0 and (found := _number_after(text[marker + 4 :])):
        return found
    boxed = _last_boxed(text)
    if boxed is not None and (found := _boxed_number(boxed)):
        return found
    phrases = list(_ANSWER_PHRASE_RE.finditer(text))
    if phrases and (found := _number_after(text[phrases[-1].end() :])):
        return found
    numbers = _NUM_RE.findall(text)
    return _clean(numbers[-1]) if numbers else None


def extract_answer(text: str, mode: str = "auto") -> str | None:
    """The final answer in `text` as the raw number string (trailing '.' and ',' removed), or None.

    - "strict": the number after the last "#### " (lm-eval-harness gsm8k strict-match regex).
    - "flexible": the last match of lm-eval-harness's flexible-extract regex; None if that match
      has no digit (lm-eval would score such a match, e.g. "...", as wrong too).
    - "auto": the first of: the first number on the first non-empty line after the last "####";
      the first number inside the last \\boxed{...} (\\frac{a}{b} read as a/b); the first number
      after the last "the answer is" / "the final answer is" / "answer:" (any case); the last number.

    >>> extract_answer("3 + 4 = 7 apples.\\n#### 7")
    '7'
    >>> extract_answer("So $\\\\boxed{1,234}$ dollars.")
    '1,234'
    >>> extract_answer("The answer is $18.")
    '$18'
    >>> extract_answer("He has 5 now, then 12.", mode="strict") is None
    True
    """
    if mode == "strict":
        found = _STRICT_RE.findall(text)
        return _clean(found[-1]) if found else None
    if mode == "flexible":
        found = _FLEXIBLE_RE.findall(text)
        return _clean(found[-1][0] or found[-1][1]) if found else None
    if mode == "auto":
        return _extract_auto(text)
    raise RewardError(f"unknown answer extraction mode {mode!r}; use 'auto', 'strict' or 'flexible'")


def answers_match(pred: str | None, gold: str, rel_tol: float = 1e-6) -> bool:
    """Whether a predicted answer equals the gold one, compared as numbers.

    An integer gold answer must be matched exactly (a relative tolerance would accept 1234568 for
    1234567); other answers within `rel_tol`. A gold string that is not a number itself (a full
    GSM8K solution "... #### 18") is reduced to its answer first. Non-numbers compare as stripped,
    lower-cased strings.

    >>> answers_match("18.00", "18"), answers_match("$1,234", "1234"), answers_match("0.5", "1/2")
    (True, True, True)
    >>> answers_match("17", "18"), answers_match(None, "18")
    (False, False)
    """
    if pred is None:
        return False
    g = parse_number(gold)
    if g is None and (gold_answer := extract_answer(gold, "auto")) is not None:
        g = parse_number(gold_answer)
    p = parse_number(pred)
    if p is None or g is None:
        return pred.strip().lower() == gold.strip().lower()
    if g.is_integer():
        return p == g
    return math.isclose(p, g, rel_tol=rel_tol)


# ---------------------------------------------------------------------------- reward functions


def _check_aligned(completions: Sequence, column: Sequence, name: str) -> None:
    if len(completions) != len(column):
        raise RewardError(
            f"got {len(completions)} completions but {len(column)} values of column {name!r}; "
            f"pass one {name!r} per completion"
        )


def correctness_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the answer found by `extract_answer(text, "auto")` matches `answer`, else 0.0.

    >>> correctness_reward(["so #### 18", "I think 17", "The answer is 18."], answer=["18", "18", 18])
    [1.0, 0.0, 1.0]
    """
    _check_aligned(completions, answer, "answer")
    return [
        float(answers_match(extract_answer(completion_text(c), "auto"), str(a)))
        for c, a in zip(completions, answer, strict=True)
    ]


def strict_correctness_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 only where the text has "#### N" (lm-eval strict-match) and N matches `answer`.

    >>> strict_correctness_reward(["#### 18", "The answer is 18."], answer=["18", "18"])
    [1.0, 0.0]
    """
    _check_aligned(completions, answer, "answer")
    return [
        float(answers_match(extract_answer(completion_text(c), "strict"), str(a)))
        for c, a in zip(completions, answer, strict=True)
    ]


def _format_score(text: str) -> float:
    boxed = [m for m in _BOXED_RE.finditer(text) if any(ch.isdigit() for ch in m.group(1))]
    markers = sorted([*_MARKER_RE.finditer(text), *boxed], key=lambda m: m.start())
    score, work = 0.0, text
    if markers:
        last = markers[-1]
        score += 0.5
        if len(markers) == 1 and _ENDING_RE.fullmatch(text[last.end() :]):
            score += 0.25
        work = text[: last.start()]
    if any("=" in line and _ARITH_RE.search(line) for line in work.splitlines()):
        score += 0.25
    return score


def format_reward(completions: Sequence, **kwargs: Any) -> list[float]:
    """Partial credit in [0, 1] for a marked final answer, whether or not the answer is right.

    A final-answer marker is "####" followed (spaces or tabs allowed) by a number (GSM8K's format), or a
    \\boxed{...} with a number in it (the format Qwen's math-tuned models are trained on). The rule, summed:
    - 0.5 if the text has a marker;
    - 0.25 if there is exactly one marker and the answer ends the text: only whitespace and closing
      punctuation (. , ; : ! * _ ` ) ] $ \\) follow it. A model that repeats "#### N" lines, or writes
      bare "####" lines after its answer until the length limit, does not get this part;
    - 0.25 if a line of work holds a number, an operator (+ - * / x × ÷ \\times \\cdot \\div), a number, and
      "=" ("3 + 4 = 7", "<<3*4=12>>", "\\( 3 \\times 4 = 12 \\)"): before the last marker, or anywhere when
      there is no marker.

    >>> format_reward(["3 + 4 = 7\\n#### 7", "#### 7 because 3 + 4 = 7", "3 + 4 = 7", "I don't know"])
    [1.0, 0.5, 0.25, 0.0]
    >>> format_reward(["3 + 4 = 7\\n#### 7\\n#### 7", "3 + 4 = 7\\n#### 7\\n#### \\n#### "])
    [0.75, 0.75]
    >>> format_reward(["\\\\( 3 \\\\times 4 = 12 \\\\)\\n\\\\[\\\\boxed{12}\\\\]", "\\\\boxed{x}"])
    [1.0, 0.0]
    >>> format_reward(["\\\\boxed{7} \\\\boxed{7}", "So \\\\(\\\\boxed{7}\\\\) apples."])
    [0.5, 0.5]
    """
    return [_format_score(completion_text(c)) for c in completions]


def soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> RewardFn:
    """DAPO's overlong reward shaping (TRL's `get_soft_overlong_punishment`): 0 up to `max_completion_len -
    soft_punish_cache` tokens, then falling linearly to -1 at `max_completion_len`, and -1 beyond. It reads the
    `completion_ids` column, so it counts tokens, not characters.

    >>> fn = soft_overlong_punishment(100, 20)
    >>> fn(["a"] * 4, completion_ids=[[0] * 80, [0] * 90, [0] * 100, [0] * 120])
    [0.0, -0.5, -1.0, -1.0]
    """
    start = max_completion_len - soft_punish_cache

    def overlong_reward(completions: Sequence, completion_ids: Sequence, **kwargs: Any) -> list[float]:
        _check_aligned(completions, completion_ids, "completion_ids")
        return [0.0 if len(ids) <= start else max(-1.0, (start - len(ids)) / max(soft_punish_cache, 1))
                for ids in completion_ids]

    return overlong_reward


def as_scores(name: str, values: Any, n: int) -> list[float]:
    """A reward function's output as n floats (None -> nan: "cannot score this one"), or a RewardError that names
    the function and says what it returned.

    >>> as_scores("mine", [1, None, 0.5, True], 4)
    [1.0, nan, 0.5, 1.0]
    """
    if not isinstance(values, list | tuple) or len(values) != n:
        got = f"{type(values).__name__} of length {len(values)}" if isinstance(values, list | tuple) else \
            f"{type(values).__name__} {str(values)[:40]!r}"
        raise RewardError(f"reward function {name} returned a {got} for {n} completions: return a list of one float "
                          "(or None) per completion")
    out = []
    for v in values:
        try:
            if isinstance(v, str):  # float("1.0") would pass: a reward is a number, not text
                raise TypeError
            x = math.nan if v is None else float(v.item() if hasattr(v, "item") else v)
        except (TypeError, ValueError):
            raise RewardError(f"reward function {name} returned {str(v)[:40]!r} ({type(v).__name__}): return "
                              "floats, or None for a completion it cannot score") from None
        if math.isinf(x):
            raise RewardError(f"reward function {name} returned an infinite value: return finite floats, or None "
                              "for a completion it cannot score")
        out.append(x)
    return out


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "correctness": correctness_reward,
    "strict_correctness": strict_correctness_reward,
    "format": format_reward,
}
BUILTIN_NAMES = (*BUILTIN_REWARDS, "overlong")  # overlong is built for the run's completion limit


# ---------------------------------------------------------------------------- loading by name


def _load_file(spec: str, path: str) -> ModuleType:
    file = Path(path).expanduser()
    if not file.is_file():
        raise RewardError(
            f"reward {spec!r}: file {path} does not exist; check the path (relative to {Path.cwd()})"
        )
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", file.stem)
    name = f"cpu_grpo_reward_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"reward {spec!r}: cannot load {path} as Python; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise RewardError(
            f"reward {spec!r}: running {path} failed ({type(e).__name__}: {e}); fix that file"
        ) from e
    return module


def _import_module(spec: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as e:
        raise RewardError(
            f"reward {spec!r}: importing module {target!r} failed ({type(e).__name__}: {e}); "
            "check the module name and that its package is installed"
        ) from e


def _own_functions(module: ModuleType) -> list[str]:
    """Public functions defined in `module` itself (not imported into it)."""
    return sorted(
        n
        for n, obj in vars(module).items()
        if inspect.isfunction(obj) and not n.startswith("_") and obj.__module__ == module.__name__
    )


def _named(fn: Callable, name: str) -> RewardFn:
    """`fn`, or a wrapper named `name` when it has no __name__ (a partial, a callable object)."""
    if hasattr(fn, "__name__"):
        return fn

    def reward(completions: Sequence, **kwargs: Any) -> list[float]:
        return fn(completions, **kwargs)

    reward.__name__ = reward.__qualname__ = name
    return reward


def load_reward(spec: str, max_completion_len: int = 0) -> RewardFn:
    """A reward function from a builtin name, "package.module:function", "file.py:function", or
    "file.py" alone when that file defines exactly one public function whose name ends in "reward".
    The builtin `overlong` is `soft_overlong_punishment` over the last quarter of `max_completion_len` tokens.

    >>> load_reward("format") is format_reward
    True
    >>> load_reward("cpu_grpo.rewards:correctness_reward") is correctness_reward
    True
    """
    if spec == "overlong":
        if max_completion_len <= 0:
            raise RewardError("reward 'overlong' needs the completion limit: give max_new_tokens")
        return soft_overlong_punishment(max_completion_len, max_completion_len // 4)
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if spec.endswith(".py"):
        module = _load_file(spec, spec)
        found = [n for n in _own_functions(module) if n.endswith("reward")]
        if len(found) != 1:
            what = f"several ({', '.join(found)})" if found else "no public function named '*reward'"
            raise RewardError(
                f"reward {spec!r}: file {spec} defines {what}; name one as '{spec}:function' "
                f"(functions there: {', '.join(_own_functions(module)) or 'none'})"
            )
        return getattr(module, found[0])
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise RewardError(
            f"reward {spec!r} is not a builtin ({', '.join(BUILTIN_NAMES)}); give one of those, "
            "'package.module:function', 'path/to/file.py:function' or 'path/to/file.py'"
        )
    if target.endswith(".py"):
        module, where = _load_file(spec, target), f"file {target}"
    else:
        module, where = _import_module(spec, target), f"module {target}"
    fn = getattr(module, name, None)
    if not callable(fn):
        problem = f"has no function {name!r}" if fn is None else f"has {name!r} but it is not callable"
        raise RewardError(
            f"reward {spec!r}: {where} {problem}; available: {', '.join(_own_functions(module)) or 'none'}"
        )
    return _named(fn, name)
