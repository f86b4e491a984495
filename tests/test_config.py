import dataclasses
import json
import re
import subprocess
import sys

import pytest

from cpu_grpo.config import PROFILES, ConfigError, TrainConfig, build, coerce, describe, load_file, save
from cpu_grpo.config.stages import Stage, eval_limits, plan

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


# ---------------------------------------------------------------------------- defaults and validation


def test_defaults_validate():
    cfg = TrainConfig()
    cfg.validate()
    assert cfg.rewards == ["correctness", "correct_format"] and cfg.reward_weights == [1.0, 0.2]
    assert cfg.loss_type == "dapo" and cfg.scale_rewards == "group" and cfg.num_generations == 8


def test_list_defaults_are_not_shared():
    a, b = TrainConfig(), TrainConfig()
    a.rewards.append("x")
    assert b.rewards == ["correctness", "correct_format"]


def test_every_field_has_help():
    for name in FIELDS:
        assert FIELDS[name].metadata["help"].strip(), name


def test_describe_has_one_line_per_field():
    lines = describe(TrainConfig()).splitlines()
    assert len(lines) == len(FIELDS)
    assert f"  steps: {TrainConfig().steps}" in lines


@pytest.mark.parametrize("kw, message", [
    (dict(steps=-1), "steps must be >= 0"),
    (dict(max_tool_calling_iterations=-1), "max_tool_calling_iterations must be >= 0"),
    (dict(prompts_per_step=0), "prompts_per_step >= 1"),
    (dict(num_generations=1), "num_generations must be >= 2: GRPO compares samples within a group"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 1"),
    (dict(temperature=-0.1), "temperature must be > 0: rollouts are sampled"),
    (dict(temperature=0.0), "temperature must be > 0: rollouts are sampled"),
    (dict(top_k=-1), "top_k must be >= 0"),
    (dict(weight_decay=-1.0), "weight_decay must be >= 0"),
    (dict(max_grad_norm=-1.0), "max_grad_norm must be >= 0 (0: no clipping)"),
    (dict(threads=-1), "threads must be between 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
    (dict(rewards=[], reward_weights=[]), "give at least one reward function"),
    (dict(rewards=["correctness"]), "rewards has 1 entries but reward_weights has 2: give one weight per reward"),
    (dict(reward_weights=[1.0]), "rewards has 2 entries but reward_weights has 1: give one weight per reward"),
    (dict(loss_type="ppo"), "loss_type must be grpo, dapo or dr_grpo"),
    (dict(scale_rewards="std"), "scale_rewards must be group, batch or none"),
    (dict(beta=-0.01), "beta must be >= 0"),
    (dict(epsilon=1.0), "epsilon must be in [0, 1), epsilon_high >= 0"),
    (dict(epsilon=-0.1), "epsilon must be in [0, 1), epsilon_high >= 0"),
    (dict(epsilon_high=-0.1), "epsilon must be in [0, 1), epsilon_high >= 0"),
    (dict(num_iterations=0), "num_iterations must be >= 1"),
    (dict(learning_rate=0.0), "learning_rate must be > 0"),
    (dict(lr_scheduler="step"), "lr_scheduler must be constant, linear or cosine"),
    (dict(micro_batch_size=-1), "micro_batch_size must be >= 0 (0: automatic)"),
    (dict(eval_size=-1), "eval_size must be >= 0 and train_size >= 1"),
    (dict(train_size=0), "eval_size must be >= 0 and train_size >= 1"),
    (dict(save_every=-1), "save_every >= 0 and keep_checkpoints >= 1"),
    (dict(keep_checkpoints=0), "save_every >= 0 and keep_checkpoints >= 1"),
])
def test_validation_rules(kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainConfig(**kw)
    with pytest.raises(ConfigError, match=re.escape(message)):  # the same through build
        build(overrides=kw)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("kw", [
    dict(steps=0), dict(num_generations=2), dict(temperature=0.01), dict(top_p=1.0), dict(beta=0.0),
    dict(epsilon=0.0, epsilon_high=0.0), dict(micro_batch_size=0), dict(eval_size=0, train_size=1),
    dict(save_every=0, keep_checkpoints=1), dict(rewards=["format"], reward_weights=[0.5]),
])
def test_boundary_values_are_accepted(kw):
    TrainConfig(**kw)


def test_validate_after_mutation():
    cfg = TrainConfig()
    cfg.num_generations = 1
    with pytest.raises(ConfigError, match="num_generations must be >= 2"):
        cfg.validate()


# ---------------------------------------------------------------------------- profiles and precedence


def test_build_without_anything_is_the_defaults():
    assert build() == TrainConfig()
    # the demo is the defaults but for its format reward's weight (results/demo-format)
    assert build(profile="demo") == TrainConfig(reward_weights=[1.0, 1.0])


def test_default_profile_is_the_curriculum_with_replay():
    cfg = build(profile="default")
    assert [(s.name, s.task, s.steps) for s in plan(cfg)] == [
        ("basic", "basic", 2), ("intermediate", "intermediate", 4), ("intermediate-1e-4", "intermediate", 3),
        ("replay", "basic+intermediate", 3), ("advanced", "intermediate+advanced", 7)]
    assert cfg.total_steps == 19 and cfg.ewc_lambda > 0 and cfg.use_lora and "\\boxed{}" in cfg.instruction
    assert "overlong" in cfg.rewards
    run = cfg.max_new_tokens, cfg.learning_rate, cfg.prompts_per_step  # each stage resolved: its own, else the run's
    assert [s.max_new_tokens for s in plan(cfg)] == [run[0]] * 4 + [320]  # advanced at its own limit
    assert [s.learning_rate for s in plan(cfg)] == [run[1], 2e-4, run[1], run[1], run[1]]
    assert [s.prompts_per_step for s in plan(cfg)] == [run[2], 8, 8, 8, 8]
    assert [s.eval_max_new_tokens for s in plan(cfg)] == [256, 320, 320, 320, 320]  # as their held-out sets
    # intermediate is trained at 320 tokens in the last stage, so it is held out at 320 too
    assert eval_limits(cfg) == {"basic": 256, "intermediate": 320, "advanced": 320}


def test_a_stage_on_joined_levels_is_held_out_as_each_level_at_the_largest_limit_that_trains_it():
    cfg = build(None, None, {"stages": ["basic:2", "basic+intermediate:2",
                                        {"name": "late", "task": "intermediate+advanced", "steps": 2,
                                         "max_new_tokens": 320}], "eval_task": "mix"})
    assert eval_limits(cfg) == {"basic": 256, "intermediate": 320, "advanced": 320, "mix": 256}
    cfg = build(None, None, {"stages": ["intermediate:2", {"name": "late", "task": "advanced+gsm8k", "steps": 2,
                                                           "max_new_tokens": 320}]})
    assert eval_limits(cfg) == {"intermediate": 256, "advanced": 320, "gsm8k": 320}


def test_a_stage_with_held_out_false_adds_no_held_out_set_of_its_own():
    cfg = build(None, None, {"stages": ["basic:2", {"name": "g", "task": "gsm8k", "steps": 2, "held_out": "false",
                                                     "max_new_tokens": 320}]})
    assert [s.held_out for s in plan(cfg)] == [True, False]
    assert eval_limits(cfg) == {"basic": 256}  # gsm8k's limit (320) is not taken either
    cfg = build(None, None, {"stages": [{"name": "g", "task": "gsm8k", "steps": 2, "held_out": False}],
                             "eval_task": "gsm8k"})
    assert eval_limits(cfg) == {"gsm8k": 256}  # asked for by eval_task, it is held out at the run's limit


def test_gsm8k_profile_trains_on_the_train_file_and_holds_out_the_same_500_test_problems():
    from cpu_grpo.train import curriculum

    cfg = build(profile="gsm8k")
    assert [(s.task, s.steps) for s in plan(cfg)] == [("gsm8k", 24)] and cfg.use_lora and "overlong" in cfg.rewards
    held = curriculum.held_out(cfg)
    assert [(h.task, len(h.examples), h.max_new_tokens) for h in held] == [("gsm8k", 500, 256)]
    assert held[0].examples == curriculum.held_out(build("gsm8k", None, {"seed": 1}))[0].examples
    trained = curriculum.load(cfg, "gsm8k", cfg.train_size, cfg.seed, "train")
    assert len(trained) == 7473 and not {e.question for e in trained} & {e.question for e in held[0].examples}


def test_a_task_of_your_own_replaces_the_profile_curriculum():
    cfg = build("default", None, {"task": "data.jsonl"})
    (stage,) = plan(cfg)
    assert (stage.name, stage.task, stage.steps, stage.promote_at) == ("data.jsonl", "data.jsonl", 19, 0.0)
    assert len(plan(build("default", None, {"task": "basic", "stages": "basic,advanced"}))) == 2


def test_no_stages_is_one_stage_on_task():
    cfg = build(None, None, {"task": "intermediate", "steps": 7})
    assert plan(cfg) == [Stage("intermediate", "intermediate", 7, 0.0, cfg.learning_rate, cfg.max_new_tokens,
                               cfg.eval_max_new_tokens, cfg.lr_scheduler, False, cfg.prioritized_sampling,
                               cfg.dynamic_sampling_keep, cfg.prompts_per_step, True)] and cfg.total_steps == 7


def test_stages_from_the_command_line_share_the_steps():
    cfg = build(None, None, {"stages": "basic:4,intermediate,advanced", "steps": "11"})
    assert [s.steps for s in plan(cfg)] == [4, 3, 4]  # 7 left for two stages: 3, and the remainder to the last


def test_stages_from_yaml_mappings(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("stages:\n  - {name: warmup, task: basic, steps: 5, promote_at: 0.6}\n"
                 "  - {name: hard, task: advanced, steps: 8, learning_rate: 1e-5, max_new_tokens: 384}\n")
    cfg = build(None, str(f))
    warm, hard = plan(cfg)
    assert (warm.name, warm.task, warm.steps, warm.promote_at, warm.learning_rate, warm.max_new_tokens) == \
        ("warmup", "basic", 5, 0.6, cfg.learning_rate, cfg.max_new_tokens)
    assert (hard.name, hard.task, hard.steps, hard.promote_at, hard.learning_rate, hard.max_new_tokens) == \
        ("hard", "advanced", 8, 0.0, 1e-5, 384)
    assert (warm.eval_max_new_tokens, hard.eval_max_new_tokens) == (cfg.eval_max_new_tokens, 384)
    assert build(None, str(f)).total_steps == 13
    f.write_text("stages:\n  - {name: a, steps: 2, prioritized_sampling: true, dynamic_sampling_keep: hardest, "
                 "lr_scheduler: cosine, prompts_per_step: 8}\n  - {name: b, steps: 2}\n")
    cfg = build(None, str(f))
    a, b = plan(cfg)
    assert (a.prioritized_sampling, a.dynamic_sampling_keep, a.lr_scheduler, a.lr_over_stage, a.prompts_per_step) == \
        (True, "hardest", "cosine", True, 8)
    assert (b.prioritized_sampling, b.dynamic_sampling_keep, b.lr_scheduler, b.lr_over_stage, b.prompts_per_step) == \
        (cfg.prioritized_sampling, cfg.dynamic_sampling_keep, cfg.lr_scheduler, False, cfg.prompts_per_step)  # run's


@pytest.mark.parametrize("stages, steps, fragment", [
    ("basic,basic", 30, "distinct"),
    ("basic:x", 30, "integer"),
    ("basic,intermediate,advanced", 2, "leaves 2 for 3"),
    ([{"name": "a", "task": "basic", "epochs": 3}], 30, "unknown key(s) epochs"),
    ([{"task": "basic"}], 30, "give a name"),
    ([{"name": "a", "promote_at": 1.5}], 30, "promote_at in [0, 1]"),
    ([{"name": "a", "max_new_tokens": -5}], 30, "max_new_tokens, prompts_per_step >= 0"),
    ([{"name": "a", "max_new_tokens": "long"}], 30, "max_new_tokens, prompts_per_step integers"),
    ([{"name": "a", "prompts_per_step": -1}], 30, "prompts_per_step >= 0"),
    ([{"name": "a", "lr_scheduler": "step"}], 30, "lr_scheduler constant, linear or cosine"),
    ([{"name": "a", "dynamic_sampling_keep": "easiest"}], 30, "dynamic_sampling_keep first or hardest"),
    ([{"name": "a", "prioritized_sampling": "maybe"}], 30, "prioritized_sampling and held_out true or false"),
    ([{"name": "a", "held_out": "maybe"}], 30, "prioritized_sampling and held_out true or false"),
    ('[{"name": "a", "steps": 3}]', 30, "put stage mappings in a --config YAML file"),  # JSON typed on the CLI
])
def test_impossible_stages_say_what_to_do(stages, steps, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        build(None, None, {"stages": stages, "steps": steps})


def test_quick_profile():
    cfg = build(profile="quick")
    assert (cfg.steps, cfg.prompts_per_step, cfg.num_generations, cfg.max_new_tokens) == (8, 4, 4, 96)
    assert (cfg.eval_size, cfg.eval_max_new_tokens, cfg.save_every) == (40, 160, 4)
    # untouched fields keep their defaults
    assert cfg.learning_rate == TrainConfig().learning_rate and cfg.loss_type == "dapo"
    assert PROFILES["quick"]["steps"] == 8  # building does not mutate the profile


def test_unknown_profile():
    with pytest.raises(ConfigError, match="unknown profile 'fast': use one of quick, demo, default"):
        build(profile="fast")


def test_precedence_defaults_profile_file_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 5\nnum_generations: 6\n")
    cfg = build(profile="quick", file=str(path), overrides={"steps": "3"})
    assert cfg.steps == 3  # override (3) > file (5) > profile (8) > default (60)
    assert cfg.num_generations == 6  # file (6) > profile (4) > default (8)
    assert cfg.max_new_tokens == 96  # profile (96) > default (160)
    assert cfg.learning_rate == TrainConfig().learning_rate  # default
    assert PROFILES["quick"]["steps"] == 8


def test_unknown_key_in_overrides():
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) stpes \(did you mean steps\?\): "):
        build(overrides={"stpes": 3})


def test_unknown_keys_in_file_are_all_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 5\nlr: 0.1\nbatch: 4\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) batch, lr: "):  # sorted
        build(file=str(path))


# ---------------------------------------------------------------------------- coercion of CLI strings


def test_cli_strings_are_coerced():
    cfg = build(overrides={"steps": "8", "learning_rate": "1e-5", "bf16": "false", "use_lora": "true",
                           "rewards": "a,b", "reward_weights": "1,0.5", "model": "qwen2.5-0.5b"})
    assert cfg.steps == 8 and type(cfg.steps) is int
    assert cfg.learning_rate == 1e-5 and type(cfg.learning_rate) is float
    assert cfg.bf16 == "false" and cfg.use_lora is True
    assert cfg.rewards == ["a", "b"]
    assert cfg.reward_weights == [1.0, 0.5] and all(type(w) is float for w in cfg.reward_weights)
    assert cfg.model == "qwen2.5-0.5b"


@pytest.mark.parametrize("text, expected", [
    ("true", True), ("TRUE", True), ("yes", True), ("on", True), ("1", True),
    ("false", False), ("False", False), ("no", False), ("off", False), ("0", False),
    (True, True), (False, False),
])
def test_bool_coercion(text, expected):
    assert coerce(FIELDS["use_lora"], text) is expected


@pytest.mark.parametrize("value, expected", [
    ("auto", "auto"), ("AUTO", "auto"), (True, "true"), ("yes", "true"), ("1", "true"), (False, "false"),
    ("off", "false"),
])
def test_bf16_is_auto_or_a_bool(value, expected):
    """bf16 takes HF's bool (YAML true, --bf16 false) or auto: kept as one of three words."""
    assert coerce(FIELDS["bf16"], value) == expected
    assert build().bf16 == "true"


@pytest.mark.parametrize("name, value, expected", [
    ("rewards", "a, b", ["a", "b"]),  # spaces stripped
    ("rewards", "a,b,", ["a", "b"]),  # empty items dropped
    ("rewards", "correctness", ["correctness"]),  # one name
    ("rewards", ["x", "y"], ["x", "y"]),  # a YAML list passes through
    ("reward_weights", [1, 2], [1.0, 2.0]),  # YAML ints become floats
    ("reward_weights", "1, 0.5", [1.0, 0.5]),
    ("temperature", "0.7", 0.7),
    ("temperature", 1, 1.0),
    ("top_k", "0", 0),
])
def test_other_coercions(name, value, expected):
    out = coerce(FIELDS[name], value)
    assert out == expected
    assert type(out) is type(expected)


@pytest.mark.parametrize("name, value", [
    ("steps", "abc"), ("steps", "8.0"), ("learning_rate", "fast"), ("bf16", "maybe"), ("bf16", "2"),
    ("reward_weights", "1,x"), ("reward_weights", 1.0), ("steps", 8.5), ("steps", True), ("learning_rate", True),
])
def test_bad_values(name, value):
    with pytest.raises(ConfigError, match=re.escape(f"{name}: cannot read {value!r} as ")):
        build(overrides={name: value})


def test_null_value_names_the_field():
    with pytest.raises(ConfigError, match="steps has no value"):
        build(overrides={"steps": None})


# ---------------------------------------------------------------------------- files


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    # PyYAML reads 1e-5 (no dot) as the string '1e-5': coercion must still give a float
    path.write_text("learning_rate: 1e-5\nrewards: [correctness]\nreward_weights: [1]\nbf16: no\n")
    assert load_file(path)["learning_rate"] == "1e-5"
    cfg = build(file=str(path))
    assert cfg.learning_rate == 1e-5 and cfg.rewards == ["correctness"] and cfg.reward_weights == [1.0]
    assert cfg.bf16 == "false"


def test_json_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"steps": 7, "loss_type": "grpo"}))
    cfg = build(file=str(path))
    assert cfg.steps == 7 and cfg.loss_type == "grpo"


def test_empty_file_is_no_overrides(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_file(path) == {}
    assert build(file=str(path)) == TrainConfig()


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"config file not found: {path}: check the path.")):
        build(file=str(path))
    with pytest.raises(ConfigError, match="config file not found"):  # a directory is not a file
        load_file(tmp_path)


def test_malformed_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps: [1, 2\nbeta: 0.1\n")
    with pytest.raises(ConfigError, match=re.escape(str(path)) + r": cannot parse it .*: fix the syntax\."):
        load_file(path)


def test_malformed_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"steps": 3,}')
    with pytest.raises(ConfigError, match=re.escape(str(path)) + ": cannot parse it"):
        build(file=str(path))


def test_yaml_top_level_list(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- steps: 3\n- beta: 0.1\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: expected a mapping of field: value at the top level")):
        build(file=str(path))


def test_save_then_load_round_trips(tmp_path):
    cfg = build(profile="quick", overrides={"rewards": "correctness,format,length", "reward_weights": "1,0.2,0.05",
                                            "learning_rate": "3e-6", "bf16": "false", "run_name": "r1",
                                            "instruction": "Answer: '#### <n>'\nnow."})
    path = tmp_path / "config.yaml"
    save(cfg, path)
    assert TrainConfig(**load_file(path)) == cfg
    assert build(file=str(path)) == cfg


# ---------------------------------------------------------------------------- import cost


def test_importing_config_does_not_import_torch():
    code = "import cpu_grpo.config, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------- suspected bugs


def test_float_for_an_int_field_is_rejected():
    with pytest.raises(ConfigError, match="steps"):
        build(overrides={"steps": 8.5})


def test_yaml_null_for_a_str_field_is_not_the_string_none(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_name:\n")
    try:
        cfg = build(file=str(path))
    except ConfigError:
        return  # an error naming the field would be fine
    assert cfg.run_name != "None"


def test_example_config_file_builds():
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "configs" / "example.yaml"
    cfg = build(file=str(example))
    assert cfg.learning_rate == 2e-5 and cfg.rewards == ["correctness", "correct_format"]


def test_the_config_reference_in_docs_is_up_to_date():
    from pathlib import Path

    from cpu_grpo.config import reference

    docs = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    assert docs.read_text() == reference(), "docs/config.md is stale: run `make docs`"


def test_steps_scales_a_profiles_own_stage_steps():
    """--steps wins over a profile whose stages fix their steps: they are scaled to it, in proportion."""
    cfg = build("default", None, {"steps": 20})
    # 2, 4, 3, 3, 7 of 19 scaled to 20: 2.1, 4.2, 3.2, 3.2, 7.4, rounded to a sum of 20
    assert [(s.name, s.steps) for s in plan(cfg)] == [
        ("basic", 2), ("intermediate", 4), ("intermediate-1e-4", 3), ("replay", 3), ("advanced", 8)]
    assert build("default", None, {"steps": 5}).total_steps == 5
    with pytest.raises(ConfigError, match=re.escape("steps 4 < 5 stages: give 5 or more, or --stages")):
        build("default", None, {"steps": 4})  # not silently the profile's 19
    assert build("default", None, {"steps": 20, "stages": "basic:10,advanced:10"}).total_steps == 20
    assert build("demo", None, {"steps": 20}).total_steps == 20
    assert build("default", None, {}).total_steps == 19



def test_threads_and_run_names_the_system_cannot_take_are_one_sentence():
    for fields, words in [({"threads": 100000}, "threads must be between 0"),
                          ({"run_name": "x" * 300}, "at most 200 characters"),
                          ({"run_name": "a/b"}, "plain directory name")]:
        with pytest.raises(ConfigError, match=words):
            build(None, None, fields)


def test_a_field_you_give_wins_in_every_stage_of_a_profile(monkeypatch, tmp_path):
    """--max-new-tokens and --prompts-per-step given with the default profile hold in each of its stages (they lost to
    the stages' own 8 prompts and 320 tokens, while --steps won); a stage you write yourself keeps its own values."""
    import cpu_grpo.cli as cli

    seen = []
    monkeypatch.setattr(cli, "cmd_train", lambda args: seen.append(cli.config_from(args)[0]) or 0)
    assert cli.main(["train", "--max-new-tokens", "64", "--prompts-per-step", "2"]) == 0  # the default profile
    cfg = seen[0]
    assert len(plan(cfg)) == 5 and cfg.max_new_tokens == 64 and cfg.prompts_per_step == 2
    assert [(s.max_new_tokens, s.prompts_per_step) for s in plan(cfg)] == [(64, 2)] * 5
    lr = cfg.learning_rate  # a stage's own setting you did not give stays
    assert [s.learning_rate for s in plan(cfg)] == [lr, 2e-4, lr, lr, lr]
    off = cfg.prioritized_sampling
    assert [s.prioritized_sampling for s in plan(cfg)] == [off, True, True, True, off]
    assert eval_limits(cfg)["advanced"] == cfg.eval_max_new_tokens  # no stage trains at 320 now
    assert build("default", None, {"learning_rate": "1e-5"}).stages[1].get("learning_rate") is None
    # the same from a --config file, with --steps scaling the stages as before
    path = tmp_path / "mine.yaml"
    path.write_text("max_new_tokens: 64\nprompts_per_step: 2\nsteps: 10\n")
    cfg = build("default", str(path))
    assert [(s.max_new_tokens, s.prompts_per_step) for s in plan(cfg)] == [(64, 2)] * 5 and cfg.total_steps == 10
    assert all("max_new_tokens" not in s and "prompts_per_step" not in s for s in cfg.stages)  # yours hold in each
    # a stage of your own keeps its values over the top-level field
    path.write_text("max_new_tokens: 64\nprompts_per_step: 2\nstages:\n  - basic:2\n"
                    "  - {name: advanced, steps: 3, max_new_tokens: 320, prompts_per_step: 8}\n")
    cfg = build("default", str(path), {"max_new_tokens": "48"})
    assert [(s.max_new_tokens, s.prompts_per_step) for s in plan(cfg)] == [(48, 2), (320, 8)]
    assert PROFILES["default"]["stages"][-1]["max_new_tokens"] == 320  # building does not mutate the profile


def test_a_key_set_twice_in_a_config_file_is_an_error(tmp_path):
    """YAML keeps the last of two equal keys without a word (a prepared config once trained every sample this way)."""
    path = tmp_path / "my.yaml"
    path.write_text("train_samples: 4\nseed: 1\ntrain_samples: 0\n")
    with pytest.raises(ConfigError, match=re.escape("train_samples is set twice (lines 1 and 3): delete the one")):
        build(file=str(path))
    path.write_text("stages:\n- name: a\n  steps: 2\n  steps: 3\n")  # inside a stage, too
    with pytest.raises(ConfigError, match=re.escape("steps is set twice (lines 3 and 4)")):
        load_file(path)
    path.write_text("train_samples: 4\nseed: 1\n")
    assert load_file(path) == {"train_samples": 4, "seed": 1}

