"""Evaluation records (greedy and sampled) from a scripted sampler, and summary.json / report.md of a run."""

from __future__ import annotations

import math

import pytest

from cpu_grpo.data.example import Example
from cpu_grpo.engine.sampler import Sampling
from cpu_grpo.eval import evaluate
from cpu_grpo.rundir import read_jsonl

EXAMPLES = [Example("Q1?", "18", "basic", "9 * 2 = <<9*2=18>>18\n#### 18", "b-1"),
            Example("Q2?", "7", "basic", "3 + 4 = <<3+4=7>>7\n#### 7", "b-2")]
GREEDY = Sampling(8, (1,), 0, temperature=0.0)


class ScriptedTok:
    """Token id i decodes to texts[i]; prompts are encoded as their length (never decoded)."""

    chat_template = None
    pad_token_id = 0

    def __init__(self, texts):
        self.texts = texts

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(text)]}

    def decode(self, ids, skip_special_tokens=True):
        return self.texts[ids[0]]

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r) for r in rows]


class ScriptedSampler:
    """Returns completions 0, 1, 2, ... in order, and remembers how it was called."""

    def __init__(self):
        self.next, self.calls = 0, []

    def generate(self, prompts, num_generations, sampling, generator=None):
        self.calls.append({"n": len(prompts), "k": num_generations, "temperature": sampling.temperature,
                           "seed": generator.initial_seed() if generator is not None else None})
        out = [[self.next + i] for i in range(len(prompts) * num_generations)]
        self.next += len(out)
        return out


def test_greedy_records_carry_every_metric(tmp_path):
    texts = ["9 * 2 = 18, 18 + 0 = 18\n#### 18", "I think 8."]
    path = tmp_path / "eval.jsonl"
    records = evaluate.run_eval(ScriptedSampler(), ScriptedTok(texts), EXAMPLES, "", GREEDY, path, log=lambda *a: None)
    assert read_jsonl(path) == records
    r1, r2 = records
    assert (r1["id"], r1["completion"], r1["pred"]) == ("b-1", texts[0], "18")
    assert r1["correct"] and r1["strict_correct"] and r1["correct_strict"] and r1["correct_flexible"]
    assert r1["correct_math_verify"] and r1["lm_eval_strict"] and r1["lm_eval_flexible"]
    work = ("calc_steps", "reasoning_quality", "consistent", "calc_correct_frac")
    assert [r1[k] for k in work] == [2, True, True, 1.0]  # 9*2 = 18 and 18+0 = 18, both right; answer 18
    # "I think 8." for gold 7: wrong everywhere, no work
    assert not (r2["correct"] or r2["correct_strict"] or r2["correct_flexible"] or r2["correct_math_verify"])
    assert [r2[k] for k in work] == [0, False, None, None]


def test_sampled_record_by_hand():
    ex = EXAMPLES[0]
    rec = evaluate.sampled_record(ex, ["#### 18", "The answer is 18.0", "#### 17", "no idea"])
    assert rec["preds"] == ["18", "18.0", "17", None] and rec["sample_correct"] == [True, True, False, False]
    # n = 4, c = 2: pass@1 = 2/4; pass@2 = 1 - C(2,2)/C(4,2) = 1 - 1/6; pass@3 = pass@4 = 1 (C(2,3) = 0)
    assert rec["pass_at"]["1"] == 0.5 and math.isclose(rec["pass_at"]["2"], 5 / 6)
    assert rec["pass_at"]["3"] == rec["pass_at"]["4"] == 1.0
    # votes "18", "18" ("18.0" canonicalised), "17": the majority is 18
    assert rec["maj_pred"] == "18" and rec["maj_correct"] and rec["n_correct"] == 2


def test_majority_tie_goes_to_the_first_answer():
    rec = evaluate.sampled_record(EXAMPLES[0], ["#### 17", "#### 18"])
    assert rec["maj_pred"] == "17" and not rec["maj_correct"] and rec["pass_at"]["1"] == 0.5


def test_run_sampled_groups_seed_and_output(tmp_path):
    # k = 2 samples per problem: completions 0, 1 for Q1 and 2, 3 for Q2
    texts = ["#### 18", "#### 5", "#### 7", "#### 7"]
    sampler, path = ScriptedSampler(), tmp_path / "sampled.jsonl"
    records = evaluate.run_sampled(sampler, ScriptedTok(texts), EXAMPLES, "", Sampling(8, (1,), 0, 0.8), 2, 123, path,
                                   log=lambda *a: None, batch_size=4)
    assert sampler.calls == [{"n": 2, "k": 2, "temperature": 0.8, "seed": 123}]  # 4 // 2 prompts per call
    assert [r["completions"] for r in records] == [texts[:2], texts[2:]]
    assert [r["pass_at"]["1"] for r in records] == [0.5, 1.0] and [r["maj_correct"] for r in records] == [True, True]
    assert read_jsonl(path) == records


def test_records_are_written_as_made_and_a_rerun_continues(tmp_path):
    """A stop after the first batch keeps its records; the same evaluation again evaluates only the rest; a file of
    other problems is refused."""
    import pytest

    from cpu_grpo.errors import UserError

    examples = [Example(f"Q{i}?", str(i), "basic", "", f"b-{i}") for i in range(6)]
    texts = [f"#### {i}" for i in range(6)]
    path = tmp_path / "eval.jsonl"
    first = evaluate.run_eval(ScriptedSampler(), ScriptedTok(texts), examples, "", GREEDY, path, log=lambda *a: None,
                              batch_size=2, stop=lambda: True)
    assert [r["id"] for r in first] == ["b-0", "b-1"] and read_jsonl(path) == first
    with open(path, "a") as f:
        f.write('{"id": "b-2", "compl')  # a kill in the middle of a line
    sampler = ScriptedSampler()
    again = evaluate.run_eval(sampler, ScriptedTok(texts[2:]), examples, "", GREEDY, path, log=lambda *a: None,
                              batch_size=2)
    assert [c["n"] for c in sampler.calls] == [2, 2] and [r["id"] for r in again] == [f"b-{i}" for i in range(6)]
    assert [r["id"] for r in read_jsonl(path)] == [f"b-{i}" for i in range(6)] and all(r["correct"] for r in again)
    with pytest.raises(UserError, match="holds records of other problems"):
        evaluate.run_eval(ScriptedSampler(), ScriptedTok(texts), examples[:3], "", GREEDY, path, log=lambda *a: None)


def test_eval_refuses_an_output_whose_directory_is_missing_before_loading_anything(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "cpu_grpo.cli", "eval", "--model", str(tmp_path / "no-model"),
                          "--output", str(tmp_path / "missing" / "e.jsonl")], capture_output=True, text=True)
    assert out.returncode == 2 and "its directory does not exist: create it" in out.stderr


def test_eval_of_a_checkpoint_whose_weights_are_cut_short_is_one_sentence(tiny_model, tmp_path, capsys):
    """`cpu-grpo eval --model CHECKPOINT` with its model.safetensors cut short (a copy that stopped half way): one
    sentence naming the file and that it is damaged, exit code 2, no safetensors traceback."""
    import shutil

    from cpu_grpo.cli import main

    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    shutil.copytree(tiny_model, ckpt)
    weights = ckpt / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    assert main(["eval", "--model", str(ckpt), "--n", "2", "--max-new-tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cpu-grpo: {weights} is damaged (cut short: {size // 2:,} of its {size:,} bytes): copy it "
                          "again, or point --model at another model or checkpoint"), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_sigterm_to_a_real_eval_keeps_its_batches_and_the_same_command_finishes(tiny_model, tmp_path):
    """A real `cpu-grpo eval --output` process sent SIGTERM once its first batch is written: it finishes the batch
    at hand, keeps every record whole, and exits; the same command again evaluates only what the file lacks."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "e.jsonl"
    cmd = [sys.executable, "-m", "cpu_grpo", "eval", "--model", tiny_model, "--task", "basic", "--n", "450",
           "--max-new-tokens", "16", "--output", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (out.is_file() and out.read_text().count("\n") >= 1) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=240)
    kept = read_jsonl(out)
    assert "Traceback" not in stderr and len(kept) in (150, 300), (len(kept), stderr[-2000:])  # 3 batches of 150
    assert out.read_text().endswith("\n")  # no half-written record
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    ids = [r["id"] for r in read_jsonl(out)]
    assert len(ids) == 450 == len(set(ids)) and ids[:len(kept)] == [r["id"] for r in kept]


def test_an_evaluation_batch_says_how_far_it_is(tiny_model, monkeypatch):
    """A batch of 200 problems on a busy machine ran 10 minutes without a word: lines with the token reached, the
    rate and the most time left now come at most every PROGRESS_EVERY seconds (0 here: every token)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cpu_grpo.data.tasks import generate
    from cpu_grpo.engine import progress
    from cpu_grpo.engine.sampler import Sampler

    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)
    tok, model = AutoTokenizer.from_pretrained(tiny_model), AutoModelForCausalLM.from_pretrained(tiny_model)
    sampler = Sampler(model, dtype=torch.float32)
    lines = []
    evaluate.run_eval(sampler, tok, generate("basic", 3, seed=0), "", Sampling(6, (-1,), tok.pad_token_id, 0.0),
                      log=lines.append)
    ticks = [x for x in lines if x.startswith("  eval batch 1/1 (3 problems): token ")]
    assert len(ticks) == 6 and ticks[-1].startswith("  eval batch 1/1 (3 problems): token 6 of at most 6, ")
    assert "tokens/s a row, at most 0 s left" in ticks[-1]
