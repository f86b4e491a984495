"""Tasks of your own: rows from every supported source in TRL's convention, the columns a reward needs checked
before anything runs, a reward that raises on one row, and the three examples of docs/tasks.md trained and
evaluated end to end on the tiny model."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from cpu_grpo import config
from cpu_grpo.data import rewards
from cpu_grpo.data.loaders import RowFormat, load_task
from cpu_grpo.data.tasks import TaskError
from cpu_grpo.errors import RewardError, UserError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROWS = [{"prompt": f"Say the word number {i}.", "solution": f"w{i}", "level": "easy" if i % 2 else "hard"}
        for i in range(40)]


def test_every_source_gives_the_same_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "a.json").write_text(json.dumps({"data": ROWS}))
    with open(tmp_path / "a.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows(ROWS)
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "a.parquet")
    for name in ("a.jsonl", "a.csv"):
        (tmp_path / f"{name}.gz").write_bytes(gzip.compress((tmp_path / name).read_bytes()))
    seen = []
    for name in ("a.jsonl", "a.json", "a.csv", "a.parquet", "a.jsonl.gz", "a.csv.gz"):
        train, test = (load_task(str(tmp_path / name), split=s) for s in ("train", "test"))
        assert len(train) + len(test) == 40 and not {e.question for e in train} & {e.question for e in test}
        assert all(not e.math and e.columns["solution"] == f"w{e.question.split()[-1][:-1]}" for e in train)
        seen.append([(e.question, e.difficulty) for e in test])
    assert all(s == seen[0] for s in seen) and {d for _, d in seen[0]} <= {"easy", "hard"}
    (tmp_path / "cut.jsonl.gz").write_bytes((tmp_path / "a.jsonl.gz").read_bytes()[:-20])  # a copy cut short
    with pytest.raises(TaskError, match="not a whole gzip file: compress it again"):
        load_task(str(tmp_path / "cut.jsonl.gz"))


def test_chat_prompts_a_column_map_and_a_saved_dataset(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}], "gold": str(i)} for i in range(30)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fmt = RowFormat.parse("prompt", "messages:prompt,gold:answer")
    data = load_task(str(tmp_path / "c.jsonl"), split=None, fmt=fmt)
    assert data[3].messages == ({"role": "user", "content": "q3"},) and data[3].answer == "3"
    assert data[3].chat("ignored for own rows", "Be brief.") == [{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": "q3"}]
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:20]),
                          "test": datasets.Dataset.from_list(rows[20:])}).save_to_disk(str(tmp_path / "saved"))
    test = load_task(str(tmp_path / "saved"), split="test", fmt=fmt)
    assert [e.answer for e in test] == [str(i) for i in range(20, 30)]  # the dataset's own test split, whole
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:20]),
                          "test": datasets.Dataset.from_list(rows[:10])}).save_to_disk(str(tmp_path / "twins"))
    with pytest.warns(UserWarning), pytest.raises(TaskError, match=r"twins: every one of its 10 held-out rows "
                                                                   r"repeats a training row .*give a test split"):
        load_task(str(tmp_path / "twins"), split="test", fmt=fmt)


@pytest.mark.parametrize("rows, words", [
    ([{"text": "hi", "label": 1}], "no 'prompt' column (its columns: 'text', 'label'): name the prompt's column with "
                                   "--prompt-column"),
    ([{"prompt": "", "x": 1}], "must be non-empty text or a list of chat messages"),
    ([{"prompt": [{"role": "user"}]}], "must be non-empty text or a list of chat messages"),
    ([{"prompt": "a", "n": 1}, {"prompt": "b", "n": "two"}], "column 'n' holds number (m.jsonl:1) and str (m.jsonl:2)"),
])
def test_bad_rows_say_which_line_and_what_to_do(tmp_path, rows, words):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TaskError, match=None) as err:
        load_task(str(path), split=None)
    assert words in str(err.value)


def test_a_reward_that_needs_a_missing_column_is_refused_before_anything_runs(tmp_path, tiny_model):
    from cpu_grpo.train.loop import train

    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = config.build(None, None, dict(model=tiny_model, task=str(tmp_path / "t.jsonl"), rewards=["exact_match"],
                                        reward_weights=[1.0], output_dir=str(tmp_path / "run"), steps=1))
    with pytest.raises(RewardError, match=r"reward exact_match_reward needs column 'answer', which task .* lacks "
                                          r"\(its columns: level, solution; .*--column-map 'yours:answer'"):
        train(cfg, log=lambda *a: None)
    assert not (tmp_path / "run" / "eval_before.jsonl").exists()


def test_a_reward_that_raises_on_one_row_scores_it_zero_and_says_where():
    def picky(completions, answer, **kw):
        return [1.0 if int(a) > 0 else 0.0 for a in answer]  # int("x") raises

    lines = []
    got = rewards.call_reward(picky, ["a", "b", "c"], {"answer": ["1", "x", "2"]}, ["r1", "r2", "r3"], lines.append)
    assert got == [1.0, 0.0, 1.0]
    assert "reward function picky raised ValueError" in lines[0] and "on row r2" in lines[0] and \
        "test_own_task.py:" in lines[0]
    with pytest.raises(RewardError, match="and on every other completion of the step: fix the function"):
        rewards.call_reward(picky, ["a"], {"answer": ["x"]}, ["r1"], lines.append)


@pytest.mark.slow
@pytest.mark.parametrize("example", ["chat", "disk", "code"])
def test_the_three_examples_of_the_docs_train_and_evaluate(example, tmp_path, tiny_model, monkeypatch):
    """docs/tasks.md's three examples, as written there, on the tiny model: 2 steps, held-out before and after."""
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    fields = {
        "chat": dict(task=str(EXAMPLES / "chat-task" / "data.jsonl"), reward_weights=[1.0],
                     rewards=[f"{EXAMPLES / 'chat-task' / 'rewards.py'}:capital_reward"]),
        "disk": dict(task=str(tmp_path / "mc"), column_map="problem:prompt,label:answer", rewards=["choice"],
                     reward_weights=[1.0]),
        "code": dict(task=str(EXAMPLES / "code-task" / "tasks.jsonl"), rewards=["code"], reward_weights=[1.0]),
    }[example]
    if example == "disk":
        pytest.importorskip("datasets")
        import runpy
        import sys

        monkeypatch.setattr(sys, "argv", ["make_dataset.py", str(tmp_path / "mc")])
        runpy.run_path(str(EXAMPLES / "disk-task" / "make_dataset.py"), run_name="__main__")
    cfg = config.build(None, None, dict(model=tiny_model, output_dir=str(tmp_path / "run"), steps=2,
                                        prompts_per_step=2, num_generations=2, max_new_tokens=16, eval_size=4,
                                        eval_max_new_tokens=16, **fields))
    said = []
    run = train(cfg, log=lambda *a: said.append(" ".join(map(str, a))))
    before, after = read_jsonl(run / "eval_before.jsonl"), read_jsonl(run / "eval_after.jsonl")
    assert len(before) == len(after) >= 1 and all(set(r) >= {"id", "pred", "correct", "finished"} for r in after)
    assert (example == "code") == any(line.startswith("code sandbox: ") for line in said)  # which isolation, said
    assert "calc_steps" not in after[0]  # the math metrics only for math
    groups = read_jsonl(run / "groups.jsonl")
    assert len(groups) == 4 and all(len(g["completions"]) == 2 for g in groups)
    report = (run / "report.md").read_text()
    judge = {"chat": "capital_reward", "disk": "choice_reward", "code": "code_reward"}[example]
    assert f"accuracy (reward {judge})" in report and "auto extractor" not in report  # what judged it, said
    assert "(answer )" not in report and "the math metrics do not apply" in report
    assert {r["judge"] for r in after} == {judge}


@pytest.mark.slow
def test_a_prompt_too_long_for_the_context_is_found_at_load_with_its_line(tmp_path, tiny_model):
    """Checked once when the data is loaded, not when a batch happens to draw it (then on every resume)."""
    from cpu_grpo.train.loop import train

    rows = [{"prompt": f"Say {i}.", "solution": str(i)} for i in range(40)]
    rows[7]["prompt"] = "word " * 2000  # past the tiny model's 1,024 positions
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = dict(model=tiny_model, task=str(tmp_path / "t.jsonl"), rewards=["exact_match"], reward_weights=[1.0],
                  column_map="solution:answer", steps=1, prompts_per_step=2, num_generations=2, max_new_tokens=8,
                  eval_size=0)
    with pytest.raises(UserError, match=r"1 prompt\(s\) of task .* do not fit the model's context of 1024 "
                                                    r"tokens with 8 new tokens \(first: t.jsonl:8, .*--skip-bad-lines"):
        train(config.build(None, None, dict(output_dir=str(tmp_path / "a"), **fields)), log=lambda *a: None)
    lines = []
    train(config.build(None, None, dict(output_dir=str(tmp_path / "b"), skip_bad_lines=True, **fields)),
          log=lines.append)
    assert any("do not fit" in str(line) and "left out" in str(line) for line in lines)


def test_sampled_accuracy_is_judged_as_the_evaluations_judge():
    """The training log's accuracy: rows of your own by the correct reward scoring 1 (a math reward that finds a
    number in a code completion says nothing), math rows by their answer; with correct_reward, every row by it."""
    import torch

    from cpu_grpo.data.example import Example
    from cpu_grpo.train.rollout import Rollout, Scored, correct

    code = Example("Write `f(x)`", "f with {'k': 8}", "code", id="c", columns={"tests": "check(f(1), 8)"}, math=False)
    math = Example("What is 2 + 2?", "4", "basic", id="m")
    texts = ["return 8", "return x * 8", "#### 4", "#### 5"]
    rollout = Rollout([code, math], [[1], [1]], [[1]] * 4, texts, [False] * 4)
    cfg = config.build(None, None, dict(num_generations=2, rewards=["code", "format"], reward_weights=[1, 0.2]))
    scored = Scored(torch.zeros(4), {"code_reward": [0.0, 1.0, 0.0, 0.0], "format_reward": [1.0, 1.0, 1.0, 1.0]})
    assert correct(cfg, rollout, scored) == [False, True, True, False]
    cfg = config.build(None, None, dict(num_generations=2, rewards=["code", "format"], reward_weights=[1, 0.2],
                                        correct_reward="format"))
    assert correct(cfg, rollout, scored) == [True, True, True, True]
