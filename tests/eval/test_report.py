"""report.md parts: the forgetting matrix (hand-made data) and the PNG plots of the training curves."""

from __future__ import annotations

import json
import sys

from cpu_grpo import config
from cpu_grpo.eval import report
from cpu_grpo.eval.forgetting import forgetting_lines, forgetting_table
from cpu_grpo.eval.plots import series, stage_boundaries, write_plots


def cell(acc, n=5):
    return {"accuracy": acc, "ci95": [max(0.0, acc - 0.1), min(1.0, acc + 0.1)], "n": n}


FORGETTING = {"levels": ["basic", "intermediate"], "rows": [
    {"after": "base", "cells": {"basic": cell(0.2), "intermediate": cell(0.1)}},
    {"after": "basic", "cells": {"basic": cell(0.6), "intermediate": cell(0.15)}},
    {"after": "intermediate", "cells": {"basic": cell(0.4), "intermediate": cell(0.4)}}]}


def records(level, correct):
    return "".join(json.dumps({"id": i, "difficulty": level, "correct": c}) + "\n" for i, c in enumerate(correct))




def test_forgetting_matrix_table():
    text = forgetting_table(FORGETTING)
    lines = text.splitlines()
    assert lines[0] == "| after stage \\ evaluated level | basic | intermediate |"
    assert lines[2] == "| base | 20.0% (10.0-30.0, n=5) | 10.0% (0.0-20.0, n=5) |"
    assert lines[4] == "| intermediate | 40.0% (30.0-50.0, n=5) | 40.0% (30.0-50.0, n=5) |"
    # basic: 60.0% after its own stage, 40.0% at the end: -20.0 points; intermediate was trained last: no line
    assert forgetting_lines(FORGETTING) == [
        "- basic: 60.0% right after its own stage, 40.0% after `intermediate`: -20.0 points (unpaired: no "
        "per-problem records)"]


def test_forgetting_is_paired_when_the_stage_records_exist(tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "after-1-basic.jsonl").write_text(records("basic", [True, True, True, False, False]))
    (tmp_path / "evals" / "after-2-intermediate.jsonl").write_text(records("basic", [True, True, False, False, False]))
    # one pair right -> wrong, none wrong -> right: diff -1/5; McNemar p = min(1, 2 * 0.5) = 1; Newcombe's interval
    assert forgetting_lines(FORGETTING, tmp_path) == [
        "- basic, from after `basic` to after `intermediate`: -20.0 points (95% CI -54.6 to +25.2, McNemar p = 1): "
        "not significant (p >= 0.05)."]


def test_forgetting_without_own_stage_rows():
    data = {"levels": ["gsm8k"], "rows": [{"after": "base", "cells": {"gsm8k": cell(0.1)}},
                                          {"after": "stage-1", "cells": {"gsm8k": cell(0.2)}}]}
    assert forgetting_lines(data) == [] and "Change on each level" not in forgetting_table(data)


METRICS = [{"step": s, "reward": 0.1 * s, "reward/correctness_reward": 0.05 * s, "accuracy": 0.1 * s,
            "frac_zero_std": 0.5, "completion_len": 40.0 + s, "stage_index": 0 if s <= 2 else 1,
            "ewc_penalty": float("nan") if s <= 2 else 0.01, "grad_norm": 0.3, "step_seconds": 1.0,
            "peak_rss_mb": 100.0}
           for s in (1, 2, 3, 4)]


def test_series_and_stage_boundaries():
    assert stage_boundaries(METRICS) == [2.5]  # stage 0 ends at step 2, stage 1 starts at step 3
    assert stage_boundaries([{"step": 1}, {"step": 2}]) == []
    found = series(METRICS, ["reward", "reward/"])
    assert list(found) == ["reward", "reward/correctness_reward"] and found["reward"][0] == [1, 2, 3, 4]
    assert series(METRICS, ["ewc_penalty"]) == {"ewc_penalty": ([3, 4], [0.01, 0.01])}  # NaN steps skipped
    assert series(METRICS, ["kl"]) == {}


def test_write_plots(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in METRICS))
    paths = write_plots(tmp_path)
    assert [p.name for p in paths] == ["reward.png", "accuracy.png", "frac_zero_std.png", "completion_len.png",
                                       "ewc_penalty.png", "grad_norm.png"]
    assert all(p.parent == tmp_path / "plots" and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert write_plots(tmp_path / "nothing-here") == []


def test_step_records_keep_a_resumed_runs_later_record_of_a_repeated_step(tmp_path):
    from cpu_grpo.eval.plots import step_records

    logged = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.2}, {"step": 2, "reward": 0.3}, {"event": "x"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in logged))
    assert step_records(tmp_path) == [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.3}]


def test_report_embeds_plots_or_says_why_not(tmp_path, monkeypatch):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in METRICS))
    (tmp_path / "forgetting.json").write_text(json.dumps(FORGETTING))
    summary = {"model": "m", "task": "basic", "steps": 4, "wall_seconds": 60.0, "levels": {}, "metrics": {}}
    text = report.write_report(tmp_path, None, summary).read_text()
    assert "![reward](plots/reward.png)" in text and "![ewc_penalty](plots/ewc_penalty.png)" in text
    assert "## Forgetting matrix" in text and "| basic | 60.0% (50.0-70.0, n=5) |" in text
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    text = report.write_report(tmp_path, None, summary).read_text()
    assert "(No plots: matplotlib is not installed: run `pip install matplotlib` to get the plots.)" in text


def test_write_summary_and_report(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    before = [{"id": "b-1", "difficulty": "basic", "question": "Q1?", "answer": "18", "completion": "#### 17",
               "correct": False, "consistent": None, "calc_steps": 0},
              {"id": "b-2", "difficulty": "basic", "question": "Q2?", "answer": "7", "completion": "#### 7",
               "correct": True, "consistent": None, "calc_steps": 0}]
    after = [dict(before[0], completion="9 * 2 = 18\n#### 18", correct=True, consistent=True, calc_steps=1),
             dict(before[1])]
    for name, recs in (("eval_before.jsonl", before), ("eval_after.jsonl", after)):
        (run / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = config.build(None, None, {"model": "m", "task": "basic"})
    summary = report.write_summary(run, cfg, 3, 60.0, log=lambda *a: None)
    assert summary["levels"]["basic"]["after"]["accuracy"] == 1.0  # the existing keys stay
    assert summary["metrics"]["basic"]["calc_steps"]["after"]["mean"] == 0.5
    assert json.loads((run / "summary.json").read_text()) == json.loads(json.dumps(summary))
    text = (run / "report.md").read_text()
    assert "## Every metric, per level" in text and "| accuracy (auto extractor) | 2 | 50.0% (" in text
    assert "## Problems that changed" in text and "'9 * 2 = 18\\n#### 18'" in text
    assert "By problem type" not in text  # these records name no type (problems from a file)


def test_report_shows_each_problem_type(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    book = "A book about _ has _ pages ..."
    kinds = {"b-1": "_ wants a bike that costs ...", "b-2": book, "b-3": book}
    for name, right in (("eval_before.jsonl", {"b-3"}), ("eval_after.jsonl", {"b-2", "b-3"})):
        (run / name).write_text("".join(json.dumps({"id": i, "difficulty": "intermediate", "template": k,
                                                    "question": "Q?", "answer": "1", "completion": "",
                                                    "correct": i in right}) + "\n" for i, k in kinds.items()))
    report.write_summary(run, config.build(None, None, {"model": "m", "task": "intermediate"}), 1, 1.0,
                         log=lambda *a: None)
    text = (run / "report.md").read_text()
    assert "| intermediate | _ wants a bike that costs ... | 1 | 0 (0%) | 0 (0%) |" in text
    assert "| intermediate | A book about _ has _ pages ... | 2 | 1 (50%) | 2 (100%) |" in text


def test_summary_reads_the_work_again(tmp_path):
    """A reused eval_before.jsonl written before a fix of the work metric (its stored fields count one step in
    two computations, one a \\frac) is summarised on today's definition, like the run's own eval_after.jsonl."""
    run = tmp_path / "run"
    run.mkdir()
    text = "25 + 200 = 225, then \\frac{225}{9} = 25. \\boxed{25}"
    old = {"id": "i-1", "difficulty": "intermediate", "question": "Q?", "answer": "25", "completion": text,
           "correct": True, "reasoning_quality": False, "calc_steps": 1, "consistent": True, "calc_correct_frac": 1.0}
    for name, rec in (("eval_before.jsonl", old), ("eval_after.jsonl", {**old, "reasoning_quality": True,
                                                                         "calc_steps": 2})):
        (run / name).write_text(json.dumps(rec) + "\n")
    cfg = config.build(None, None, {"model": "m", "task": "intermediate"})
    summary = report.write_summary(run, cfg, 1, 1.0, log=lambda *a: None)
    steps = summary["metrics"]["intermediate"]["calc_steps"]
    assert steps["before"]["mean"] == steps["after"]["mean"] == 2.0


def test_problems_that_changed_when_the_base_records_keep_no_text(tmp_path):
    # a run may reuse a base evaluation from a results card, whose compact records keep no completion
    (tmp_path / "eval_before.jsonl").write_text(records("basic", [False, True]))
    after = [{"id": i, "difficulty": "basic", "correct": True, "question": f"q{i}", "answer": "1",
              "completion": "\\boxed{1}"} for i in range(2)]
    (tmp_path / "eval_after.jsonl").write_text("".join(json.dumps(r) + "\n" for r in after))
    assert report._samples(tmp_path) == "(problems changed: 1; their records keep no completions to show)"
    with_text = [dict(r, completion="no idea", question=f"q{r['id']}", answer="1") for r in
                 map(json.loads, records("basic", [False, True]).splitlines())]
    (tmp_path / "eval_before.jsonl").write_text("".join(json.dumps(r) + "\n" for r in with_text))
    assert report._samples(tmp_path).startswith("**q0** (answer 1)\n\n- before (wrong): 'no idea'\n- after (right)")


def test_a_gain_that_one_answer_matches_is_said(tmp_path):
    """letter_counting's seed 0 went 6% -> 76% by answering 1 to everything, which 78% of its answers are: the
    summary, the report and the console say what the constant scores against the model."""
    run = tmp_path / "run"
    run.mkdir()
    answers = ["1"] * 16 + ["2", "3", "2", "4"]
    for name, right in (("eval_before.jsonl", set()), ("eval_after.jsonl", set(range(16)))):
        (run / name).write_text("".join(json.dumps({"id": i, "difficulty": "letters", "answer": a, "question": "Q?",
                                                    "completion": "<answer>1</answer>", "correct": i in right}) + "\n"
                                        for i, a in enumerate(answers)))
    said = []
    summary = report.write_summary(run, config.build(None, None, {"model": "m", "task": "basic"}), 1, 1.0,
                                   log=said.append)
    check = summary["levels"]["letters"]["constant"]
    assert (check["answer"], check["accuracy"], check["vs_model"]["diff"]) == ("1", 0.8, 0.0)
    sentence = ('letters: answering "1" to every problem scores 80.0% (16 of 20); the model 80.0%, +0.0 points '
                "against it (McNemar p = 1): what it gained is no more than the constant.")
    assert sentence in said and sentence in (run / "report.md").read_text()
    assert summary["levels"]["letters"]["delta"]["significant"]  # the change from the base alone says otherwise
