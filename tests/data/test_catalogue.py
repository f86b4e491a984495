"""reasoning-gym's tasks as `--task rg:NAME[:key=value,...]`: rows from its generators, a held-out split that
never meets training, its verifiers as the default reward and judge (countdown's and code's too), and its bad input
in one sentence."""

from __future__ import annotations

import re
import sys

import pytest

from cpu_grpo import config
from cpu_grpo.cli import _trained_with, main
from cpu_grpo.data.catalogue import reasoning_gym_reward
from cpu_grpo.data.loaders import load_task
from cpu_grpo.data.tasks import TaskError

pytest.importorskip("reasoning_gym")  # the `rg` extra: `make test` installs it where pycosat builds


def test_rows_and_a_held_out_split_that_never_meets_training():
    train = load_task("rg:chain_sum", n=200, seed=0, split="train")
    test = load_task("rg:chain_sum", n=100, seed=0, split="test")
    assert len(train) == 200 and len(test) == 100
    assert not {ex.question for ex in train} & {ex.question for ex in test}
    assert all(ex.split == "train" for ex in train) and all(ex.split == "test" for ex in test)
    ex = train[0]
    assert ex.messages[0]["role"] == "system" and "<answer>" in ex.messages[0]["content"]
    assert ex.messages[1] == {"role": "user", "content": ex.question} and not ex.math and ex.difficulty == "chain_sum"
    assert load_task("rg:chain_sum", n=5, seed=0, split="train") == train[:5]  # the same arguments, the same rows
    other = load_task("rg:chain_sum", n=200, seed=1, split="train")  # another seed, other problems (not a shift)
    assert len({ex.question for ex in train} & {ex.question for ex in other}) < 10
    easy = load_task("rg:basic_arithmetic:min_terms=2,max_terms=2,min_digits=1,max_digits=1", n=20, split="train")
    assert all(len(re.findall(r"\d+", ex.question)) == 2 for ex in easy)  # its config reached the generator


def test_the_verifier_is_the_generators():
    rows = load_task("rg:chain_sum", n=3, seed=0, split="train")
    columns = {k: [ex.columns[k] for ex in rows] for k in ("rg_task", "rg_seed", "rg_index")}
    right = [f"Adding up: <answer>{ex.answer}</answer>" for ex in rows]
    assert reasoning_gym_reward(right, **columns) == [1.0, 1.0, 1.0]
    wrong = [f"<answer>{ex.answer}</answer> no, <answer>{int(ex.answer) + 1}</answer>" for ex in rows]  # the last one
    assert reasoning_gym_reward(wrong, **columns) == [0.0, 0.0, 0.0]
    assert reasoning_gym_reward([ex.answer for ex in rows], **columns) == [0.0, 0.0, 0.0]  # no tags: no answer
    chat = [[{"role": "assistant", "content": r}] for r in right]  # as a chat prompt's completions arrive
    assert reasoning_gym_reward(chat, **columns) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("spec, words", [
    ("rg:chain_summ", "reasoning-gym has no task 'chain_summ' (did you mean chain_sum"),
    ("rg:chain_sum:colour=red", "chain_sum's config takes no colour: it takes "),
    ("rg:chain_sum:min_terms=9,max_terms=2", "reasoning-gym refused the config"),
    ("rg:chain_sum:min_terms", "'min_terms' is not key=value"),
])
def test_bad_specs_are_one_sentence(spec, words):
    with pytest.raises(TaskError) as e:
        load_task(spec, n=5, split="train")
    assert words in str(e.value)


def test_without_the_extra_it_says_the_pip_command(monkeypatch):
    from cpu_grpo.data import catalogue

    catalogue._dataset.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(TaskError, match=r"needs reasoning-gym: pip install 'cpu-grpo\[rg\]'"):
        load_task("rg:chain_sum", n=5, split="train")
    catalogue._dataset.cache_clear()


def test_a_task_brings_its_verifier_as_reward_and_judge():
    for task, reward in (("rg:chain_sum", "reasoning_gym"), ("countdown", "countdown"), ("code", "code"),
                         ("rg:chain_sum+rg:basic_arithmetic", "reasoning_gym")):
        cfg = config.build("demo", None, {"task": task})
        assert (cfg.rewards, cfg.reward_weights) == ([reward], [1.0]), task
        assert _trained_with("smollm2-135m", task)["rewards"] == [reward]  # `cpu-grpo eval` of a base model
    mine = {"task": "countdown", "rewards": "answer_tag", "reward_weights": "1"}
    assert config.build("demo", None, mine).rewards == ["answer_tag"]  # rewards you give win
    assert config.build("demo", None, {"task": "basic"}).rewards == ["correctness", "correct_format"]
    assert _trained_with("smollm2-135m", "basic")["rewards"] == ["correctness"]


@pytest.mark.slow
def test_train_on_a_reasoning_gym_task(tiny_model, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--profile", "demo", "--model", tiny_model, "--task", "rg:chain_sum", "--steps", "2",
                 "--prompts-per-step", "2", "--num-generations", "4", "--max-new-tokens", "8", "--eval-size", "4",
                 "--eval-max-new-tokens", "8", "--output-dir", str(out)]) == 0
    from cpu_grpo.rundir import read_jsonl

    steps = read_jsonl(out / "metrics.jsonl")
    assert len(steps) == 2 and "reward/reasoning_gym_reward" in steps[0]
    assert {r["judge"] for r in read_jsonl(out / "eval_after.jsonl")} == {"reasoning_gym_reward"}
