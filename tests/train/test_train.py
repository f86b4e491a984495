"""End to end on a tiny random model: 3 steps change the weights, write checkpoints and 3 JSONL records,
and --resume continues at step 4 with the same data order."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cpu_grpo import config
from cpu_grpo.cli import main
from cpu_grpo.config import ConfigError, plan
from cpu_grpo.engine.models import ModelError
from cpu_grpo.errors import RunDirError, UserError
from cpu_grpo.rundir import read_jsonl
from cpu_grpo.train import checkpoint
from cpu_grpo.train.grpo import group_advantages
from cpu_grpo.train.loop import train
from cpu_grpo.train.runstate import TrainingError
from cpu_grpo.train.step import teaching


def tiny_cfg(model: str, out: Path, reward: Path, **kw) -> config.TrainConfig:
    values = dict(model=model, output_dir=str(out), steps=3, prompts_per_step=2, num_generations=4,
                  max_new_tokens=12, eval_size=6, eval_max_new_tokens=8, save_every=2,
                  rewards=[f"{reward}:length_reward"], reward_weights=[1.0], learning_rate=1e-3, train_size=50,
                  score_truncated=True)  # the random model never ends a completion
    values.update(kw)
    return config.build(None, None, values)


@pytest.mark.slow
def test_three_steps_then_resume(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file), log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["frac_zero_std"] < 1 for m in metrics)
    assert all(isinstance(m["loss"], float) and m["time_update"] > 0 for m in metrics)
    assert all(0 < m["rss_mb"] <= m["peak_rss_mb"] * 1.01 for m in metrics)  # memory now, within the peak so far
    ckpts = checkpoint.complete(out / "checkpoints")
    assert [c.name for c in ckpts] == ["step-000002", "step-000003"]
    last = ckpts[-1]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "train_config.yaml", "trainer_state.pt"):
        assert (last / name).exists(), name
    trained = load_file(last / "model.safetensors")
    base = load_file(Path(tiny_model) / "model.safetensors")
    changed = [k for k in base if not torch.equal(base[k], trained[k])]
    assert len(changed) > len(base) // 2  # full fine-tuning moved most tensors
    groups = read_jsonl(out / "groups.jsonl")
    assert len(groups) == 3 * 2 and len(groups[0]["completions"]) == 4 and "advantages" in groups[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["model"] == tiny_model and summary["wall_seconds"] > 0
    assert summary["seed"] == 0 and summary["profile"] == "default" and summary["commit"]
    level = summary["levels"]["basic"]
    assert level["before"]["n"] == 6 and len(level["after"]["ci95"]) == 2 and "diff" in level["delta"]
    assert (out / "report.md").read_text().startswith("# GRPO run")

    state = checkpoint.load_state(last)
    assert state["step"] == 3 and state["progress"]["step"] == 3 and state["progress"]["data_pos"] == 6
    train(tiny_cfg(tiny_model, out, reward_file, steps=5), resume=True, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5]
    assert metrics[-1]["data_pos"] == 10  # the data order continued where it stopped


@pytest.mark.slow
def test_resume_replays_the_same_step(tiny_model, tmp_path, reward_file):
    """Stopping after step 2 and resuming gives step 3 exactly as an uninterrupted run does."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_cfg(tiny_model, a, reward_file, eval_size=0), log=lambda *x: None)
    train(tiny_cfg(tiny_model, b, reward_file, eval_size=0, steps=2), log=lambda *x: None)
    train(tiny_cfg(tiny_model, b, reward_file, eval_size=0), resume=True, log=lambda *x: None)
    ga, gb = read_jsonl(a / "groups.jsonl"), read_jsonl(b / "groups.jsonl")
    step3 = [g["completions"] for g in ga if g["step"] == 3]
    assert len(step3) == 2 and step3 == [g["completions"] for g in gb if g["step"] == 3]  # prompts_per_step 2


@pytest.mark.slow
def test_existing_run_is_never_overwritten(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=1, eval_size=0), log=lambda *a: None)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(RunDirError, match="already holds a run"):
        train(tiny_cfg(tiny_model, out, reward_file, steps=1, eval_size=0), log=lambda *a: None)
    assert (out / "metrics.jsonl").read_text() == before
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(RunDirError, match="is a file, not a directory: choose another --output-dir"):
        train(tiny_cfg(tiny_model, tmp_path / "a-file", reward_file, steps=1, eval_size=0), log=lambda *a: None)
    assert (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.slow
def test_a_start_that_fails_leaves_no_run_directory_behind(tmp_path, reward_file):
    """A model that is not there: the directory this start created goes (the page would list it as a run); a
    directory that was there before stays, with what it held and a status that says why the start failed."""
    missing = str(tmp_path / "no-such-model")
    out = tmp_path / "run"
    with pytest.raises(ModelError):
        train(tiny_cfg(missing, out, reward_file, eval_size=0), log=lambda *a: None)
    assert not out.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(ModelError):
        train(tiny_cfg(missing, mine, reward_file, eval_size=0), log=lambda *a: None)
    assert (mine / "notes.txt").read_text() == "mine"
    assert json.loads((mine / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
@pytest.mark.parametrize("variant", [dict(beta=0.05, num_iterations=2, loss_type="grpo"),
                                     dict(use_lora=True, loss_type="dr_grpo", gradient_checkpointing=True)])
def test_variants_run(tiny_model, tmp_path, reward_file, variant):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=2, eval_size=0, **variant), log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert len(metrics) == 2
    if variant.get("beta"):
        assert metrics[-1]["kl"] >= 0
    if variant.get("use_lora"):
        ckpt = checkpoint.latest(out)
        assert (ckpt / "adapter_model.safetensors").exists()
        assert main(["eval", "--model", str(ckpt), "--n", "2", "--max-new-tokens", "4"]) == 0  # base + adapter


@pytest.mark.slow
def test_ctrl_c_saves_a_complete_checkpoint(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cpu_grpo.cli", "train", "--profile", "demo", "--model", tiny_model, "--output-dir",
           str(out), "--steps", "100000", "--prompts-per-step", "2", "--num-generations", "4", "--max-new-tokens", "8",
           "--eval-size", "0", "--save-every", "0", "--rewards", f"{reward_file}:length_reward",
           "--reward-weights", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 120
    for line in proc.stdout:
        if line.startswith("step 2/") or time.time() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, rest
    assert "stopped at step" in rest and "--resume" in rest
    ckpt = checkpoint.latest(out)
    assert ckpt is not None and (ckpt / "model.safetensors").exists()
    assert not [p for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]  # no half-written dir


@pytest.mark.slow
def test_out_of_memory_retries_the_update_at_half_the_micro_batch(tiny_model, tmp_path, reward_file, monkeypatch):
    """An allocation failure in the update (injected for micro-batches over 4 sequences) is retried at half the
    size, which the rest of the run keeps: the run ends with the same weights as a run that used 4 from the
    start, and says what happened."""
    import cpu_grpo.train.update as update_mod

    real = update_mod.group_logprobs

    def fails_when_large(model, prompts, completions, groups, g, *args, **kw):
        samples = kw.get("samples") or (args[4] if len(args) > 4 else None) or tuple(range(g))
        if torch.is_grad_enabled() and len(groups) * len(samples) > 4:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes.")
        return real(model, prompts, completions, groups, g, *args, **kw)

    plain = tmp_path / "plain"
    train(tiny_cfg(tiny_model, plain, reward_file, eval_size=0, steps=2, micro_batch_size=4), log=lambda *a: None)
    monkeypatch.setattr(update_mod, "group_logprobs", fails_when_large)
    lines = []
    retried = tmp_path / "retried"
    train(tiny_cfg(tiny_model, retried, reward_file, eval_size=0, steps=2, micro_batch_size=8), log=lines.append)
    assert sum("out of memory with 8 sequences a micro-batch" in str(x) for x in lines) == 1  # then 4 is kept
    assert [m["micro_batch_size"] for m in read_jsonl(retried / "metrics.jsonl")] == [4, 4]
    a = load_file(checkpoint.latest(plain) / "model.safetensors")
    b = load_file(checkpoint.latest(retried) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)

    monkeypatch.setattr(update_mod, "group_logprobs", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):  # any other error is not retried
        train(tiny_cfg(tiny_model, tmp_path / "other", reward_file, eval_size=0, steps=1), log=lambda *a: None)


def test_truncated_completions_earn_no_credit_unless_asked():
    from cpu_grpo.data.example import Example
    from cpu_grpo.data.rewards import RewardError, correctness_reward, format_reward, load_reward
    from cpu_grpo.train.rollout import Rollout, score

    batch = [Example("Elif has 42 lollipops and buys 28. How many?", "70", "basic")]
    spam = "Elif has 42 + 28 = 70 lollipops\n#### 70\n#### \n#### \n#### "  # cut at the limit: no end
    ended = "42 + 28 = 70\n#### 70"
    rollout = Rollout(batch, [[1]], [[2] * 96, [2, 3]], [spam, ended], [True, False])
    cfg = config.build(None, None, dict(num_generations=2))
    scored = score(cfg, [correctness_reward, format_reward], rollout)
    total, per_fn = scored.total, scored.per_fn
    assert per_fn == {"correctness_reward": [0.0, 1.0], "format_reward": [0.0, 1.0]}
    assert total.tolist() == pytest.approx([0.0, 1.2])
    # a penalty is no credit: the overlong shaping keeps its -1 on the completion cut at the limit of 96
    cfg = config.build(None, None, dict(num_generations=2, max_new_tokens=96, rewards=["correctness", "overlong"],
                                        reward_weights=[1.0, 0.5]))
    scored = score(cfg, [correctness_reward, load_reward("overlong", 96)], rollout)
    total, per_fn = scored.total, scored.per_fn
    assert per_fn == {"correctness_reward": [0.0, 1.0], "overlong_reward": [-1.0, 0.0]}
    assert total.tolist() == pytest.approx([-0.5, 1.0])
    cfg = config.build(None, None, dict(num_generations=2, score_truncated=True))
    scored = score(cfg, [correctness_reward, format_reward], rollout)
    total, per_fn = scored.total, scored.per_fn
    assert per_fn == {"correctness_reward": [1.0, 1.0], "format_reward": [0.75, 1.0]}

    def short(completions, **kw):
        return [1.0]

    with pytest.raises(RewardError, match="reward function short returned a list of length 1 for 2 completions"):
        score(cfg, [short], rollout)

    def infinite(completions, **kw):
        return [math.inf, 0.0]

    with pytest.raises(RewardError, match="reward function infinite returned inf: return finite floats"):
        score(cfg, [infinite], rollout)


@pytest.mark.slow
def test_non_finite_gradients_skip_the_update_then_stop_the_run(tiny_model, tmp_path, reward_file, monkeypatch):
    """A nan loss (injected from step 2 on) never reaches the weights: the update is skipped with a line in the log
    (the checkpoints of steps 2 and 3 hold step 1's weights), and after BAD_STEPS such steps in a row the run stops
    with one sentence."""
    import cpu_grpo.train.step as step_mod
    import cpu_grpo.train.update as update_mod

    real, calls = update_mod.grpo_loss, {"n": 0}

    def nan_after_first_step(*args, **kw):
        loss, st = real(*args, **kw)
        return (loss * math.nan if r_step["n"] >= 1 else loss), st

    r_step = {"n": 0}
    real_prepare = step_mod.prepare  # once a step's update

    def counting_update(r, *args, **kw):
        r_step["n"] = calls["n"]  # the steps before this one
        calls["n"] += 1
        return real_prepare(r, *args, **kw)

    monkeypatch.setattr(update_mod, "grpo_loss", nan_after_first_step)
    monkeypatch.setattr(step_mod, "prepare", counting_update)
    out, lines = tmp_path / "nan", []
    with pytest.raises(update_mod.TrainingError, match="not finite in 3 steps in a row: lower --learning-rate"):
        train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=6, save_every=1, keep_checkpoints=5),
              log=lines.append)
    assert calls["n"] == 4  # one good step, three skipped
    assert sum("the gradient is not finite" in str(x) for x in lines) == 3
    saved = [load_file(c / "model.safetensors") for c in checkpoint.complete(out / "checkpoints")]
    assert len(saved) == 3 and all(torch.isfinite(t).all() for t in saved[0].values())
    assert all(torch.equal(saved[0][k], s[k]) for s in saved[1:] for k in s)
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
def test_a_skipped_first_update_brings_no_pytorch_warning(tiny_model, tmp_path, reward_file, monkeypatch):
    """PyTorch's "lr_scheduler.step() before optimizer.step()" reached the user at step 1 of a run whose first
    update was skipped (the log already says why)."""
    import warnings

    import cpu_grpo.train.update as update_mod

    real = update_mod.grpo_loss
    monkeypatch.setattr(update_mod, "grpo_loss", lambda *a, **kw: (real(*a, **kw)[0] * math.nan, real(*a, **kw)[1]))
    lines = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(tiny_cfg(tiny_model, tmp_path / "run", reward_file, eval_size=0, steps=2), log=lines.append)
    assert sum("the gradient is not finite" in str(x) for x in lines) == 2
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], [str(w.message) for w in caught]


@pytest.mark.slow
def test_resume_after_an_unclean_stop_logs_each_step_once(tiny_model, tmp_path, reward_file):
    """A kill after step 3 was logged but before its checkpoint (the newest is step 2), with a checkpoint half
    written and a half-written log line: resuming drops the records of step 3 and the partial directory, and the
    logs end with each step once."""
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0), log=lambda *a: None)
    import shutil

    shutil.rmtree(out / "checkpoints" / "step-000003")  # as if killed before step 3's checkpoint was complete
    (out / "checkpoints" / ".step-000003.abc").mkdir()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss"')
    lines = []
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=4), resume=True, log=lines.append)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert [g["step"] for g in read_jsonl(out / "groups.jsonl")] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert not list((out / "checkpoints").glob(".step-*"))
    assert any("3 log records of steps after" in str(x) for x in lines)  # 1 metrics + 2 groups


@pytest.mark.slow
def test_cli_resume_uses_the_runs_saved_config(tiny_model, tmp_path, reward_file, capsys):
    """`cpu-grpo train --output-dir X --resume` continues X with X's own config (not the default profile and
    model), with only the fields given on the command line changed, and says which."""
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2), log=lambda *a: None)
    assert main(["train", "--output-dir", str(out), "--resume", "--steps", "3"]) == 0
    assert "changed here: steps: 2 -> 3" in capsys.readouterr().out
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert config.load_file(out / "train_config.yaml")["model"] == tiny_model
    assert main(["train", "--output-dir", str(out), "--resume", "--model", "smollm2-135m"]) == 2
    assert f"trained with model {tiny_model!r}: resume it without --model" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_before_the_first_checkpoint_starts_again_in_place(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=1, save_every=0), log=lambda *a: None)
    import shutil

    shutil.rmtree(out / "checkpoints")  # as if killed before any checkpoint
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2), resume=True, log=lambda *a: None)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    with pytest.raises(RunDirError, match="holds no run to continue"):
        train(tiny_cfg(tiny_model, tmp_path / "empty", reward_file), resume=True, log=lambda *a: None)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncate weights", "truncate state", "remove weights"])
def test_resume_falls_back_past_a_damaged_checkpoint(tiny_model, tmp_path, reward_file, damage, capsys):
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2, save_every=1), log=lambda *a: None)
    newest = out / "checkpoints" / "step-000002"
    target = newest / ("trainer_state.pt" if "state" in damage else "model.safetensors")
    if damage.startswith("truncate"):
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.unlink()
    lines = []
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=3), resume=True, log=lines.append)
    assert "skipping checkpoint step-000002" in capsys.readouterr().out
    assert any("resumed from" in str(x) and "step-000001" in str(x) for x in lines)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_a_step_that_can_teach_nothing_is_reported(tiny_model, tmp_path):
    """Rewards that are all None: a warning at each step; all-equal groups for 5 steps: one warning."""
    nothing = tmp_path / "nothing.py"
    nothing.write_text("def none_reward(completions, **kw):\n    return [None] * len(completions)\n")
    lines = []
    train(tiny_cfg(tiny_model, tmp_path / "run", nothing, eval_size=0, steps=6,
                   rewards=[f"{nothing}:none_reward"]), log=lines.append)
    text = "\n".join(map(str, lines))
    assert text.count("every reward function returned None or nan") == 6
    assert text.count("for 5 steps every group's rewards were all equal") == 1
    assert text.count("completions of the first step were cut at 12 tokens") == 1  # the random model never ends


def test_a_first_step_cut_at_the_limit_is_reported():
    from cpu_grpo.train.step import _warn_cut

    lines = []
    for cut in ([True] * 7 + [False], [True] * 5 + [False] * 3):
        _warn_cut(cut, 96, lines.append)
    assert lines == ["warning: 7 of 8 completions of the first step were cut at 96 tokens, so only short ones can "
                     "earn a reward and training may teach the model to stop working early: give it more "
                     "--max-new-tokens"]


FADING = """
CALLS = [0]

def fading_reward(completions, **kw):
    CALLS[0] += 1
    return [len(c) / 10 if CALLS[0] <= 2 else 0.0 for c in completions]
"""


@pytest.mark.slow
def test_a_collapse_stops_the_run_if_asked_and_its_last_good_checkpoint_survives_rotation(tiny_model, tmp_path):
    """A reward that scores nothing after step 2 (as after a learning rate that wrecked the model in step 2's update):
    step 2's rollouts were sampled by step 1's weights, the last known good; the rotation (keep 2) keeps step 1's
    checkpoint beside the newest two (step 2's weights never sampled a step with a signal), and with on_collapse:
    stop the run stops at step 7 with one sentence naming step 1's checkpoint."""
    fading = tmp_path / "fading.py"
    fading.write_text(FADING)
    out = tmp_path / "run"
    cfg = tiny_cfg(tiny_model, out, fading, eval_size=0, steps=10, save_every=1, keep_checkpoints=2,
                   rewards=[f"{fading}:fading_reward"], on_collapse="stop")
    with pytest.raises(TrainingError, match=r"on_collapse: stop.*step-000001 holds the newest weights whose rollouts"):
        train(cfg, log=lambda *a: None)
    kept = checkpoint.complete(out / "checkpoints")
    assert [c.name for c in kept] == ["step-000001", "step-000005", "step-000006"]
    assert [(c / checkpoint.GOOD_FILE).exists() for c in kept] == [True, False, False]
    assert [m["frac_zero_std"] for m in read_jsonl(out / "metrics.jsonl")][2:] == [1.0] * 4
    with pytest.raises(ConfigError, match="on_collapse must be warn or stop"):
        tiny_cfg(tiny_model, out, fading, on_collapse="halt")


@pytest.mark.slow
def test_a_task_learned_is_said_so_and_not_stopped_as_a_collapse(tiny_model, tmp_path):
    """Every sample right for five steps (all groups all-equal at the top): one note that the problems are learned,
    not the collapse warning's advice, and on_collapse: stop does not stop the run."""
    right = tmp_path / "right.py"
    right.write_text("def always_right(completions, **kw):\n    return [1.0] * len(completions)\n")
    out, lines = tmp_path / "run", []
    fn = f"{right}:always_right"
    train(tiny_cfg(tiny_model, out, right, eval_size=0, steps=6, save_every=0, rewards=[fn], correct_reward=fn,
                   on_collapse="stop"), log=lines.append)
    text = "\n".join(map(str, lines))
    assert text.count("for 5 steps every sample was right") == 1
    assert "rewards were all equal" not in text
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_an_update_that_explodes_or_vanishes_but_stays_finite_is_said(tiny_model, tmp_path, reward_file, monkeypatch):
    """A gradient norm of 5e5 (finite: the update goes through) and then exactly 0 with a non-zero loss each get a
    warning line; a collapse after a wrecking update names the base model when no checkpoint is known good."""
    import cpu_grpo.train.update as update_mod

    norms = iter([5e5, 0.0, 1.0])
    real = torch.nn.utils.clip_grad_norm_

    def scripted(params, max_norm):
        real(params, max_norm)
        return torch.tensor(next(norms, 1.0))

    monkeypatch.setattr(update_mod.torch.nn.utils, "clip_grad_norm_", scripted)
    lines = []
    train(tiny_cfg(tiny_model, tmp_path / "run", reward_file, eval_size=0, steps=3), log=lines.append)
    said = [str(x) for x in lines if "warning: step" in str(x)]
    assert any("step 1: the gradient norm is 5e+05" in x and "exploded" in x for x in said), said
    assert any("step 2: the gradient is exactly 0 with a loss of" in x for x in said), said
    assert not any("step 3:" in x for x in said)


SOME_GROUPS = """
def some_groups_reward(completions, question, **kw):
    return [len(c) / 10 if len(q) % 2 else 0.0 for c, q in zip(completions, question, strict=True)]
"""


@pytest.mark.slow
def test_dynamic_sampling_trains_only_groups_that_teach(tiny_model, tmp_path):
    """A reward that varies within the group only for questions of odd length: with dynamic_sampling 3, each step
    draws batches of 2 prompts until 2 such groups are found (or 3 batches were drawn), trains on those alone, and
    logs every group it sampled; the data order moves on by every prompt drawn."""
    some = tmp_path / "some.py"
    some.write_text(SOME_GROUPS)
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, some, eval_size=0, steps=4, dynamic_sampling=3,
                   rewards=[f"{some}:some_groups_reward"]), log=lambda *a: None)
    metrics, groups = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "groups.jsonl")
    assert [m["data_pos"] for m in metrics] == list(itertools.accumulate(2 * m["sample_batches"] for m in metrics))
    assert {m["sample_batches"] for m in metrics} - {1, 2, 3} == set() and max(m["sample_batches"] for m in metrics) > 1
    for m in metrics:
        step = [x for x in groups if x["step"] == m["step"]]
        teach = [x for x in step if len(x["question"]) % 2]
        trained = [x for x in step if any(a != 0 for a in x["advantages"])]
        assert len(step) == 2 * m["sample_batches"]
        assert trained == teach[:2]  # the first two groups that teach, nothing else
        assert len(trained) == 2 or m["sample_batches"] == 3
        assert m["frac_skipped"] == pytest.approx(1 - len(trained) / len(step))


@pytest.mark.slow
def test_dynamic_sampling_refills_only_the_missing_groups(tiny_model, tmp_path):
    """With `dynamic_sampling_refill: missing`, a step draws its 3 prompts, then only as many as groups that teach
    are still missing, up to 4 draws: the groups are the draws' sizes in order, the data order moves on by exactly
    the prompts drawn, and the groups that teach (the first 3 found) are the ones trained."""
    some = tmp_path / "some.py"
    some.write_text(SOME_GROUPS)
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, some, eval_size=0, steps=4, prompts_per_step=3, dynamic_sampling=4,
                   dynamic_sampling_refill="missing", rewards=[f"{some}:some_groups_reward"]), log=lambda *a: None)
    metrics, groups = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "groups.jsonl")
    assert [m["data_pos"] for m in metrics] == list(itertools.accumulate(m["groups"] for m in metrics))
    assert max(m["sample_batches"] for m in metrics) > 1
    for m in metrics:
        step = [x for x in groups if x["step"] == m["step"]]
        teaches = [len(x["question"]) % 2 == 1 for x in step]
        sizes, pos = [3], 3  # each draw after the first: the groups still missing when it was drawn
        while pos < len(step):
            sizes.append(3 - sum(teaches[:pos]))
            pos += sizes[-1]
        assert pos == len(step) and len(sizes) == m["sample_batches"] <= 4
        assert sum(teaches) >= 3 or m["sample_batches"] == 4
        trained = [x for x in step if any(a != 0 for a in x["advantages"])]
        assert trained == [x for x, t in zip(step, teaches, strict=True) if t][:3]


@pytest.mark.slow
def test_train_samples_trains_the_widest_of_each_group(tiny_model, tmp_path, reward_file):
    """`train_samples: 2` of 4 (PODS): in each group that varies, exactly 2 samples get an advantage, the pair
    whose totals spread widest, with the advantages of a group of 2; at 4 (all) the run is the default's, bitwise;
    the tokens trained (train_tok_s x time_update) count the 2 samples, not the group's 4."""
    out = tmp_path / "pods"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2, train_samples=2), log=lambda *a: None)
    groups = [x for x in read_jsonl(out / "groups.jsonl") if not x["zero_std"]]
    assert groups and all(m["time_update"] > 0 for m in read_jsonl(out / "metrics.jsonl"))
    for x in groups:
        total, adv = torch.tensor(x["total"]), x["advantages"]
        picked = [j for j, a in enumerate(adv) if a != 0]
        assert len(picked) == 2
        widest = max(total[list(c)].var().item() for c in itertools.combinations(range(4), 2))
        assert total[picked].var().item() == pytest.approx(widest, abs=1e-5)
        assert [adv[j] for j in picked] == pytest.approx(group_advantages(total[picked], 2)[0].tolist(), abs=1e-3)
    runs = {}
    for name, kw in (("all", {"train_samples": 4}), ("default", {})):
        train(tiny_cfg(tiny_model, tmp_path / name, reward_file, eval_size=0, steps=2, **kw), log=lambda *a: None)
        runs[name] = [(m["loss"], m["grad_norm"]) for m in read_jsonl(tmp_path / name / "metrics.jsonl")]
    assert runs["all"] == runs["default"]
    first = [read_jsonl(d / "metrics.jsonl")[0] for d in (out, tmp_path / "default")]  # the same first rollout
    pods, full = (m["train_tok_s"] * m["time_update"] for m in first)
    assert first[0]["completion_len"] == first[1]["completion_len"] and 0 < pods < 0.9 * full


def test_teaching_groups_are_the_first_whose_first_reward_varies():
    cfg = config.build(None, None, {"num_generations": 2, "prompts_per_step": 2, "dynamic_sampling": 2})
    per_fn = {"correctness": [1, 1, 0, 1, float("nan"), 0.0, 0, 1, 1, 0], "format": [0, 1] * 5}
    assert teaching(cfg, plan(cfg)[0], per_fn) == [1, 3]  # group 2 (nan, 0) is all 0; 4 would be the third
    off = config.build(None, None, {"num_generations": 2, "prompts_per_step": 2})
    assert teaching(off, plan(off)[0], per_fn) == [0, 1, 2, 3, 4]
    hardest = config.build(None, None, {"num_generations": 4, "prompts_per_step": 2, "dynamic_sampling": 2,
                                        "dynamic_sampling_keep": "hardest"})
    right = [1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1]  # 3/4, 0, 1/4, 4/4, 1/4, 3/4
    assert teaching(hardest, plan(hardest)[0], {"correctness": right}) == [2, 4]  # one right answer, in their order
    first = config.build(None, None, {**hardest.to_dict(), "dynamic_sampling_keep": "first"})
    assert teaching(first, plan(first)[0], {"correctness": right}) == [0, 2]
    own = config.build(None, None, {**first.to_dict(), "stages": [{"name": "a", "dynamic_sampling_keep": "hardest"}]})
    assert teaching(own, plan(own)[0], {"correctness": right}) == [2, 4]  # a stage's own rule wins
    with pytest.raises(ConfigError, match="dynamic_sampling_keep must be first or hardest"):
        config.build(None, None, {"dynamic_sampling_keep": "easiest"})
    with pytest.raises(ConfigError, match="dynamic_sampling must be >= 0"):
        config.build(None, None, {"dynamic_sampling": -1})


@pytest.mark.slow
def test_a_jsonl_task_in_a_directory_trains_to_the_end(tiny_model, tmp_path, reward_file):
    """The stage is named after the path (data/good.jsonl): its evaluation file gets a safe name and the run
    writes its summary; held-out problems are never among the training prompts."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"Tom has {i} apples and buys {i + 2}. How many now?", "answer": f"#### {2 * i + 2}"}
            for i in range(60)]
    (data / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, task=str(data / "good.jsonl"), eval_size=5, steps=2),
          log=lambda *a: None)
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    held_out = {r["question"] for r in read_jsonl(out / "eval_before.jsonl")}
    trained = {g["question"] for g in read_jsonl(out / "groups.jsonl")}
    assert held_out and not held_out & trained


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_is_one_sentence(tiny_model, tmp_path, reward_file, monkeypatch, capsys):
    """ENOSPC while a checkpoint is written (injected): the half-written directory is removed, the run stops with
    one sentence naming the disk and how to continue, and the status says failed."""
    import errno

    from cpu_grpo.train import checkpoint as ckpt_mod

    real = ckpt_mod.config_mod.save

    def full_inside_checkpoints(cfg, path):
        if Path(path).parent.name.startswith(".step-000002"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(cfg, path)

    monkeypatch.setattr(ckpt_mod.config_mod, "save", full_inside_checkpoints)
    out = tmp_path / "run"
    args = ["train", "--model", tiny_model, "--task", "basic", "--output-dir", str(out), "--steps", "3",
            "--save-every", "1", "--eval-size", "0", "--prompts-per-step", "2", "--num-generations", "4",
            "--max-new-tokens", "12",
            "--rewards", f"{reward_file}:length_reward", "--reward-weights", "1", "--score-truncated"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is full" in err and "while saving the checkpoint of step 2" in err and "--resume (from step-000001)" in err
    assert [c.name for c in checkpoint.complete(out / "checkpoints")] == ["step-000001"]
    assert not list((out / "checkpoints").glob(".step-*"))
    assert json.loads((out / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow
def test_kill_9_inside_a_checkpoint_write_loses_nothing(tiny_model, tmp_path, reward_file):
    """A real process SIGKILLed while step 2's checkpoint is half written (its weights on disk, its config and
    trainer state not yet): the half-written directory is never taken for a checkpoint, resume starts from step 1,
    removes it, and the logs end with each step once."""
    out = tmp_path / "run"
    script = f"""
import os, signal
from pathlib import Path
from cpu_grpo.train import checkpoint
from cpu_grpo import config
from cpu_grpo.train.loop import train
real = checkpoint.config_mod.save
def save(cfg, path):
    if Path(path).parent.name.startswith(".step-000002"):
        os.kill(os.getpid(), signal.SIGKILL)
    real(cfg, path)
checkpoint.config_mod.save = save
cfg = config.build(None, None, dict(model={tiny_model!r}, output_dir={str(out)!r}, steps=3, prompts_per_step=2,
    num_generations=4, max_new_tokens=12, eval_size=0, save_every=1, learning_rate=1e-3, train_size=50,
    rewards=["{reward_file}:length_reward"], reward_weights=[1.0], score_truncated=True))
train(cfg, log=lambda *a: None)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert [c.name for c in checkpoint.complete(out / "checkpoints")] == ["step-000001"]
    partial = list((out / "checkpoints").glob(".step-000002*"))
    assert partial and (partial[0] / "model.safetensors").exists()  # killed after the weights were written
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=3), resume=True, log=lambda *a: None)
    assert not list((out / "checkpoints").glob(".step-*"))
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    assert checkpoint.latest(out).name == "step-000003"


@pytest.mark.slow
def test_resume_refuses_a_base_evaluation_made_at_another_limit(tiny_model, tmp_path, reward_file):
    """A config changed on resume so that a held-out set's completion limit differs would pair before and after
    answers written under different limits: the run says so and changes nothing."""
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=2), log=lambda *a: None)
    before, config_text = (out / "eval_before.jsonl").read_text(), (out / "train_config.yaml").read_text()
    assert {r["max_new_tokens"] for r in read_jsonl(out / "eval_before.jsonl")} == {8}
    with pytest.raises(UserError, match="'basic': its base records were scored at 8 tokens, this config evaluates it "
                                        "at 10. Move the file away"):
        train(tiny_cfg(tiny_model, out, reward_file, steps=3, eval_max_new_tokens=10), resume=True, log=lambda *a: None)
    with pytest.raises(UserError, match="'basic': 3 of its 9 problems have no base record"):
        train(tiny_cfg(tiny_model, out, reward_file, steps=3, eval_size=9), resume=True, log=lambda *a: None)
    with pytest.raises(UserError, match="no_such_reward"):  # a bad reward, found before the config is saved
        train(tiny_cfg(tiny_model, out, reward_file, steps=3, rewards=[f"{reward_file}:no_such_reward"]),
              resume=True, log=lambda *a: None)
    assert (out / "eval_before.jsonl").read_text() == before
    assert (out / "train_config.yaml").read_text() == config_text  # the run's own config, to resume with
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    said = []  # a resume that reuses the base evaluation says so (it did without a word)
    train(tiny_cfg(tiny_model, out, reward_file, steps=3), resume=True, log=said.append)
    assert any(str(x).startswith(f"the base model's evaluation: reusing {out / 'eval_before.jsonl'} (") for x in said)


@pytest.fixture
def read_only():
    """Makes a directory read-only for real: a bind mount of it onto itself, remounted read-only (chmod does not
    stop root); `read_only(path)` returns a function that makes it writable again. Needs root."""
    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root (run the suite as root, as CI does)")
    mounted = []

    def make(path: Path):
        if subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True).returncode != 0:
            pytest.skip("this machine allows no bind mount")
        mounted.append(path)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True, capture_output=True)

        def writable_again():
            subprocess.run(["umount", str(path)], check=True)
            mounted.remove(path)
        return writable_again

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


CONSTANT = "def constant_reward(completions, **kw):\n    return [0.5] * len(completions)\n"


@pytest.mark.slow
@pytest.mark.parametrize("reward", ["length_reward", "constant_reward"])
def test_a_read_only_checkpoint_directory_is_one_sentence(tiny_model, tmp_path, reward_file, read_only, capsys,
                                                          reward):
    """The run's checkpoints/ is read-only (a real read-only mount) when step 1's checkpoint is marked good (the
    rollouts of step 2 taught something: length_reward) or when step 2's checkpoint is saved (constant_reward):
    one sentence naming the directory and the way on, no traceback, step 1's checkpoint kept, the status failed;
    made writable again, --resume finishes with each step logged once."""
    reward_file.write_text(reward_file.read_text() + "\n" + CONSTANT)
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=1, save_every=1,
                   rewards=[f"{reward_file}:{reward}"]), log=lambda *a: None)
    writable_again = read_only(out / "checkpoints")
    assert main(["train", "--output-dir", str(out), "--resume", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    what = "checkpoint step-000001 could not be marked good" if reward == "length_reward" else \
        "the checkpoint of step 2 could not be saved"
    assert f"cpu-grpo: {out / 'checkpoints'} is read-only (Read-only file system): {what}; make it writable" in err
    assert "continue with --resume (from step-000001)" in err
    assert "Traceback" not in err and len([x for x in err.splitlines() if x.startswith("cpu-grpo:")]) == 1, err
    assert [c.name for c in checkpoint.complete(out / "checkpoints")] == ["step-000001"]
    assert json.loads((out / "status.json").read_text())["state"] == "failed"
    writable_again()
    assert main(["train", "--output-dir", str(out), "--resume", "--steps", "3"]) == 0
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_a_read_only_run_directory_is_one_sentence(tiny_model, tmp_path, reward_file, read_only, capsys):
    """The whole run directory read-only (a real read-only mount) at --resume: the lock cannot be written; one
    sentence naming the directory, the file and the way on, no traceback, nothing of the run changed."""
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=1, save_every=1), log=lambda *a: None)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    writable_again = read_only(out)
    assert main(["train", "--output-dir", str(out), "--resume", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert f"cpu-grpo: {out} cannot be written (Read-only file system) while writing run.lock: make it writable " \
           "and continue with --resume (from step-000001)" in err, err
    assert "Traceback" not in err and len([x for x in err.splitlines() if x.startswith("cpu-grpo:")]) == 1, err
    writable_again()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


@pytest.mark.slow
def test_resume_passes_over_a_checkpoint_with_a_tensor_of_another_shape(tiny_model, tmp_path, reward_file, capsys):
    """A model.safetensors edited by hand (one tensor cut to another shape): resume names the tensor and both
    shapes in one warning and goes on from the older checkpoint; loaded into the model anyway, one sentence."""
    from safetensors.torch import save_file

    from cpu_grpo.engine.models import load_model

    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2, save_every=1), log=lambda *a: None)
    newest, name = out / "checkpoints" / "step-000002", "model.layers.0.mlp.up_proj.weight"
    weights = load_file(newest / "model.safetensors")
    assert list(weights[name].shape) == [64, 32]
    weights[name] = weights[name][:, :16].contiguous()
    save_file(weights, newest / "model.safetensors", metadata={"format": "pt"})
    said = f"model.safetensors holds {name} of shape [64, 16], the model expects [64, 32]"
    with pytest.raises(UserError, match=re.escape(f"does not fit this model: {said}: resume from another checkpoint")):
        checkpoint.load_weights(load_model(tiny_model, log=lambda *a: None)[0], newest)
    lines = []
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=3), resume=True, log=lines.append)
    warned = [x for x in capsys.readouterr().out.splitlines() if "skipping checkpoint" in x]
    assert warned == [f"warning: skipping checkpoint step-000002: {said}; trying an older one"]
    assert any("resumed from" in str(x) and "step-000001" in str(x) for x in lines)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


@pytest.mark.slow
def test_resume_names_a_checkpoint_without_trainer_state_and_never_restarts_silently(tiny_model, tmp_path,
                                                                                     reward_file, capsys):
    """A checkpoint directory without trainer_state.pt: one warning names it and why, resume goes on from the older
    one; with no checkpoint left that can be resumed from, one sentence names them and the ways on (the run is
    not restarted from step 0 over them)."""
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=2, save_every=1), log=lambda *a: None)
    (out / "checkpoints" / "step-000002" / "trainer_state.pt").unlink()
    lines = []
    train(tiny_cfg(tiny_model, out, reward_file, eval_size=0, steps=3), resume=True, log=lines.append)
    warned = [x for x in capsys.readouterr().out.splitlines() if "skipping checkpoint" in x]
    assert warned == ["warning: skipping checkpoint step-000002: it has no trainer_state.pt (the optimizer, the step "
                      "and the data position); trying an older one"]
    assert any("resumed from" in str(x) and "step-000001" in str(x) for x in lines)
    assert [c.name for c in checkpoint.complete(out / "checkpoints")] == ["step-000002", "step-000003"]
    for ckpt in checkpoint.complete(out / "checkpoints"):
        (ckpt / "trainer_state.pt").unlink()
    assert main(["train", "--output-dir", str(out), "--resume", "--steps", "4"]) == 2
    err = capsys.readouterr().err
    assert (f"cpu-grpo: --resume: none of the checkpoints under {out}/checkpoints (step-000002, step-000003) can be "
            "resumed from (see the warnings above): repair one or restore it from a backup, or start a new run with "
            "another --output-dir.") in err and "Traceback" not in err
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]  # nothing run again from step 0


@pytest.mark.slow
def test_int8_rollouts_log_their_mismatch_and_train(tiny_model, tmp_path, reward_file):
    """Rollouts from an int8 copy of the policy (rollout_quantization int8): each step trains, corrected by the
    trainer's over the sampler's probabilities, and logs how far the two are apart."""
    from cpu_grpo.engine.projections import quantize

    if quantize(torch.ones(8, 8, dtype=torch.bfloat16)) is None:
        pytest.skip("oneDNN's int8 matmul is not on offer here")
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward_file, steps=2, eval_size=0, rollout_quantization="int8"),
          log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert len(metrics) == 2 and all(m["grad_norm"] > 0 for m in metrics)
    assert all(abs(m["sampler_kl"]) < 0.5 and 0 <= m["sampler_far_frac"] <= 1 and 0 <= m["sampler_corrected_frac"]
               <= 1 for m in metrics)
    with pytest.raises(ConfigError, match="does not take tools"):
        tiny_cfg(tiny_model, out, reward_file, rollout_quantization="int8", tools=["calculator"])
