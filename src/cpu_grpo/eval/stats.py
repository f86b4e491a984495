"""Statistics for before/after claims on a fixed evaluation set: intervals, paired tests, pass@k.

Accuracy on a few hundred problems moves by several points from noise alone, so every number we
report carries a 95% interval, and every before/after claim is a paired test on the same problems.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def _as_bool_array(values: Sequence[bool], name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.dtype != bool and not np.isin(arr, (0, 1)).all()):
        raise ValueError(f"{name} must be a flat sequence of booleans (or 0/1), one per problem")
    return arr.astype(bool)


def _as_pairs(before: Sequence[bool], after: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    b, a = _as_bool_array(before, "before"), _as_bool_array(after, "after")
    if len(b) != len(a) or len(b) == 0:
        raise ValueError(
            f"before and after must score the same, non-empty list of problems (got {len(b)} and {len(a)})"
        )
    return b, a


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials; (0.0, 1.0) when n == 0.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    """
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n for a proportion, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return lo, hi


def accuracy_summary(correct: Sequence[bool]) -> dict:
    """{"accuracy", "n", "ci95"}; an empty list gives accuracy 0.0 with the uninformative [0, 1].

    >>> accuracy_summary([True, True, False, True])["accuracy"]
    0.75
    """
    arr = _as_bool_array(correct, "correct")
    k, n = int(arr.sum()), len(arr)
    lo, hi = wilson_interval(k, n)
    return {"accuracy": k / n if n else 0.0, "n": n, "ci95": [lo, hi]}


def paired_interval(before: Sequence[bool], after: Sequence[bool], z: float = Z95) -> tuple[float, float]:
    """95% interval for mean(after) - mean(before) on the same problems: Newcombe's square-and-add interval for
    paired proportions (Newcombe 1998, method 10; Fagerland, Lydersen and Laake 2017, section 8.5), the Wilson
    interval of each rate combined with the correlation of the pairs. It keeps its coverage when few answers change
    and agrees with McNemar's test there, where a bootstrap of the pairs does not (4 problems fixed and none broken:
    every resample has a gain, so the bootstrap's interval excludes zero, while McNemar's p is 0.125).

    >>> [round(x, 4) for x in paired_interval([True] * 194 + [False] * 6, [True] * 198 + [False] * 2)]
    [-0.0039, 0.0515]
    """
    b, a = _as_pairs(before, after)
    n = len(b)
    n11, n12, n21, n22 = (int(x) for x in ((a & b).sum(), (a & ~b).sum(), (~a & b).sum(), (~a & ~b).sum()))
    k1, k2 = n11 + n12, n11 + n21  # right after, right before
    p1, p2 = k1 / n, k2 / n
    (l1, u1), (l2, u2) = wilson_interval(k1, n, z), wilson_interval(k2, n, z)
    psi = 0.0  # the correlation of the two rates, shrunk towards 0 by n / 2 (Newcombe's continuity correction)
    if 0 < k1 < n and 0 < k2 < n:
        cross = n11 * n22 - n12 * n21
        psi = (cross - n / 2 if cross > n / 2 else min(cross, 0)) / math.sqrt(k1 * (n - k1) * k2 * (n - k2))
    lo = p1 - p2 - math.sqrt(max((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2), 0.0))
    hi = p1 - p2 + math.sqrt(max((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1), 0.0))
    return max(lo, -1.0), min(hi, 1.0)


def _discordant(before: Sequence[bool], after: Sequence[bool]) -> tuple[int, int]:
    """b = #(right before, wrong after), c = #(wrong before, right after)."""
    bef, aft = _as_pairs(before, after)
    return int((bef & ~aft).sum()), int((~bef & aft).sum())


def mcnemar_exact(before: Sequence[bool], after: Sequence[bool]) -> float:
    """Exact two-sided McNemar p-value: p = min(1, 2 * P(X <= min(b, c))), X ~ Binomial(b + c, 1/2).

    >>> mcnemar_exact([False] * 6 + [True] * 4, [True] * 10)  # b=0, c=6: 2 * 0.5**6
    0.03125
    """
    b, c = _discordant(before, after)
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1))  # exact integers
    return min(1.0, tail / 2 ** (m - 1))


def paired_comparison(before: Sequence[bool], after: Sequence[bool]) -> dict:
    """Everything a before/after claim needs; "significant" means McNemar's exact p < 0.05."""
    lo, hi = paired_interval(before, after)
    b, c = _discordant(before, after)
    p = mcnemar_exact(before, after)
    return {"diff": (c - b) / len(before), "ci95": [lo, hi], "p_value": p, "n": len(before), "b": b, "c": c,
            "significant": p < 0.05}


CONSTANT_SHARE = 0.2  # a held-out set whose most common answer covers this share gets the check below


def against_constant(answers: Sequence[str], correct: Sequence[bool], label: str = "") -> dict | None:
    """The model's right answers against answering every problem with the set's most common reference answer (a
    lower bound on what that constant scores: a verifier may accept it on more), where that answer covers at least
    CONSTANT_SHARE of the set: a significant change from a base is no evidence that a task was learned when a
    constant does as well. None otherwise.

    >>> x = against_constant(["1"] * 8 + ["2", "3"], [True] * 8 + [False, False], "letters")
    >>> x["answer"], x["accuracy"], x["vs_model"]["diff"]
    ('1', 0.8, 0.0)
    >>> x["sentence"].split("; ")
    ['letters: answering "1" to every problem scores 80.0% (8 of 10)', 'the model 80.0%, +0.0 points against it \
(McNemar p = 1): what it gained is no more than the constant.']
    >>> against_constant(["1", "2", "3", "4", "5", "6"], [True] * 6), against_constant([None] * 3, [True] * 3)
    (None, None)
    """
    given = [str(a) for a in answers if a is not None and str(a).strip()]
    if not given:
        return None
    answer, k = Counter(given).most_common(1)[0]
    if k < CONSTANT_SHARE * len(answers):
        return None
    constant = [str(a) == answer for a in answers]
    cmp = paired_comparison(constant, correct)
    p_text = "p < 0.0001" if cmp["p_value"] < 0.0001 else f"p = {cmp['p_value']:.2g}"
    verdict = "above it, significantly" if cmp["significant"] and cmp["diff"] > 0 else \
        "what it gained is no more than the constant"
    sentence = (f"{label + ': ' if label else ''}answering \"{answer}\" to every problem scores "
                f"{100 * k / len(answers):.1f}% ({k} of {len(answers)}); the model "
                f"{100 * sum(correct) / len(correct):.1f}%, {_points(cmp['diff'])} points against it (McNemar "
                f"{p_text}): {verdict}.")
    return {"answer": answer, "accuracy": k / len(answers), "vs_model": cmp, "sentence": sentence}


def _points(x: float) -> str:
    return f"{round(x * 100, 1) + 0.0:+.1f}"  # + 0.0 turns -0.0 into 0.0


def significance_sentence(cmp: dict, label: str = "") -> str:
    """One sentence for a `paired_comparison` result, with an optional "label: " prefix.

    >>> cmp = {"diff": 0.215, "ci95": [0.15, 0.28], "p_value": 0.0001, "significant": True}
    >>> significance_sentence(cmp, "GSM8K")
    'GSM8K: +21.5 points (95% CI +15.0 to +28.0, McNemar p = 0.0001): a significant improvement.'
    >>> significance_sentence({"diff": -0.01, "ci95": [-0.04, 0.02], "p_value": 0.5, "significant": False})
    '-1.0 points (95% CI -4.0 to +2.0, McNemar p = 0.5): not significant (p >= 0.05).'
    """
    lo, hi = cmp["ci95"]
    p = cmp["p_value"]
    p_text = "p < 0.0001" if p < 0.0001 else f"p = {p:.2g}"
    if not cmp["significant"]:
        verdict = "not significant (p >= 0.05)"
    else:
        verdict = "a significant improvement" if cmp["diff"] > 0 else "a significant drop"
    prefix = f"{label}: " if label else ""
    return (
        f"{prefix}{_points(cmp['diff'])} points (95% CI {_points(lo)} to {_points(hi)}, McNemar {p_text}): "
        f"{verdict}."
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al. 2021),
    computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which never forms the huge binomials.

    >>> pass_at_k(2, 1, 1), pass_at_k(5, 0, 3), pass_at_k(5, 3, 3)
    (0.5, 0.0, 1.0)
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The most common non-None answer, ties to the one seen first; None if there is none.

    Answers are compared as strings, so normalise them first ("18.0" and "18" are different votes).

    >>> majority_vote(["7", None, "8", "8", "7"]), majority_vote([None, None])
    ('7', None)
    """
    counts = Counter(a for a in answers if a is not None)  # keeps first-seen order
    return max(counts, key=counts.__getitem__) if counts else None
