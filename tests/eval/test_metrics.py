"""Per-completion metrics on hand-written completions; every expected value worked out by hand in a comment."""

from __future__ import annotations

import sys
from fractions import Fraction

import pytest

from cpu_grpo.eval import metrics
from cpu_grpo.eval.metrics import (
    calc_correct_frac,
    calc_is_right,
    calc_steps,
    computations,
    consistent,
    extract_flexible,
    extract_strict,
    lm_eval_extract,
    lm_eval_flexible_extract,
    lm_eval_strict_match,
    math_verify_correct,
    reasoning_quality,
    score_completion,
)

JANET = "Janet has 16 - 3 - 4 = 9 eggs left.\nShe sells them: 9 * $2 = $18.\n#### 18"




# ---------------------------------------------------------------------------- extractors


def test_strict_and_flexible_extractors():
    assert extract_strict(JANET) == "18" and extract_flexible(JANET) == "18"
    # two markers: strict takes the last "####", flexible the last number of all
    assert extract_strict("#### 5\n#### 6 and then 7") == "6"
    assert extract_flexible("#### 5\n#### 6 and then 7") == "7"
    assert extract_strict("She has 7.") is None and extract_flexible("She has 7.") == "7"
    assert extract_strict("no numbers") is None and extract_flexible("no numbers") is None


# ---------------------------------------------------------------------------- lm-evaluation-harness


def test_lm_eval_strict_takes_the_first_marker():
    # regex "#### (\-?[0-9\.\,]+)" with group_select 0: the FIRST match, "5" (our own strict takes the last)
    assert lm_eval_extract("#### 5\n#### 6", "strict") == "5"
    assert lm_eval_strict_match("#### 5\n#### 6", "5") and not lm_eval_strict_match("#### 5\n#### 6", "6")


def test_lm_eval_normalisation_of_prediction_and_reference():
    # "1,234." -> remove "," -> "1234." -> remove "\.$" -> "1234"; reference "... #### 1,234" -> "1234"
    assert lm_eval_strict_match("so #### 1,234.", "It costs 1000 + 234 = <<1000+234=1234>>1,234\n#### 1,234")
    assert lm_eval_strict_match("#### -7", "-7")
    # "$" is not in the strict regex's class: "#### $18" has no match -> "[invalid]" -> wrong
    assert lm_eval_extract("#### $18", "strict") == "[invalid]" and not lm_eval_strict_match("#### $18", "18")
    # exact string match after normalisation: "18.0" != "18" (our own extractors say 18.0 == 18)
    assert not lm_eval_strict_match("#### 18.0", "18")


def test_lm_eval_flexible_extract():
    # last match of "(-?[$0-9.,]{2,})|(-?[0-9]+)": "$1,234.50." -> "1234.50" after the ignores; gold "1234.5" -> no
    assert lm_eval_extract("The total is $1,234.50.", "flexible") == "$1,234.50."
    assert not lm_eval_flexible_extract("The total is $1,234.50.", "1234.5")
    # a one-digit answer only matches the second alternative "(-?[0-9]+)"
    assert lm_eval_extract("It is 7", "flexible") == "7" and lm_eval_flexible_extract("It is 7", "7")
    assert lm_eval_flexible_extract("She makes $18.", "18")  # "$18." -> "18."-> "18"
    assert lm_eval_extract("no digits", "flexible") == "[invalid]"


def test_lm_eval_cuts_at_the_generation_stops():
    # lm-eval stops generating at "Question:"; the "5" after it is never seen, so the last number is "3"
    text = "#### 3\nQuestion: what is 2 + 3?\nAnswer: 5"
    assert lm_eval_extract(text, "flexible") == "3" and lm_eval_flexible_extract(text, "3")


# ---------------------------------------------------------------------------- math-verify


def test_math_verify_correct():
    assert math_verify_correct("So the answer is $\\boxed{\\frac{1}{2}}$.", "0.5")  # 1/2 == 0.5
    assert math_verify_correct("She makes $18 every day.", "18")
    assert not math_verify_correct("I think 17.", "18")
    assert not math_verify_correct("", "18")
    # a full GSM8K solution as gold is reduced to its "#### N" answer first
    assert math_verify_correct("#### 18", "9 * 2 = <<9*2=18>>18\n#### 18")


def test_math_verify_missing_is_one_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import now raises ImportError
    assert not metrics.math_verify_available()
    with pytest.raises(metrics.MetricError, match="pip install math-verify"):
        math_verify_correct("#### 18", "18")
    assert score_completion("#### 18", "18")["correct_math_verify"] is None


# ---------------------------------------------------------------------------- the work


def test_computations_of_a_worked_answer():
    found = computations(JANET)
    assert [(c.expr, c.result) for c in found] == [("16 - 3 - 4", "9"), ("9 * $2", "$18")]
    assert [c.value for c in found] == [Fraction(9), Fraction(18)]  # 16-3-4 = 9, 9*2 = 18
    assert calc_steps(JANET) == 2 and reasoning_quality(JANET)
    assert consistent(JANET) is True  # answer 18 = result of the last computation, $18
    assert calc_correct_frac(JANET) == 1.0


def test_gsm8k_annotations_count_once():
    # "16 - 3 = <<16-3=13>>13": the visible work and its annotation are one computation
    text = "16 - 3 = <<16-3=13>>13 eggs. 13 * 2 = <<13*2=26>>26 dollars.\n#### 26"
    assert [(c.expr, c.result) for c in computations(text)] == [("16-3", "13"), ("13*2", "26")]
    assert calc_steps("She has <<16-3=13>>13 eggs.") == 1  # an annotation alone counts too


def test_chains_parentheses_and_notation():
    assert [c.result for c in computations("3 * 4 = 12 + 2 = 14")] == ["12", "14"]  # a chain is two steps
    assert computations("(3 + 4) * 2 = 14")[0].value == 14
    assert computations("2 * (3 + 4) = 14")[0].value == 14
    assert computations("$1,200 / 4 = $300.")[0].value == 300
    assert computations("\\(3 \\times 4 = 12\\)")[0].value == 12  # LaTeX \times
    assert computations("(so 3 + 4 = 7)")[0].value == 7 and computations("(3 + 4 = 7)")[0].value == 7
    assert computations("2 x 3 = 6")[0].value == 6 and computations("6 ÷ 3 = 2")[0].value == 2
    assert computations("20% * 50 = 10")[0].value == 10  # 20% = 0.2
    assert computations("5 - 8 = -3")[0].result == "-3"
    assert computations("1/2 + 1/4 = 3/4")[0].result == "3/4"  # a fraction result when no "=" follows it


def test_chains_that_rewrite_an_expression():
    # the number after the first "=" (4) is not 4 * 60 / 5 = 48 and an operator follows it: a rewriting
    assert [(c.expr, c.result) for c in computations("4 * 60 / 5 = 4 * 12 = 48")] == [("4 * 12", "48")]
    assert [(c.expr, c.result) for c in computations("3 * 4 = 13 + 2 = 15")] == [("13 + 2", "15")]  # slip unseen
    assert [(c.expr, c.result) for c in computations("6 * 2 = 12/2 = 6")] == [("12/2", "6")]
    text = "(30 - 12)/2 = 18/2 = <<(30-12)/2=9>>9"
    assert [(c.expr, c.result) for c in computations(text)] == [("(30-12)/2", "9")]


def test_numbers_as_written():
    assert computations("3 / 2 = 1 1/2 hours")[0].result == "1 1/2" and calc_steps("3 / 2 = 1 1/2") == 1
    assert calc_is_right(computations("3 / 2 = 1 1/2 hours")[0])  # 1 + 1/2 = 3/2
    assert calc_is_right(computations("30 x .25 = 7.5")[0])  # ".25" is a number
    assert calc_is_right(computations("200*40*.01 = 80")[0])  # ".01" keeps its zero: 200 * 40 / 100 = 80
    assert calc_is_right(computations("1 \u2013 3/4 = 1/4")[0])  # an en dash as minus


def test_what_is_not_a_computation():
    assert calc_steps("2x + 3 = 7") == 0 and calc_steps("x * (4/5) = 240") == 0  # algebra: a variable
    assert calc_steps("27(1/3) = 9") == 0  # an implicit product
    assert calc_steps("$350 000 + $17500 = $367 500") == 0  # a space as thousands separator
    assert calc_steps("x = <<40=40>>40") == 0  # one number, no operator
    assert calc_steps("3 apples + 4 apples = 7 apples") == 0  # words between the numbers
    assert calc_steps("x = 3 + 4") == 0  # "3 + 4" is not followed by "= number"
    assert calc_steps("3 + 4 =\n7") == 0  # a computation stays on one line
    assert calc_steps("The answer is 42.") == 0
    assert calc_steps("In 2023-10 = bad") == 0


def test_arithmetic_right_or_wrong():
    def right(text):
        return calc_is_right(computations(text)[0])

    assert right("10 / 3 = 3.33")  # |3.333.. - 3.33| = 0.0033 < 0.005, half a unit of the 2nd decimal
    assert not right("7 / 2 = 3")  # 3.5 is not within less than 0.5 of 3 (a tie is not rounding)
    assert right("7 / 2 = 3.5")
    assert not right("3 * 4 = 13")
    assert not right("12 / 4 = 3.1")  # the value 3 is whole: the result must be exactly 3
    assert not right("10 / 0 = 5")  # no value
    assert right("0.5 * 100 = 50%") and right("50 * 20% = 10")
    assert not right("1/2 + 1/4 = 3/5")


def test_consistency_and_reasoning_quality():
    assert consistent("3 + 4 = 7\n#### 8") is False  # answer 8, last result 7
    assert consistent("#### 7") is None  # no computation: undefined, left out of the rate
    assert consistent("2 + 5 = 7. The answer is 7.") is True
    # the work ends at 21 but the text's last number (the auto extractor's answer) is 20
    assert consistent("2 + 5 = 7 and 7 * 3 = 21. So she has 20 left.") is False
    # inconsistent with the last step even though an earlier step matched the answer
    assert consistent("2 + 5 = 7, 7 * 3 = 21\n#### 7") is False
    assert not reasoning_quality("3 + 4 = 7\n#### 7") and reasoning_quality("3 + 4 = 7, 7 * 2 = 14\n#### 14")


def test_calc_correct_frac():
    assert calc_correct_frac("16 - 3 = 12, then 12 * 2 = 24.\n#### 24") == 0.5  # 16-3 is 13: wrong; 12*2 right
    assert calc_correct_frac("The answer is 42.") is None


# ---------------------------------------------------------------------------- one record


def test_score_completion_keys_and_values():
    # the work 16-3=12 is wrong (13), the answer 24 follows from it: incorrect for gold 26, yet consistent
    rec = score_completion("16 - 3 = 12, then 12 * 2 = 24.\n#### 24", "26", use_math_verify=False)
    assert rec == {"pred": "24", "correct": False, "strict_correct": False, "correct_strict": False,
                   "correct_flexible": False, "correct_math_verify": None, "lm_eval_strict": False,
                   "lm_eval_flexible": False, "calc_steps": 2, "reasoning_quality": True, "consistent": True,
                   "calc_correct_frac": 0.5}
    rec = score_completion(JANET, "18", solution="... #### 18")
    assert rec["correct"] and rec["correct_strict"] and rec["correct_flexible"] and rec["correct_math_verify"]
    assert rec["lm_eval_strict"] and rec["lm_eval_flexible"]


def test_extractors_disagree_where_expected():
    # "The answer is 18." has no "####": auto finds 18, strict finds nothing, flexible the last number 18
    rec = score_completion("The answer is 18. Great!", "18", use_math_verify=False)
    assert (rec["correct"], rec["correct_strict"], rec["correct_flexible"]) == (True, False, True)
    assert (rec["lm_eval_strict"], rec["lm_eval_flexible"]) == (False, True)
    # "#### 18" then chatter ending in "2 more": auto reads the marker (18), flexible the last number (2)
    rec = score_completion("#### 18\nI hope this helps with 2 more.", "18", use_math_verify=False)
    assert (rec["correct"], rec["correct_strict"], rec["correct_flexible"]) == (True, True, False)


def test_long_chains_without_a_result_do_not_backtrack_exponentially():
    """A rambling completion ("1 + 1 + 1 + ...", no "=") once hung the evaluation: the space after an operator
    could be matched two ways, 2^n tries. The alarm turns a hang into a failure."""
    import signal

    def hang(*_):
        raise TimeoutError("computations() did not return within 30 s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        assert computations("1 + " * 60 + "x") == []
        assert computations("( 1 + " * 60 + "x") == []
        assert [c.result for c in computations("1 + " * 60 + "1 = 61")] == ["61"]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_latex_fractions_are_work():
    # the 0.5B model writes its division as \frac (eval_after of results/default-seed0)
    text = "1. The total:\n   \\[\n   25 + 200 = 225\n   \\]\n2. Each friend:\n   \\[\n   \\frac{225}{9} = 25\n   \\]\n"
    assert [(c.expr, c.result) for c in computations(text)] == [("25 + 200", "225"), ("225/9", "25")]
    assert reasoning_quality(text) and calc_correct_frac(text) == 1.0
    assert calc_is_right(computations("\\dfrac{9 + 3}{4} = 3")[0])  # an expression over a number
    assert not calc_is_right(computations("\\frac{225}{9} = 24")[0])
    assert computations("1 - 1/4 = \\frac{3}{4}")[0].result == "3/4"  # a fraction as the result
