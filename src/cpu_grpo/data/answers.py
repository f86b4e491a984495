"""A completion's final answer: its text, the number it gives (auto, lm-eval strict and flexible extraction,
`\\boxed{}`), and whether that number is the gold answer. The reward functions and the evaluation both use it."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ..errors import RewardError

# A number as models and GSM8K write it: optional sign and/or "$", thousands separators in groups
# of three, decimals, an optional "/denominator". The minus is not taken when it follows a word
# character or ")", so "10-4" yields "10" and "4", not "-4".
NUMBER = r"(?:(?<![\w)])-\$?|\$-?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?"
_NUM_RE = re.compile(NUMBER)
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")  # lm-eval-harness gsm8k "strict-match"
_FLEXIBLE_RE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # lm-eval-harness gsm8k "flexible-extract"
_ANSWER_PHRASE_RE = re.compile(r"the\s+(?:final\s+)?answer\s+is|answer\s*:", re.IGNORECASE)
LATEX_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_PLAIN_RE = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


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
    content = LATEX_FRAC.sub(r"\1/\2", content).replace("{,}", ",")
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
    g = gold_number(gold)
    p = parse_number(pred)
    if p is None or g is None:
        return pred.strip().lower() == gold.strip().lower()
    if g.is_integer():
        return p == g
    return math.isclose(p, g, rel_tol=rel_tol)


def gold_number(gold: str) -> float | None:
    """The number a gold answer stands for, as answers_match compares it: the answer itself, or the final answer of
    a solution ("... #### 18"); None when there is none (no completion can match such a gold answer).

    >>> gold_number("1,234"), gold_number("so 3 + 4 = 7\\n#### 7"), gold_number("forty-two")
    (1234.0, 7.0, None)
    """
    g = parse_number(gold)
    if g is None and (gold_answer := extract_answer(gold, "auto")) is not None:
        g = parse_number(gold_answer)
    return g
