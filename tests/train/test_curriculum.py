"""Curriculum stages, Fisher, EWC (math by hand on tiny tensors), and a two-stage run on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train import tiny_cfg

from cpu_grpo import config
from cpu_grpo.config.stages import plan
from cpu_grpo.errors import RunDirError
from cpu_grpo.rundir import read_jsonl, stage_eval_path
from cpu_grpo.train import checkpoint, curriculum
from cpu_grpo.train import loop as train_mod
from cpu_grpo.train import step as step_mod
from cpu_grpo.train.ewc import EWC, EWC_FILE, fisher_diagonal
from cpu_grpo.train.loop import train


class Linear1(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(w))



def test_fisher_is_the_mean_squared_gradient_normalised_to_mean_one():
    m = Linear1([0.5, -1.0, 2.0])
    xs = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    fisher = fisher_diagonal(m, lambda i: (m.w * xs[i]).sum(), 2)
    # d/dw (w . x_i) = x_i; mean of squares = [(1+9)/2, 4/2, 0] = [5, 2, 0]; its mean is 7/3 -> [15/7, 6/7, 0]
    assert torch.allclose(fisher["w"], torch.tensor([15 / 7, 6 / 7, 0.0]), atol=1e-6)
    assert m.w.grad is None


def test_ewc_over_two_stages_equals_the_sum_of_both_penalties():
    m = Linear1([0.0, 0.0, 0.0])
    ewc = EWC()
    f1, a1 = torch.tensor([1.0, 2.0, 0.0]), torch.tensor([1.0, -1.0, 3.0])
    f2, a2 = torch.tensor([3.0, 0.0, 0.5]), torch.tensor([2.0, 5.0, -1.0])
    ewc.add_stage("s1", {"w": f1}, {"w": a1})
    ewc.add_stage("s2", {"w": f2}, {"w": a2})
    theta = torch.tensor([0.5, 1.5, -2.0])
    with torch.no_grad():
        m.w.copy_(theta)
    lam = 0.7
    penalty, grad_norm = ewc.apply(m, lam)
    direct = theta.clone().requires_grad_()
    expected = lam / 2 * ((f1 * (direct - a1) ** 2).sum() + (f2 * (direct - a2) ** 2).sum())
    expected.backward()
    assert penalty == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(m.w.grad, direct.grad, atol=1e-5)
    assert grad_norm == pytest.approx(direct.grad.norm().item(), rel=1e-5)  # the norm of what joined .grad
    assert ewc.stages == ["s1", "s2"]


def test_ewc_is_zero_at_its_anchor_and_when_off(tmp_path):
    m = Linear1([1.0, 2.0])
    ewc = EWC()
    ewc.add_stage("s1", {"w": torch.tensor([1.0, 1.0])}, {"w": m.w})
    assert ewc.apply(m, 5.0) == pytest.approx((0.0, 0.0)) and torch.equal(m.w.grad, torch.zeros(2))
    m.w.grad = None
    assert ewc.apply(m, 0.0) == (0.0, 0.0) and m.w.grad is None
    ewc.save(tmp_path / "e.safetensors")
    back = EWC.load(tmp_path / "e.safetensors")
    assert back.stages == ["s1"] and torch.equal(back.fisher["w"], ewc.fisher["w"]) and back.const == ewc.const


def test_decoupled_ewc_pulls_each_weight_by_lr_lambda_fisher():
    m = Linear1([1.0, 1.0, 1.0])
    ewc = EWC()
    ewc.add_stage("s1", {"w": torch.tensor([2.0, 0.01, 0.0])}, {"w": torch.zeros(3)})
    assert ewc.apply(m, 100.0, grad=False)[0] == pytest.approx(50 * 2.01) and m.w.grad is None
    ewc.pull(m, 100.0, lr=0.01)  # rates min(1, 0.01 * 100 * F) = 1, 0.01, 0
    assert torch.allclose(m.w.detach(), torch.tensor([0.0, 0.99, 1.0]))


def test_a_clipped_gradient_penalty_stops_depending_on_lambda_and_the_decoupled_pull_does_not():
    """Three weights at their anchor 0 with Fisher 1, 0.01 and 0, pushed by a gradient of 0.01 each, 30 Adam steps
    at lr 0.01 with the gradient clipped at norm 1 (as in training). Through the gradient, once lambda * F * d
    dominates the norm the clip divides it out: lambda 1e4 and 1e6 leave the Fisher-1 weight at the same distance
    from its anchor, not 100 times closer. Decoupled, the pull holds the weights with lr * lambda * F >= 1 exactly
    on their anchor; the one with Fisher 0 moves in both."""
    def weights(lam: float, decoupled: bool) -> list[float]:
        m = Linear1([0.0, 0.0, 0.0])
        ewc = EWC()
        ewc.add_stage("s1", {"w": torch.tensor([1.0, 0.01, 0.0])}, {"w": torch.zeros(3)})
        opt = torch.optim.Adam(m.parameters(), lr=0.01)
        for _ in range(30):
            opt.zero_grad()
            m.w.grad = torch.full((3,), 0.01)
            ewc.apply(m, lam, grad=not decoupled)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            if decoupled:
                ewc.pull(m, lam, lr=0.01)
        return m.w.tolist()

    assert weights(0.0, False) == pytest.approx([-0.3] * 3, rel=1e-3)  # free: lr a step
    held, harder = weights(1e4, False), weights(1e6, False)
    assert abs(held[0]) > 1e-4 and harder[0] == pytest.approx(held[0], rel=0.01)
    assert held[2] < -0.05  # Fisher 0: never held
    assert weights(1e4, True) == pytest.approx([0.0, 0.0, -0.3], abs=1e-6)


def stage_cfg(tiny_model, out, reward_file, **kw):
    values = dict(stages=["basic:3", "intermediate:3"], steps=6, ewc_lambda=10.0, fisher_samples=3,
                  save_every=2, keep_checkpoints=1, eval_size=4)
    values.update(kw)
    return tiny_cfg(tiny_model, out, reward_file, **values)


@pytest.mark.slow
def test_two_stages_with_ewc(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(stage_cfg(tiny_model, out, reward_file), log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [(m["stage"], m["stage_step"]) for m in metrics] == [
        ("basic", 1), ("basic", 2), ("basic", 3), ("intermediate", 1), ("intermediate", 2), ("intermediate", 3)]
    # no penalty in stage 1; 0 at the first step of stage 2 (the weights are the anchor), then > 0
    assert all(m["ewc_penalty"] == 0 for m in metrics[:4]) and all(m["ewc_penalty"] > 0 for m in metrics[4:])
    stages = read_jsonl(out / "stages.jsonl")
    assert [(s["stage"], s["end_step"]) for s in stages] == [("basic", 3), ("intermediate", 6)]
    assert stages[0]["fisher_samples"] == 3 and "fisher_samples" not in stages[1]  # no later stage needs it
    # stage ends are kept by the rotation (keep_checkpoints=1), each with its tag, and so is the newest checkpoint
    # known good (the newest whose weights sampled a step with a signal); EWC state from stage 1 on
    good = [c.name for c in checkpoint.complete(out / "checkpoints") if (c / checkpoint.GOOD_FILE).exists()]
    kept = [c for c in checkpoint.complete(out / "checkpoints") if c.name != (good[-1] if good else "")]
    assert [c.name for c in kept] == ["step-000003", "step-000006"] and len(good) <= 2
    assert (kept[0] / checkpoint.STAGE_FILE).read_text().strip() == "basic"
    ewc = load_file(kept[0] / EWC_FILE)
    assert {k.split(".", 1)[0] for k in ewc} == {"fisher", "anchor"}
    # the forgetting matrix: base and one row per stage, both levels evaluated each time
    matrix = json.loads((out / "forgetting.json").read_text())
    assert [r["after"] for r in matrix["rows"]] == ["base", "basic", "intermediate"]
    assert matrix["levels"] == ["basic", "intermediate"]
    assert all(c["n"] == 4 for r in matrix["rows"] for c in r["cells"].values())
    assert read_jsonl(out / "eval_after.jsonl") == read_jsonl(stage_eval_path(out, 1, "intermediate"))
    status = json.loads((out / "status.json").read_text())
    assert status["state"] == "finished" and status["step"] == 6 and not (out / "run.lock").exists()


@pytest.mark.slow
def test_the_fisher_leaves_the_draws_alone(tiny_model, tmp_path, reward_file):
    """A run with EWC draws the same problems and completions as one without (the Fisher samples from its own
    generator): with a lambda too small to move a weight, the two runs' groups are identical."""
    runs = []
    for name, lam in [("off", 0.0), ("on", 1e-30)]:
        train(stage_cfg(tiny_model, tmp_path / name, reward_file, ewc_lambda=lam, eval_size=0), log=lambda *a: None)
        groups = read_jsonl(tmp_path / name / "groups.jsonl")
        runs.append([(g["step"], g["question"], g["completions"]) for g in groups])
    assert (tmp_path / "on" / "checkpoints" / "step-000003" / EWC_FILE).exists()  # the Fisher was sampled
    assert sorted({s for s, *_ in runs[0]}) == [1, 2, 3, 4, 5, 6]
    assert runs[1] == runs[0]


@pytest.mark.slow
def test_eval_every_stage_off_evaluates_before_and_after_the_last_stage_only(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(stage_cfg(tiny_model, out, reward_file, eval_every_stage=False), log=lambda *a: None)
    assert not stage_eval_path(out, 0, "basic").exists() and stage_eval_path(out, 1, "intermediate").exists()
    matrix = json.loads((out / "forgetting.json").read_text())
    assert [r["after"] for r in matrix["rows"]] == ["base", "intermediate"]
    assert read_jsonl(out / "eval_after.jsonl") == read_jsonl(stage_eval_path(out, 1, "intermediate"))


def test_fisher_shared_among_processes_adds_up_to_the_whole():
    """Two 'ranks' with one sample each, their sums added by add_up: the Fisher of both samples in one process."""
    m = Linear1([0.5, -1.0, 2.0])
    xs = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    parts = []

    def hold(tensors):  # stands in for the all-reduce: remember rank 0's sums, then add rank 1's
        parts.append([t.clone() for t in tensors])
        if len(parts) == 2:
            for t, a, b in zip(tensors, *parts, strict=True):
                t.copy_(a + b)

    fisher_diagonal(m, lambda i: (m.w * xs[0]).sum(), 2, 1, hold)
    shared = fisher_diagonal(m, lambda i: (m.w * xs[1]).sum(), 2, 1, hold)
    whole = fisher_diagonal(m, lambda i: (m.w * xs[i]).sum(), 2)
    assert torch.allclose(shared["w"], whole["w"], atol=1e-6)


def weighted_drift(run: Path, fisher: dict) -> float:
    """sum F (theta - theta_stage1)^2 over stage 2: what EWC penalises (F from the end of stage 1)."""
    a = load_file(run / "checkpoints" / "step-000003" / "model.safetensors")
    b = load_file(run / "checkpoints" / "step-000011" / "model.safetensors")
    return sum(float((fisher[k] * (a[k] - b[k]) ** 2).sum()) for k in fisher)


@pytest.mark.slow
def test_ewc_holds_the_weights_that_mattered_for_the_first_stage(tiny_model, tmp_path, reward_file):
    # Adam moves every parameter by ~lr per step whatever the gradient's size, so even a huge lambda only
    # turns steady drift into oscillation around the anchor: compare after 8 steps of stage 2, not 1 or 2.
    # Parameters with Fisher 0 (e.g. embeddings of tokens not seen in stage 1) are free to move, by design.
    free, held = tmp_path / "free", tmp_path / "held"
    kw = dict(stages=["basic:3", "intermediate:8"], steps=11, eval_size=0, save_every=0, fisher_samples=6)
    train(stage_cfg(tiny_model, free, reward_file, ewc_lambda=0.0, **kw), log=lambda *a: None)
    train(stage_cfg(tiny_model, held, reward_file, ewc_lambda=1e4, **kw), log=lambda *a: None)
    ewc = EWC.load(held / "checkpoints" / "step-000003" / EWC_FILE)
    assert weighted_drift(held, ewc.fisher) < 0.25 * weighted_drift(free, ewc.fisher)


@pytest.mark.slow
def test_resume_inside_the_second_stage(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(stage_cfg(tiny_model, out, reward_file, steps=5, stages=["basic:3", "intermediate:2"], eval_size=0),
          log=lambda *a: None)
    train(stage_cfg(tiny_model, out, reward_file, steps=6, stages=["basic:3", "intermediate:3"], eval_size=0),
          resume=True, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert metrics[-1]["stage"] == "intermediate" and metrics[-1]["stage_step"] == 3
    assert metrics[-1]["ewc_penalty"] > 0  # the Fisher of stage 1 came back from the checkpoint


@pytest.mark.slow
def test_a_finished_run_extended_by_a_stage_anchors_its_old_last_stage(tiny_model, tmp_path, reward_file):
    """The last stage gets no Fisher (nothing after it needs one); resumed with a stage more, it gets the one it
    would have had, and the run goes on as a run of both stages from the start does."""
    out, fresh = tmp_path / "run", tmp_path / "fresh"
    train(stage_cfg(tiny_model, out, reward_file, steps=3, stages=["basic:3"], eval_size=0), log=lambda *a: None)
    both = dict(steps=5, stages=["basic:3", "intermediate:2"], eval_size=0)
    train(stage_cfg(tiny_model, out, reward_file, **both), resume=True, log=lambda *a: None)
    train(stage_cfg(tiny_model, fresh, reward_file, **both), log=lambda *a: None)
    penalty = [m["ewc_penalty"] for m in read_jsonl(out / "metrics.jsonl")]
    assert penalty[-1] > 0 and penalty == pytest.approx([m["ewc_penalty"] for m in read_jsonl(fresh / "metrics.jsonl")])
    last = checkpoint.complete(out / "checkpoints")[-1]
    assert EWC.load(last / EWC_FILE).stages == ["basic"]


@pytest.mark.slow
def test_a_stage_with_its_own_completion_limit(tiny_model, tmp_path, reward_file, monkeypatch):
    """Its rollouts stop at its limit, and its task's held-out set is evaluated at it, before and after; the other
    stages and sets keep the run's limits (12 in training, 8 in evaluation)."""
    from cpu_grpo.eval import evaluate

    limits, run_eval = [], evaluate.run_eval

    def spy(sampler, tok, examples, instruction, sampling, **kw):
        limits.append(({ex.difficulty for ex in examples}, sampling.max_new_tokens))
        return run_eval(sampler, tok, examples, instruction, sampling, **kw)

    monkeypatch.setattr(evaluate, "run_eval", spy)
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, steps=4, ewc_lambda=0.0, eval_every_stage=False,
                    stages=["basic:2", {"name": "intermediate", "steps": 2, "max_new_tokens": 5}])
    train(cfg, log=lambda *a: None)
    lengths = {m["stage"]: m["completion_len"] for m in read_jsonl(out / "metrics.jsonl")}
    assert lengths["intermediate"] <= 5 < lengths["basic"] <= 12
    assert limits == [({"basic"}, 8), ({"intermediate"}, 5)] * 2  # before training, after the last stage
    held = [ex.id for s in curriculum.held_out(cfg) for ex in s.examples]
    assert [x["id"] for x in read_jsonl(out / "eval_before.jsonl")] == held  # in the sets' order


@pytest.mark.slow
def test_a_stage_with_its_own_prompts_per_step(tiny_model, tmp_path, reward_file):
    """Its steps sample and train that many groups and consume that many problems; the others keep the run's 2."""
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, steps=4, ewc_lambda=0.0, eval_size=0,
                    stages=["basic:2", {"name": "intermediate", "steps": 2, "prompts_per_step": 3}])
    train(cfg, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [(m["stage"], m["groups"], m["data_pos"]) for m in metrics] == \
        [("basic", 2, 2), ("basic", 2, 4), ("intermediate", 3, 3), ("intermediate", 3, 6)]
    groups = read_jsonl(out / "groups.jsonl")
    assert [g["stage"] for g in groups] == ["basic"] * 4 + ["intermediate"] * 6


@pytest.mark.slow
def test_a_stage_on_joined_levels_replays_the_first_and_is_held_out_as_each(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, steps=4, ewc_lambda=0.0, prompts_per_step=4,
                    stages=["basic:2", {"name": "replay", "task": "basic+intermediate", "steps": 2}])
    assert [s.task for s in curriculum.held_out(cfg)] == ["basic", "intermediate"]
    train(cfg, log=lambda *a: None)
    drawn = {g["difficulty"] for g in read_jsonl(out / "groups.jsonl") if g["stage"] == "replay"}
    assert drawn == {"basic", "intermediate"}
    assert json.loads((out / "forgetting.json").read_text())["levels"] == ["basic", "intermediate"]


@pytest.mark.slow
def test_a_stage_with_held_out_false_trains_but_is_not_evaluated(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, steps=2, ewc_lambda=0.0, promote_every=1, promote_size=2,
                    stages=["basic:1", {"name": "late", "task": "intermediate", "steps": 1, "held_out": False,
                                        "promote_at": 1.0}])
    train(cfg, log=lambda *a: None)
    assert {g["difficulty"] for g in read_jsonl(out / "groups.jsonl") if g["stage"] == "late"} == {"intermediate"}
    assert {x["difficulty"] for x in read_jsonl(out / "eval_after.jsonl")} == {"basic"}
    assert json.loads((out / "forgetting.json").read_text())["levels"] == ["basic"]
    # its promotion check still runs, at the stage's own limit (it has no held-out set's to take)
    assert read_jsonl(out / "stages.jsonl")[1]["validation_accuracy"] is not None


def stopping_after(n: int, real):
    """grpo_step that asks the run to stop (as Ctrl-C does) once step `n` is done."""

    def step(r, p, stage, ref, reward_fns, draw, stop):
        out = real(r, p, stage, ref, reward_fns, draw, stop)
        if p.step + 1 == n and not stop.requested:
            stop(None, None)
        return out

    return step


@pytest.mark.slow
def test_a_stage_with_its_own_schedule_decays_over_its_steps_also_when_resumed(tiny_model, tmp_path, reward_file,
                                                                               monkeypatch):
    """basic at the run's constant 1e-3 for 2 steps; intermediate from 2e-3, linear over its 4 steps: 2e-3, 1.5e-3,
    1e-3, 5e-4 (factor 1 - k/4 at its k-th step). The run stops after step 4 and resumes. The logged lr is the
    next step's, as in transformers' Trainer: 1e-3, 1e-3, then 1.5e-3, 1e-3, 5e-4, 0."""
    real = train_mod.grpo_step
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, steps=6, ewc_lambda=0.0, eval_size=0, learning_rate=1e-3,
                    stages=["basic:2", {"name": "intermediate", "steps": 4, "learning_rate": 2e-3,
                                        "lr_scheduler": "linear"}])
    monkeypatch.setattr(train_mod, "grpo_step", stopping_after(4, real))
    train(cfg, log=lambda *a: None)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]
    monkeypatch.setattr(train_mod, "grpo_step", real)
    train(cfg, resume=True, log=lambda *a: None)
    lrs = [m["lr"] for m in read_jsonl(out / "metrics.jsonl")]
    assert lrs == pytest.approx([1e-3, 1e-3, 1.5e-3, 1e-3, 5e-4, 0.0], abs=1e-12)


@pytest.mark.slow
def test_promotion_ends_a_stage_early(tiny_model, tmp_path, reward_file, monkeypatch):
    monkeypatch.setattr(train_mod, "validation_accuracy", lambda r, stage, val, n: 1.0 if n == 2 else None)
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, stages=[{"name": "basic", "steps": 4, "promote_at": 0.5},
                                                          "intermediate:2"], ewc_lambda=0.0, eval_size=0)
    train(cfg, log=lambda *a: None)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [(m["stage"], m["stage_step"]) for m in metrics] == [
        ("basic", 1), ("basic", 2), ("intermediate", 1), ("intermediate", 2)]
    assert read_jsonl(out / "stages.jsonl")[0]["promoted"] is True


@pytest.mark.slow
def test_a_run_stopped_right_after_a_promotion_resumes_at_the_stage_end(tiny_model, tmp_path, reward_file,
                                                                        monkeypatch):
    """The promotion is in the checkpoint's progress (not only in stages.jsonl, written at the stage's end): the
    resumed run trains no more steps of the promoted stage, ends it as promoted, and goes on with the next."""
    monkeypatch.setattr(train_mod, "validation_accuracy",
                        lambda r, stage, val, n: 1.0 if stage.promote_at and n == 2 else None)
    real = train_mod.grpo_step
    out = tmp_path / "run"
    cfg = stage_cfg(tiny_model, out, reward_file, stages=[{"name": "basic", "steps": 4, "promote_at": 0.5},
                                                          "intermediate:2"], ewc_lambda=0.0, eval_size=0, save_every=0)
    monkeypatch.setattr(train_mod, "grpo_step", stopping_after(2, real))
    train(cfg, log=lambda *a: None)
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2] and not (out / "stages.jsonl").exists()
    assert checkpoint.load_state(checkpoint.latest(out))["progress"]["validation"] == 1.0
    monkeypatch.setattr(train_mod, "grpo_step", real)
    train(cfg, resume=True, log=lambda *a: None)
    assert [(m["stage"], m["stage_step"]) for m in read_jsonl(out / "metrics.jsonl")] == [
        ("basic", 1), ("basic", 2), ("intermediate", 1), ("intermediate", 2)]
    assert [(x["stage"], x["promoted"], x["end_step"]) for x in read_jsonl(out / "stages.jsonl")] == [
        ("basic", True, 2), ("intermediate", False, 4)]


def test_validation_is_disjoint_from_the_held_out_set():
    cfg = config.build(None, None, {"eval_size": 30, "promote_size": 20})
    held = {ex.question for ex in curriculum.held_out(cfg)[0].examples}
    val = curriculum.validation(cfg, plan(cfg)[0])
    assert len(val) == 20 and not held & {ex.question for ex in val}


def test_a_second_process_on_a_busy_run_dir_is_refused(tmp_path):
    from cpu_grpo.rundir import RunLock

    (tmp_path / "run.lock").write_text(json.dumps({"pid": 1, "started": 0}))  # pid 1 is alive
    with pytest.raises(RunDirError, match="is being trained by process 1"):
        RunLock(tmp_path).__enter__()
    (tmp_path / "run.lock").write_text(json.dumps({"pid": 2 ** 22 + 12345, "started": 0}))  # stale
    with RunLock(tmp_path):
        assert json.loads((tmp_path / "run.lock").read_text())["pid"] != 1
    assert not (tmp_path / "run.lock").exists()


@pytest.mark.slow
def test_ewc_with_lora_covers_only_the_adapters(tiny_model, tmp_path, reward_file):
    out = tmp_path / "run"
    train(stage_cfg(tiny_model, out, reward_file, use_lora=True, lora_r=4, lora_alpha=8, eval_size=0,
                    stages=["basic:2", "intermediate:2"], steps=4), log=lambda *a: None)
    ewc = EWC.load(out / "checkpoints" / "step-000002" / EWC_FILE)
    assert ewc.fisher and all("lora_" in k for k in ewc.fisher)
    assert read_jsonl(out / "metrics.jsonl")[-1]["ewc_penalty"] > 0


@pytest.mark.slow
def test_stop_during_the_base_evaluation_keeps_it(tiny_model, tmp_path, reward_file, monkeypatch):
    import os
    import signal

    from cpu_grpo.eval import evaluate

    real = evaluate.run_eval

    def stopped_eval(*args, **kwargs):  # the web app's Stop (SIGTERM) arrives while the base model is evaluated
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(evaluate, "run_eval", stopped_eval)
    train(tiny_cfg(tiny_model, out, reward_file), log=lambda *a: None)
    assert (out / "eval_before.jsonl").exists() and not (out / "metrics.jsonl").exists()
    assert json.loads((out / "status.json").read_text())["state"] == "stopped"
    monkeypatch.setattr(evaluate, "run_eval", real)
    train(tiny_cfg(tiny_model, out, reward_file), log=lambda *a: None)  # the same command again
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]


# ---------------------------------------------------------------------------- prioritised sampling by type
def test_type_priority_draws_the_types_the_rollouts_get_wrong_more_often():
    from collections import Counter

    from cpu_grpo.data.tasks import generate

    data = generate("intermediate", 400, seed=0, split="train")
    p = curriculum.TypePriority(data, list(range(len(data))), seed=3)
    types = list(p.by_type)
    assert len(types) == 10 and all(types)
    alike = Counter(ex.template for ex in p.draw(0, 2000, {}))  # no rollouts yet: every type weighs the same
    assert min(alike.values()) > 150 and max(alike.values()) < 250
    hard = types[0]
    counts = {t: [80, 0 if t == hard else 80] for t in types}
    drawn = Counter(ex.template for ex in p.draw(0, 2000, counts))
    # hard weighs 1 - 1/82 = 0.988, each of the nine others the floor 0.2: hard is 0.988 / 2.788 = 35% of the draws
    assert drawn[hard] / 2000 == pytest.approx(0.988 / 2.788, abs=0.04)
    assert p.draw(5, 4, counts) == p.draw(5, 4, counts) != p.draw(9, 4, counts)  # a function of position and counts


def test_type_priority_counts_samples_and_right_answers_by_type():
    from cpu_grpo.data.tasks import generate

    data = generate("intermediate", 40, seed=0, split="train")
    a = data[0]
    b = next(ex for ex in data if ex.template != a.template)
    counts = {a.template: [4, 1]}
    added = curriculum.TypePriority.count(counts, [a, b], [1.0, 0.0, float("nan"), 0.5, 0.0, 0.0, 0.0, 0.0])
    assert added == {a.template: [8, 3], b.template: [4, 0]}  # NaN (nothing to score) is not right
    assert counts == {a.template: [4, 1]}  # a new dict: the counts it was given stay


NO_BIKE = """
def no_bike_reward(completions, question, **kw):
    return [0.0 if "bike" in q else 1.0 for q in question]
"""


@pytest.mark.slow
def test_prioritized_sampling_draws_the_failing_type_more_and_resumes_the_same(tiny_model, tmp_path):
    """A reward that only the bike problems never earn: the stage draws them more often than a tenth of the time,
    stages.jsonl keeps the counts its draws were weighted by, and a run resumed after step 2 draws the same
    problems in steps 3 to 6 as one that was not stopped (the counts are in the checkpoint)."""
    reward = tmp_path / "no_bike.py"
    reward.write_text(NO_BIKE)

    def cfg(out, steps):
        return tiny_cfg(tiny_model, out, reward, task="intermediate", eval_size=0, steps=steps, prompts_per_step=4,
                        rewards=[f"{reward}:no_bike_reward"], prioritized_sampling=True)

    a, b = tmp_path / "a", tmp_path / "b"
    train(cfg(a, 6), log=lambda *x: None)
    groups = read_jsonl(a / "groups.jsonl")
    bikes = [g for g in groups if "bike" in g["question"]]
    assert len(bikes) > len(groups) / 10 * 2  # uniform sampling would draw 1 in 10
    (stage,) = read_jsonl(a / "stages.jsonl")
    assert stage["type_counts"]["_ wants a bike that costs ..."] == [4 * len(bikes), 0]
    assert sum(n for n, _ in stage["type_counts"].values()) == 4 * len(groups)
    train(cfg(b, 2), log=lambda *x: None)
    train(cfg(b, 6), resume=True, log=lambda *x: None)
    assert [g["question"] for g in read_jsonl(b / "groups.jsonl")] == [g["question"] for g in groups]


@pytest.mark.slow
def test_a_stage_with_its_own_sampling(tiny_model, tmp_path, monkeypatch):
    """The first stage draws problem types by failure rate and trains the hardest varying groups; the second, on the
    same task, keeps the run's settings (the shuffled order, DAPO's first groups)."""
    reward = tmp_path / "no_bike.py"
    reward.write_text(NO_BIKE)
    rules, real = [], step_mod.teaching

    def spy(cfg, stage, per_fn):
        rules.append(stage.dynamic_sampling_keep)
        return real(cfg, stage, per_fn)

    monkeypatch.setattr(step_mod, "teaching", spy)
    out = tmp_path / "run"
    train(tiny_cfg(tiny_model, out, reward, rewards=[f"{reward}:no_bike_reward"], eval_size=0, steps=6,
                   prompts_per_step=4, stages=[{"name": "intermediate", "steps": 3, "prioritized_sampling": True,
                                                "dynamic_sampling_keep": "hardest"},
                                               {"name": "late", "task": "intermediate", "steps": 3}]),
          log=lambda *a: None)
    first, second = read_jsonl(out / "stages.jsonl")
    assert sum(n for n, _ in first["type_counts"].values()) == 4 * 3 * 4  # 3 steps of 4 groups of 4 samples
    assert "type_counts" not in second
    assert rules == ["hardest"] * 3 + ["first"] * 3
