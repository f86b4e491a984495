"""Per-level tables of every metric: hand-made records, hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from cpu_grpo.eval.tables import (
    level_tables,
    mean_summary,
    metric_sentences,
    metric_summary,
    metric_table,
    paired_mean_diff,
    sampled_summary,
    sampled_table,
)


def rec(i, level="basic", **kw):
    return {"id": i, "difficulty": level, **kw}


# 4 problems. correct: before T F F F, after T T T F. consistent: before T None F None, after T T None F.
# calc_steps: before 0 1 2 3, after 2 2 2 2.
BEFORE = [rec(1, correct=True, consistent=True, calc_steps=0), rec(2, correct=False, consistent=None, calc_steps=1),
          rec(3, correct=False, consistent=False, calc_steps=2), rec(4, correct=False, consistent=None, calc_steps=3)]
AFTER = [rec(1, correct=True, consistent=True, calc_steps=2), rec(2, correct=True, consistent=True, calc_steps=2),
         rec(3, correct=True, consistent=None, calc_steps=2), rec(4, correct=False, consistent=False, calc_steps=2)]




def test_rates_before_after_and_paired():
    s = metric_summary(BEFORE, AFTER)["basic"]
    assert set(s) == {"correct", "consistent", "calc_steps"}  # metrics absent from the records are skipped
    c = s["correct"]
    assert (c["before"]["accuracy"], c["after"]["accuracy"]) == (0.25, 0.75)
    # diff = (3 - 1) / 4 = +0.5; discordant b = 0 (right -> wrong), c = 2: McNemar p = 2 * 0.5**2 = 0.5
    assert c["delta"]["diff"] == 0.5 and c["delta"]["p_value"] == 0.5 and c["delta"]["n"] == 4
    # p >= 0.05: not significant, and Newcombe's interval (test_stats checks it on a published example) holds zero
    assert c["delta"]["ci95"] == [pytest.approx(-0.1355, abs=1e-4), pytest.approx(0.7891, abs=1e-4)]
    assert not c["delta"]["significant"]


def test_none_values_leave_their_problems_out():
    s = metric_summary(BEFORE, AFTER)["basic"]["consistent"]
    assert (s["before"]["n"], s["before"]["accuracy"]) == (2, 0.5)  # T, F
    assert s["after"]["n"] == 3 and math.isclose(s["after"]["accuracy"], 2 / 3)  # T, T, F
    assert s["delta"]["n"] == 1 and s["delta"]["diff"] == 0.0  # only problem 1 is defined on both sides: T -> T


def test_means_and_their_paired_change():
    s = metric_summary(BEFORE, AFTER)["basic"]["calc_steps"]
    assert s["before"]["mean"] == 1.5 and s["after"]["mean"] == 2.0
    assert s["delta"]["diff"] == 0.5  # mean of after - before = mean(2, 1, 0, -1)
    lo, hi = s["delta"]["ci95"]
    assert -1 <= lo <= 0.5 <= hi <= 2  # a resampled mean lies between the smallest and largest difference


def test_mean_summary_by_hand():
    s = mean_summary([0.0, 1.0, 2.0, 3.0])
    assert s["mean"] == 1.5 and s["n"] == 4 and 0.0 <= s["ci95"][0] < 1.5 < s["ci95"][1] <= 3.0
    # one value, or all equal: every resample has the same mean
    assert mean_summary([4.0])["ci95"] == [4.0, 4.0] and mean_summary([2.0] * 5)["ci95"] == [2.0, 2.0]
    # n = 2, values 0 and 1: resampled means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so the 2.5th and
    # 97.5th percentiles are the extremes
    assert mean_summary([0.0, 1.0])["ci95"] == [0.0, 1.0]
    assert math.isnan(mean_summary([])["mean"])


def test_paired_mean_diff_constant_shift_is_exact():
    d = paired_mean_diff([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])  # every difference is +1
    assert d["diff"] == 1.0 and d["ci95"] == [1.0, 1.0] and d["significant"]


def test_single_evaluation_table_and_levels():
    recs = BEFORE + [rec(5, level="gsm8k", correct=True, calc_steps=4)]
    s = metric_summary(recs)
    assert set(s) == {"basic", "gsm8k"} and "after" not in s["basic"]["correct"]
    text = metric_table(s)
    assert "| metric | n | value (95% CI) |" in text and "**gsm8k**" in text
    assert "| calculation steps per answer | 1 | 4.00 (4.00-4.00) |" in text
    assert metric_sentences(s) == []


def test_level_tables_for_one_evaluation():
    text = level_tables(metric_summary(BEFORE + [rec(5, level="gsm8k", correct=True, calc_steps=4)]))
    lines = text.splitlines()
    assert lines[2] == "| level | n | auto |"  # only the metrics the records have
    assert lines[4].startswith("| basic | 4 | 25.0% (") and lines[5] == "| gsm8k | 1 | 100.0% (20.7-100.0) |"
    # consistency is defined on 2 of the 4 basic problems (T, F): 50%, and its cell says n=2
    assert "| level | n | consistent | calc steps |" in text
    assert any(line.startswith("| basic | 4 | 50.0% (") and " n=2 | 1.50 (" in line for line in lines)
    assert "| gsm8k | 1 | - | 4.00 (4.00-4.00) |" in text


def test_paired_table_and_sentences():
    text = metric_table(metric_summary(BEFORE, AFTER))
    row = next(line for line in text.splitlines() if line.startswith("| accuracy (auto extractor)"))
    assert row.startswith("| accuracy (auto extractor) | 4 | 25.0% (") and row.endswith("| 0.5 |")
    assert "| +50.0 (-13.5 to +78.9) |" in row
    sentences = metric_sentences(metric_summary(BEFORE, AFTER))
    assert sentences[0].startswith("basic, accuracy (auto extractor): +50.0 points")
    assert sentences[0].endswith("not significant (p >= 0.05).")
    assert any(s.startswith("basic, calculation steps per answer: +0.50") for s in sentences)


def test_paired_cells_over_other_problems_say_their_n():
    # consistency: defined on 2 problems before (T, F), 3 after (T, T, F), and on both sides for problem 1 only
    text = metric_table(metric_summary(BEFORE, AFTER))
    row = next(line for line in text.splitlines() if line.startswith("| answer-work consistency"))
    assert row.startswith("| answer-work consistency | 2 | 50.0% (")
    assert " n=3 | +0.0 (-79.3 to +79.3) n=1 | 1 |" in row  # one pair says little: a wide interval
    full = next(line for line in text.splitlines() if line.startswith("| accuracy (auto extractor)"))
    assert "n=" not in full  # every cell over the row's 4 problems


def test_sampled_summary_and_table():
    # two problems, k = 2: pass@1 = 0.5 and 1.0 (mean 0.75); pass@2 = 1.0 and 1.0; majority right on one
    recs = [rec(1, pass_at={"1": 0.5, "2": 1.0}, maj_correct=False),
            rec(2, pass_at={"1": 1.0, "2": 1.0}, maj_correct=True)]
    s = sampled_summary(recs)["basic"]
    assert s["pass@1"]["mean"] == 0.75 and s["pass@2"]["mean"] == 1.0 and s["maj@2"]["accuracy"] == 0.5
    text = sampled_table(sampled_summary(recs))
    assert text.splitlines()[0] == "| level | n | pass@1 | pass@2 | maj@2 |"
    assert text.splitlines()[2].startswith("| basic | 2 | 75.0% (") and "| 100.0% (100.0-100.0) |" in text
