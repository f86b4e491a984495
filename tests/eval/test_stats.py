import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from cpu_grpo.eval.stats import (
    accuracy_summary,
    majority_vote,
    mcnemar_exact,
    paired_comparison,
    paired_interval,
    pass_at_k,
    significance_sentence,
    wilson_interval,
)

Z = 1.959963984540054



def pairs(
    both_right: int, only_before: int, only_after: int, both_wrong: int
) -> tuple[list[bool], list[bool]]:
    """before/after lists with the given counts of each (before, after) outcome."""
    before = [True] * both_right + [True] * only_before + [False] * only_after + [False] * both_wrong
    after = [True] * both_right + [False] * only_before + [True] * only_after + [False] * both_wrong
    return before, after


# ---------------------------------------------------------------------------- Wilson


def test_wilson_8_of_10_by_hand():
    # Closed form (2k + z^2 +- z * sqrt(z^2 + 4k(n-k)/n)) / (2(n + z^2)), with z^2 = 3.8414588207:
    #   sqrt(3.8414588207 + 4*8*2/10) = sqrt(10.2414588207) = 3.2002279...
    #   lo = (19.8414588207 - 1.9599640 * 3.2002279) / 27.6829176414 = 13.5690... / 27.6829... = 0.4901625
    #   hi = (19.8414588207 + 6.2723...) / 27.6829176414 = 0.9433178
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4901625, abs=1e-6)
    assert hi == pytest.approx(0.9433178, abs=1e-6)
    root = math.sqrt(Z**2 + 4 * 8 * 2 / 10)
    assert lo == pytest.approx((16 + Z**2 - Z * root) / (2 * (10 + Z**2)), abs=1e-12)
    assert hi == pytest.approx((16 + Z**2 + Z * root) / (2 * (10 + Z**2)), abs=1e-12)


def test_wilson_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # k = 0: lo is exactly 0, hi = z^2 / (n + z^2) = 3.8414588 / 13.8414588 = 0.2775328
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(Z**2 / (10 + Z**2), abs=1e-12)
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and lo == pytest.approx(10 / (10 + Z**2), abs=1e-12)
    lo, hi = wilson_interval(1, 2)  # symmetric around 1/2
    assert lo + hi == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        wilson_interval(3, 2)


def test_accuracy_summary():
    s = accuracy_summary([True, True, False, True])
    assert s["accuracy"] == 0.75 and s["n"] == 4
    assert s["ci95"] == list(wilson_interval(3, 4))
    assert accuracy_summary([]) == {"accuracy": 0.0, "n": 0, "ci95": [0.0, 1.0]}
    assert accuracy_summary(np.array([1, 0]))["accuracy"] == 0.5
    with pytest.raises(ValueError, match="booleans"):
        accuracy_summary([0.5, 1.0])


# ---------------------------------------------------------------------------- paired interval


def test_paired_interval_matches_the_published_example():
    # Cavo et al. 2012, complete response before and after consolidation therapy, as in Fagerland, Lydersen and
    # Laake (2017), chapter 8 (the R package contingencytables' test): -0.0621 (95% CI -0.1186 to -0.0046).
    before, after = pairs(59, 16, 6, 80)  # rows of the book's table: after; columns: before
    lo, hi = paired_interval(before, after)
    assert (sum(after) - sum(before)) / len(after) == pytest.approx(-0.0621, abs=5e-5)
    assert (lo, hi) == (pytest.approx(-0.1186, abs=5e-5), pytest.approx(-0.0046, abs=5e-5))


def test_paired_interval_keeps_its_coverage_when_few_answers_change():
    """200 problems, 1% fixed and 1% broken, no true change: the interval holds zero at least 95% of the time (a
    bootstrap of the pairs excludes zero whenever none is broken and 4 or more are fixed, McNemar p >= 0.125)."""
    rng = np.random.default_rng(0)
    missed = 0
    for _ in range(2000):
        only_before, only_after, both_wrong = rng.multinomial(200, [0.01, 0.01, 0.08, 0.90])[:3]
        lo, hi = paired_interval(*pairs(200 - only_before - only_after - both_wrong, only_before, only_after,
                                        both_wrong))
        missed += not lo <= 0 <= hi
    assert missed / 2000 < 0.05


def test_paired_interval_edges_and_errors():
    same = [True, False, True]
    lo, hi = paired_interval(same, same)
    assert lo < 0 < hi
    assert paired_interval([False] * 5, [True] * 5)[1] == 1.0 and paired_interval([True] * 5, [False] * 5)[0] == -1.0
    with pytest.raises(ValueError, match="same, non-empty"):
        paired_interval([True], [True, False])
    with pytest.raises(ValueError, match="same, non-empty"):
        paired_interval([], [])


# ---------------------------------------------------------------------------- McNemar


@pytest.mark.parametrize(
    "only_before, only_after, expected",
    [
        (0, 6, 0.03125),  # 2 * 0.5**6
        (6, 0, 0.03125),  # symmetric
        (1, 4, 0.375),  # m=5: 2 * (C(5,0) + C(5,1)) / 2**5 = 2 * 6 / 32
        (2, 10, 0.03857421875),  # m=12: 2 * (1 + 12 + 66) / 4096 = 158 / 4096
        (3, 3, 1.0),  # 2 * (1 + 6 + 15 + 20) / 64 = 1.3125, capped at 1
        (0, 0, 1.0),  # no discordant pairs
    ],
)
def test_mcnemar_exact(only_before, only_after, expected):
    before, after = pairs(7, only_before, only_after, 4)
    assert mcnemar_exact(before, after) == pytest.approx(expected, abs=1e-12)


def test_mcnemar_large_counts_do_not_overflow():
    before, after = pairs(0, 600, 400, 0)
    p = mcnemar_exact(before, after)
    assert 0.0 <= p < 1e-9  # 400 vs 600 of 1000 is a 6-sigma imbalance


# ---------------------------------------------------------------------------- comparison and sentence


def test_paired_comparison():
    before, after = pairs(100, 10, 30, 60)
    cmp = paired_comparison(before, after)
    assert set(cmp) == {"diff", "ci95", "p_value", "n", "b", "c", "significant"}
    assert (cmp["n"], cmp["b"], cmp["c"]) == (200, 10, 30)
    assert cmp["diff"] == pytest.approx(0.1)
    assert cmp["p_value"] == mcnemar_exact(before, after)
    assert cmp["significant"] is True
    assert paired_comparison(*pairs(100, 10, 12, 78))["significant"] is False
    # 4 fixed, none broken: McNemar p = 0.125, so not significant (a pair bootstrap's interval excluded zero)
    few = paired_comparison(*pairs(194, 0, 4, 2))
    assert few["p_value"] == 0.125 and few["significant"] is False and few["ci95"][0] < 0


def test_significance_sentence():
    up = {"diff": 0.215, "ci95": [0.15, 0.28], "p_value": 0.0001, "significant": True}
    assert significance_sentence(up) == (
        "+21.5 points (95% CI +15.0 to +28.0, McNemar p = 0.0001): a significant improvement."
    )
    down = {"diff": -0.1, "ci95": [-0.16, -0.04], "p_value": 3e-6, "significant": True}
    assert significance_sentence(down, "MATH") == (
        "MATH: -10.0 points (95% CI -16.0 to -4.0, McNemar p < 0.0001): a significant drop."
    )
    flat = {"diff": 0.0, "ci95": [-0.0001, 0.03125], "p_value": 1.0, "significant": False}
    assert significance_sentence(flat) == (
        "+0.0 points (95% CI +0.0 to +3.1, McNemar p = 1): not significant (p >= 0.05)."
    )
    cmp = paired_comparison(*pairs(100, 10, 30, 60))
    assert significance_sentence(cmp).endswith("a significant improvement.")


# ---------------------------------------------------------------------------- pass@k and voting


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_against_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_is_stable():
    # C(200, 100) ~ 9e58: the product form must agree with exact rational arithmetic.
    exact = 1 - Fraction(math.comb(190, 100), math.comb(200, 100))
    assert pass_at_k(200, 10, 100) == pytest.approx(float(exact), abs=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-12)  # pass@1 = c / n
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_vote(["8", "7", "7", "8"]) == "8"  # tie: "8" seen first
    assert majority_vote([None, "3", None, None, "4", "4"]) == "4"  # None never wins
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None
