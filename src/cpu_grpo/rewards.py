"""TRL's shipped reward functions (`trl.rewards`) by their names, so that a TRL script's
`from trl.rewards import accuracy_reward` becomes `from cpu_grpo.rewards import accuracy_reward`.

Each takes completions as text or as chat messages, as this tool's own rewards do (data/rewards.py, verifiers.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .data.answers import completion_text
from .data.rewards import soft_overlong_punishment as get_soft_overlong_punishment
from .errors import RewardError

__all__ = ["accuracy_reward", "think_format_reward", "get_soft_overlong_punishment"]


def accuracy_reward(completions: Sequence, solution: Sequence[str], **kwargs: Any) -> list[float | None]:
    """TRL's accuracy_reward: 1.0 where math-verify finds the completion's answer (a \\boxed{} first, LaTeX
    anchors only) equal to the `solution` column, 0.0 where not, and None where the solution itself cannot be
    parsed (that row is not scored by this function).

    >>> third = r"$\\frac{1}{3}$"
    >>> accuracy_reward([r"so \\boxed{\\frac{1}{3}}", r"so \\boxed{\\frac{1}{2}}", "x"], [third, third, "?"])
    [1.0, 0.0, None]
    """
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:
        raise RewardError("accuracy_reward needs math-verify: pip install 'cpu-grpo[eval]'") from None
    extract = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                     try_extract_without_anchor=False)]
    out: list[float | None] = []
    for completion, gold in zip(completions, solution, strict=True):
        gold_parsed = parse(gold)
        if not gold_parsed:
            out.append(None)
            continue
        answer = parse(completion_text(completion), extraction_config=extract, extraction_mode="first_match")
        out.append(float(verify(gold_parsed, answer)))
    return out


_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format_reward(completions: Sequence, **kwargs: Any) -> list[float]:
    """TRL's think_format_reward: 1.0 where the completion opens with one <think>...</think> block.

    >>> think_format_reward(["<think>\\nsteps\\n</think>\\nanswer", "<think>\\nno end"])
    [1.0, 0.0]
    """
    return [1.0 if _THINK.match(completion_text(c)) else 0.0 for c in completions]
