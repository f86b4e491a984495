"""`cpu-grpo compare`: two hand-made runs side by side; and `cpu-grpo eval` end to end on the tiny model."""

from __future__ import annotations

import gzip
import json

import pytest

from cpu_grpo.cli import main
from cpu_grpo.eval.compare import RunError, compare_runs
from cpu_grpo.eval.tables import compare
from cpu_grpo.rundir import read_jsonl


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(path, lr, after_correct, ids=(1, 2, 3, 4)):
    path.mkdir()
    (path / "train_config.yaml").write_text(f"model: m\nlearning_rate: {lr}\nsteps: 6\n")
    before = [{"id": i, "difficulty": "basic", "correct": False} for i in ids]
    after = [{"id": i, "difficulty": "basic", "correct": c} for i, c in zip(ids, after_correct, strict=True)]
    jsonl(path / "eval_before.jsonl", before)
    jsonl(path / "eval_after.jsonl", after)
    (path / "summary.json").write_text(json.dumps({"levels": compare(before, after)}))
    # rewards 0.1 .. 0.6 over 6 steps: the last 5 average (0.2 + ... + 0.6) / 5 = 0.4
    jsonl(path / "metrics.jsonl", [{"step": s, "reward": s / 10, "accuracy": s / 20, "step_seconds": 2.0 * lr * 1e5,
                                    "peak_rss_mb": 1000.0 + s} for s in range(1, 7)])
    return path



def test_compare_runs(tmp_path):
    a = make_run(tmp_path / "a", 1e-5, [True, False, False, False])
    b = make_run(tmp_path / "b", 2e-5, [True, True, True, False])
    text = compare_runs(a, b)
    config = text.split("## Before")[0]
    assert "| learning_rate | 1e-05 | 2e-05 |" in config and "| steps |" not in config  # only what differs
    assert "Run A (`a`):" in text and "| basic | 4 | 0.0% (" in text
    # the last 5 steps: reward mean 0.4, accuracy 0.2; s/step 2.0 and 4.0; peak RSS 1006
    assert "| reward (last 5) | 0.4 | 0.4 |" in text and "| s/step | 2 | 4 |" in text
    assert "| peak RSS MB | 1006 | 1006 |" in text
    assert "| level | n | run A (95% CI) | run B (95% CI) | B - A (95% CI) | McNemar p |" in text
    # B - A = (3 - 1) / 4 = +0.5; b = 0, c = 2: McNemar p = 0.5; Newcombe's paired interval
    assert "basic, B vs A: +50.0 points (95% CI -13.5 to +78.9, McNemar p = 0.5): not significant (p >= 0.05)." in text


def test_compare_runs_reads_a_cards_gzipped_evaluations(tmp_path):
    a = make_run(tmp_path / "a", 1e-5, [True, False, False, False])
    b = make_run(tmp_path / "b", 1e-5, [True, True, True, False])
    for run in (a, b):  # as experiments/card.py keeps them in results/
        after = run / "eval_after.jsonl"
        (run / "eval_after.jsonl.gz").write_bytes(gzip.compress(after.read_bytes()))
        after.unlink()
    assert "basic, B vs A: +50.0 points" in compare_runs(a, b)


def test_compare_different_problems_is_not_paired(tmp_path):
    a = make_run(tmp_path / "a", 1e-5, [True, False], ids=(1, 2))
    b = make_run(tmp_path / "b", 1e-5, [True, True], ids=(7, 8))
    text = compare_runs(a, b)
    assert "The two configs are the same" in text and "evaluated different problems" in text


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunError, match="is not a run directory"):
        compare_runs(tmp_path, tmp_path)


def test_compare_command(tmp_path, capsys):
    a = make_run(tmp_path / "a", 1e-5, [True, False, False, False])
    b = make_run(tmp_path / "b", 2e-5, [True, True, True, False])
    assert main(["compare", str(a), str(b)]) == 0
    assert "# Run A `a` against run B `b`" in capsys.readouterr().out
    out = tmp_path / "cmp.md"
    assert main(["compare", str(a), str(b), "--output", str(out)]) == 0
    assert out.read_text().startswith("# Run A `a` against run B `b`")
    assert main(["compare", str(a), str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpu-grpo: ") and "is not a run directory" in err and err.count("\n") == 1


def test_compare_two_evaluations_pairs_every_metric(tmp_path, capsys):
    """A base model and a checkpoint on the same problems (one more in B, left out): paired per metric."""
    def records(right: list[bool], extra: int = 0) -> list[dict]:
        return [{"id": f"test.jsonl:{i}", "difficulty": "gsm8k", "correct": c, "lm_eval_strict": c,
                 "lm_eval_flexible": True} for i, c in enumerate(right + [True] * extra)]

    a, b = tmp_path / "base.jsonl", tmp_path / "trained.jsonl"
    jsonl(a, records([False, False, False, True]))
    jsonl(b, records([True, True, True, True], extra=1))
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "- 4 problems evaluated by both" in text
    # 1/4 -> 4/4: +75 points; b = 0, c = 3: McNemar p = 2 * (1/2)^3 = 0.25
    assert "| accuracy (auto extractor) | 4 | 25.0% (" in text and "| +75.0 (" in text and "| 0.25 |" in text
    assert "| lm-eval gsm8k strict-match | 4 |" in text and "| lm-eval gsm8k flexible-extract | 4 | 100.0% (" in text
    assert "gsm8k, B vs A: +75.0 points" in text
    jsonl(b, [{"id": "other", "difficulty": "gsm8k", "correct": True}])
    assert main(["compare", str(a), str(b)]) == 2
    assert "share no problem: evaluate both with the same --task, --n and --seed" in capsys.readouterr().err
    jsonl(b, [{"step": 1, "reward": 0.5}])  # a metrics file is no evaluation
    assert main(["compare", str(a), str(b)]) == 2
    assert "is not an evaluation" in capsys.readouterr().err
    gz = tmp_path / "trained.jsonl.gz"  # as results/ cards keep them
    gz.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records([True] * 4)).encode()))
    assert main(["compare", str(a), str(gz)]) == 0 and "| +75.0 (" in capsys.readouterr().out
    (tmp_path / "model.bin").write_bytes(bytes(range(256)))  # a binary file: one sentence, not a traceback
    assert main(["compare", str(a), str(tmp_path / "model.bin")]) == 2
    assert "is not an evaluation" in capsys.readouterr().err


def test_compare_two_evaluations_reads_the_work_again(tmp_path, capsys):
    """A file written before a fix of the work metric (its stored reasoning_quality says False for two
    computations, one of them a \\frac) compares on today's definition, not on the stored field."""
    text = "25 + 200 = 225, then \\frac{225}{9} = 25. \\boxed{25}"
    old = {"id": "p0", "difficulty": "intermediate", "correct": True, "completion": text,
           "reasoning_quality": False, "calc_steps": 1, "consistent": True, "calc_correct_frac": 1.0}
    a, b = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    jsonl(a, [old])
    jsonl(b, [{**old, "reasoning_quality": True, "calc_steps": 2}])
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "| reasoning quality (>= 2 steps of work) | 1 | 100.0% (" in out and "| +0.0 (" in out


GSM8K_LINES = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
                "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
               {"question": "A pen costs $2. How much do 5 pens cost?", "answer": "5 * 2 = <<5*2=10>>10\n#### 10"}]


def test_eval_command_prints_every_extractor(tiny_model, tmp_path, capsys):
    data = tmp_path / "gsm8k.jsonl"
    jsonl(data, GSM8K_LINES)
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--n", "2", "--max-new-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "| level | n | auto | strict | flexible | math-verify | lm-eval strict-match | lm-eval flexible-extract |" \
        in out and "| gsm8k | 2 | " in out
    assert "| level | n | reasoning quality | " in out and "calc steps" in out


def test_eval_takes_a_whole_file_unless_told(tiny_model, tmp_path):
    """A file is evaluated whole by default, as the help says and lm-eval does (it was cut at 250 problems)."""
    data, out = tmp_path / "three.jsonl", tmp_path / "out.jsonl"
    jsonl(data, GSM8K_LINES + GSM8K_LINES[:1])
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--max-new-tokens", "4",
                 "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 3
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--n", "2", "--max-new-tokens", "4",
                 "--output", str(tmp_path / "two.jsonl")]) == 0
    assert len((tmp_path / "two.jsonl").read_text().splitlines()) == 2
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--n", "2", "--max-new-tokens", "4",
                 "--output", str(out)]) == 2  # out.jsonl holds a third problem: refused, not overwritten
    assert len(out.read_text().splitlines()) == 3


def test_eval_samples_command(tiny_model, tmp_path, capsys):
    outs = [tmp_path / "s1.jsonl", tmp_path / "s2.jsonl"]
    for path in outs:
        assert main(["eval", "--model", tiny_model, "--n", "3", "--max-new-tokens", "6", "--samples", "3",
                     "--temperature", "1.0", "--output", str(path)]) == 0
    text = capsys.readouterr().out
    assert "| level | n | pass@1 | pass@2 | pass@3 | maj@3 |" in text and "| basic | 3 |" in text
    first, second = read_jsonl(outs[0]), read_jsonl(outs[1])
    assert len(first) == 3 and all(len(r["completions"]) == 3 and set(r["pass_at"]) == {"1", "2", "3"}
                                   for r in first)
    assert [r["completions"] for r in first] == [r["completions"] for r in second]  # seeded: replayable
    assert main(["eval", "--model", tiny_model, "--samples", "2", "--temperature", "0"]) == 2


@pytest.mark.slow
def test_a_checkpoint_is_evaluated_on_its_runs_held_out_rows_and_trained_rows_are_never_a_gain(tiny_model, tmp_path,
                                                                                               capsys):
    """The issue's trap: a base model and a checkpoint evaluated on the whole file its run trained on, then compared,
    called +5.8 points "a significant improvement" where 486 of 600 rows were trained on. Now eval keeps a run's
    held-out rows by default and says how many rows are training rows; compare leaves training rows out, loudly."""
    import shutil

    from cpu_grpo.data.tasks import split_of

    rows = [{"question": f"Ann has {i} apples and gets {i + 2} more. How many now?",
             "answer": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}"} for i in range(40)]
    data = tmp_path / "mine.jsonl"
    jsonl(data, rows)
    held = [f"mine.jsonl:{i + 1}" for i, r in enumerate(rows) if split_of(r["question"]) == "test"]
    ckpt = tmp_path / "run" / "checkpoints" / "step-000010"
    shutil.copytree(tiny_model, ckpt)
    (ckpt / "train_config.yaml").write_text(f"task: {data}\nrewards: [correctness]\n")
    base, trained = tmp_path / "base.jsonl", tmp_path / "trained.jsonl"
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--max-new-tokens", "2", "--output",
                 str(base)]) == 0
    said = capsys.readouterr().err
    assert f"task {data}: 40 rows, {40 - len(held)} of them in the training split of a run on it: evaluating all " \
        "rows (the default" in said
    assert main(["eval", "--model", str(ckpt), "--task", str(data), "--max-new-tokens", "2", "--output",
                 str(trained)]) == 0
    assert "this model was trained on it: evaluating the held-out rows (the default" in capsys.readouterr().err
    assert sorted(r["id"] for r in read_jsonl(trained)) == sorted(held) and 0 < len(held) < 20
    assert {r["split"] for r in read_jsonl(base)} == {"train", "test"}
    # the whole file evaluated for both: compare leaves the training rows out and says so
    assert main(["eval", "--model", str(ckpt), "--task", str(data), "--max-new-tokens", "2", "--split", "all",
                 "--output", str(tmp_path / "trained-all.jsonl")]) == 0
    capsys.readouterr()
    assert main(["compare", str(base), str(tmp_path / "trained-all.jsonl")]) == 0
    text = capsys.readouterr().out
    assert f"**Warning: {40 - len(held)} of the 40 problems both evaluated are training rows" in text
    assert f"- {len(held)} problems evaluated by both" in text
    assert main(["compare", str(base), str(tmp_path / "trained-all.jsonl"), "--include-trained"]) == 0
    assert "- 40 problems evaluated by both (held-out and training rows" in capsys.readouterr().out
    assert main(["eval", "--model", str(ckpt), "--task", str(data), "--max-new-tokens", "2", "--split", "train",
                 "--output", str(tmp_path / "trained-train.jsonl")]) == 0
    jsonl(tmp_path / "base-train.jsonl", [r for r in read_jsonl(base) if r["split"] == "train"])
    assert main(["compare", str(tmp_path / "base-train.jsonl"), str(tmp_path / "trained-train.jsonl")]) == 2
    assert "every problem both evaluations share is a training row" in capsys.readouterr().err


def test_a_held_out_row_is_never_a_training_row(tmp_path):
    """Prompts that differ only by spaces, and a dataset whose test split repeats training rows: the repeats are
    training rows, left out of the held-out set with a warning (docs/tasks.md: a held-out row is never trained on)."""
    import warnings

    from cpu_grpo.data.loaders import load_task
    from cpu_grpo.data.tasks import split_of

    base = [f"Convert {i} metres to centimetres." for i in range(200)]
    twins = [q.replace(" to ", "  to ") for q in base]  # the same prompt, a double space
    crossed = [(a, b) for a, b in zip(base, twins, strict=True) if split_of(a) != split_of(b)]
    assert crossed  # a hash splits some twins across train and test
    data = tmp_path / "spaces.jsonl"
    jsonl(data, [{"prompt": q, "answer": "x"} for q in base + twins])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held = load_task(str(data), split="test")
    trained = {" ".join(ex.question.split()) for ex in load_task(str(data), split="train")}
    assert held and not {" ".join(ex.question.split()) for ex in held} & trained
    assert any("held-out row(s) repeat a training row" in str(w.message) for w in caught)
    pytest.importorskip("datasets")
    from datasets import Dataset, DatasetDict

    train = Dataset.from_list([{"prompt": q, "answer": "x"} for q in base[:50]])
    test = Dataset.from_list([{"prompt": q, "answer": "x"} for q in base[40:60]])  # 10 of them trained on
    DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        held = load_task(str(tmp_path / "dd"), split="test")
    assert [ex.question for ex in held] == base[50:60]
    assert any("10 held-out row(s) repeat a training row" in str(w.message) for w in caught)


@pytest.mark.slow
def test_a_reward_that_scores_every_problem_0_is_said_with_the_columns_types(tiny_model, tmp_path, capsys):
    """A Parquet file written by pandas turned a column of digit strings into integers, and a reward comparing text
    scored 0 on every row without a word: the evaluation now says so, with each column's type."""
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"prompt": [f"Say {i}." for i in range(12)], "answer": [str(i) for i in range(12)]}).astype(
        {"answer": int}).to_parquet(tmp_path / "rows.parquet")
    (tmp_path / "r.py").write_text("def same(completions, answer, **kw):\n"
                                   "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
                                   "def anything(completions, **kw):\n    return [1.0] * len(completions)\n")
    base = ["eval", "--model", tiny_model, "--task", str(tmp_path / "rows.parquet"), "--max-new-tokens", "2"]
    assert main([*base, "--correct-reward", f"{tmp_path / 'r.py'}:same"]) == 0
    assert "note: reward same scored every one of the 12 problems it judged 0: if that is not what you expect, " \
        "check the columns it reads and their types (answer: int)" in capsys.readouterr().out
    assert main([*base, "--correct-reward", f"{tmp_path / 'r.py'}:anything"]) == 0
    assert "scored every one" not in capsys.readouterr().out
