"""The Python API a TRL user writes: `from cpu_grpo import GRPOConfig, GRPOTrainer`, TRL's field names and defaults,
callbacks, evaluate() and save_model(); the same run as the CLI's; TRL's own quickstart and an example script of
its, with the import line, the model and the dataset changed."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
import yaml

from cpu_grpo import GRPOConfig, GRPOTrainer, config
from cpu_grpo.cli import config_from, main
from cpu_grpo.errors import ConfigError, UserError
from cpu_grpo.rundir import read_jsonl

TIMES = ("step_seconds", "time_rollout", "time_scoring", "time_update", "rollout_tok_s", "train_tok_s", "rss_mb",
         "peak_rss_mb")


def rows(n: int = 40) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"What is {i} plus {i + 1}?"}], "answer": str(2 * i + 1)}
            for i in range(n)]


def quick(out, **kw) -> GRPOConfig:
    """A run of the tiny model that takes seconds: TRL's names, and this tool's eval_size."""
    values = dict(learning_rate=1e-3, num_generations=4, per_device_train_batch_size=8, max_steps=3,
                  max_completion_length=12, logging_steps=2, save_steps=2, eval_size=6, eval_max_new_tokens=8,
                  score_truncated=True, gradient_checkpointing=False, seed=0)
    return GRPOConfig(str(out), **{**values, **kw})


def length_reward(completions, **kwargs):
    return [len(c[0]["content"] if isinstance(c, list) else c) / 10 for c in completions]


# ---------------------------------------------------------------------------- the config: TRL's names


def test_trl_fields_map_onto_this_tools():
    fields = GRPOConfig("out", per_device_train_batch_size=16, gradient_accumulation_steps=2, num_generations=8,
                        max_completion_length=256, epsilon=0.2, scale_rewards=False, lr_scheduler_type="cosine",
                        save_steps=50, save_total_limit=3, report_to="tensorboard").fields(train_rows=100)
    assert fields["prompts_per_step"] == 4  # 16 x 2 completions a step, in groups of 8
    assert fields["steps"] == 75  # TRL's default 3 epochs of 100 prompts, 4 a step
    assert (fields["max_new_tokens"], fields["epsilon_high"], fields["scale_rewards"]) == (256, 0.2, "none")
    assert (fields["lr_scheduler"], fields["save_every"], fields["keep_checkpoints"]) == ("cosine", 50, 3)
    assert fields["report_to"] == ["tensorboard"] and fields["seed"] == 42 and fields["learning_rate"] == 1e-6
    assert GRPOConfig(max_steps=7).fields(100)["steps"] == 7
    assert GRPOConfig(use_lora=True, dynamic_sampling=4).fields(10)["dynamic_sampling"] == 4  # this tool's own


@pytest.mark.parametrize("kw, words", [
    (dict(learnig_rate=1e-5), "no field learnig_rate (did you mean learning_rate?)"),
    (dict(use_vllm=True), "GRPOConfig(use_vllm=True) is not supported here (rollouts here come from"),
    (dict(deepspeed="ds.json"), "GRPOConfig(deepspeed='ds.json') is not supported here"),
    (dict(per_device_train_batch_size=6), "generation_batch_size (6) must be divisible by num_generations (8)"),
    (dict(generation_batch_size=16, steps_per_generation=2), "can not be both configured"),
    (dict(steps_per_generation=4), "here one rollout batch makes one optimizer step"),
    (dict(max_steps=5, steps=5), "max_steps (TRL's) and steps (this tool's) set the same field"),
    (dict(save_strategy="epoch"), "save_strategy 'epoch' is not available here"),
])
def test_bad_config_is_one_sentence(kw, words):
    with pytest.raises(ConfigError) as e:
        GRPOConfig("out", **kw)
    assert words in str(e.value)


def test_fields_at_their_trl_default_pass():
    GRPOConfig("out", use_vllm=False, push_to_hub=False, use_cpu=True, optim="adamw_torch_fused", fp16=False)


def test_the_cli_and_yaml_take_trl_names(tmp_path):
    ours = config.build(None, None, {"max_new_tokens": 64, "prompts_per_step": 4, "num_generations": 4,
                                     "lr_scheduler": "cosine", "steps": 9})
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"max_completion_length": 64, "per_device_train_batch_size": 16,
                                    "num_generations": 4, "lr_scheduler_type": "cosine", "max_steps": 9}))
    assert config.build(None, str(file), {}) == ours
    parser_args = ["train", "--max-completion-length", "64", "--per-device-train-batch-size", "16",
                   "--num-generations", "4", "--lr-scheduler-type", "cosine", "--max-steps", "9"]
    import argparse

    from cpu_grpo.cli import _training_commands
    parser = argparse.ArgumentParser()
    _training_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(parser_args)
    args.profile, args.config, args.resume = None, None, False
    args.default_profile = None
    assert config_from(args)[0] == ours
    with pytest.raises(ConfigError, match="did you mean learning_rate"):
        config.build(None, None, {"learnig_rate": 1e-5})


# ---------------------------------------------------------------------------- the trainer: bad input


@pytest.mark.parametrize("kw, words", [
    (dict(reward_funcs=None), "needs reward_funcs"),
    (dict(train_dataset=None), "needs a train_dataset"),
    (dict(optimizers=(object(), None)), "optimizers=...) is not supported"),
    (dict(tools=[3]), "tools=[...] holds a int: give functions"),
    (dict(environment_factory={"maze": 3}), "environment_factory: 'maze' is not a name and a class"),
    (dict(train_dataset={"train": rows()}), "give one split"),
    (dict(reward_funcs=[length_reward, length_reward]), "two reward functions are named length_reward"),
])
def test_bad_trainer_arguments_are_one_sentence(tiny_model, tmp_path, kw, words):
    values = dict(model=tiny_model, reward_funcs=length_reward, args=quick(tmp_path / "run"), train_dataset=rows())
    with pytest.raises(ConfigError) as e:
        GRPOTrainer(**{**values, **kw}).config()
    assert words in str(e.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_environments_are_given_as_trl_takes_them(tiny_model, tmp_path):
    """A class (every row's), or a dict of them by name (routed by the rows' `environment` column); the
    environment's get_reward joins the rewards with weight 1, as in TRL."""
    from tests.engine.test_environments import IncrementEnv

    one = GRPOTrainer(tiny_model, length_reward, quick(tmp_path / "a"), rows(), environment_factory=IncrementEnv)
    cfg = one.config()
    assert cfg.environment == ["IncrementEnv"]
    assert cfg.rewards[1:] == ["environment"] and cfg.reward_weights[1:] == [1.0]
    two = GRPOTrainer(tiny_model, length_reward, quick(tmp_path / "b"), rows(),
                      environment_factory={"count": IncrementEnv, "again": lambda: IncrementEnv()})
    assert two.config().environment == ["count=IncrementEnv", "again=environment_1"]


def test_a_model_off_the_cpu_is_refused(tiny_model, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # where a GPU's model would say cuda:0
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model))
    with pytest.raises(ConfigError, match=r"the model is on meta: .*model.to\('cpu'\)"):
        GRPOTrainer(model, length_reward, quick(tmp_path / "run"), rows())


# ---------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_train_callbacks_evaluate_save(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, TrainerCallback

    class Seen(TrainerCallback):
        events: list = []

        def on_train_begin(self, args, state, control, **kw):
            self.events.append(("begin", state.max_steps))

        def on_step_end(self, args, state, control, **kw):
            self.events.append(("step", state.global_step))

        def on_log(self, args, state, control, logs=None, **kw):
            self.events.append(("log", state.global_step, set(logs)))

        def on_save(self, args, state, control, **kw):
            self.events.append(("save", state.global_step))

        def on_train_end(self, args, state, control, **kw):
            self.events.append(("end", state.global_step))

    out = tmp_path / "run"
    trainer = GRPOTrainer(tiny_model, length_reward, quick(out), rows(), callbacks=[Seen])
    result = trainer.train()
    assert result.global_step == 3 and math.isfinite(result.training_loss)
    assert Seen.events[0] == ("begin", 3) and Seen.events[-1] == ("end", 3)
    assert [e[:2] for e in Seen.events[1:-1]] == [("step", 1), ("step", 2), ("log", 2), ("save", 2), ("step", 3),
                                                    ("log", 3), ("save", 3)]
    assert {"reward", "loss", "completions/mean_length", "rewards/length_reward/mean"} <= Seen.events[3][2]  # TRL's
    evaluation = trainer.evaluate()
    assert evaluation["eval_n"] == len(read_jsonl(out / "eval_after.jsonl")) and 0 <= evaluation["eval_accuracy"] <= 1
    assert evaluation == {k: v for k, v in result.metrics.items() if k.startswith("eval")}
    saved = trainer.save_model()
    assert AutoModelForCausalLM.from_pretrained(saved).num_parameters() > 0
    assert (out / "train_config.yaml").exists() and (out / "dataset.jsonl").exists()
    with pytest.raises(UserError, match="train\\(\\) was called already"):
        trainer.train()


@pytest.mark.slow
def test_the_same_run_as_the_cli(tiny_model, tmp_path, reward_file):
    """A GRPOTrainer run and `cpu-grpo train` with its config give the same step logs, sample for sample."""
    spec = importlib.util.spec_from_file_location("their_rewards", reward_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a function no module path reaches: handed to the loop by name
    api = GRPOTrainer(tiny_model, module.length_reward, quick(tmp_path / "api"), rows())
    api.train()
    cfg = api.config(resume=True).to_dict()
    assert cfg["rewards"] == ["length_reward"]
    cfg.update(rewards=[f"{reward_file}:length_reward"], output_dir=str(tmp_path / "cli"))
    (tmp_path / "cli.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "cli.yaml")]) == 0

    def steps(run):
        return [{k: v for k, v in r.items() if k not in TIMES} for r in read_jsonl(tmp_path / run / "metrics.jsonl")]

    assert steps("api") == steps("cli") and len(steps("api")) == 3
    groups = [[g["completions"] for g in read_jsonl(tmp_path / run / "groups.jsonl")] for run in ("api", "cli")]
    assert groups[0] == groups[1]


TINY_MATH = [{"prompt": [{"role": "user", "content": f"What is {a} times {b}? Put the answer in \\boxed{{}}."}],
              "solution": f"${a * b}$"} for a, b in [(3, 4), (6, 7), (2, 9), (5, 5), (8, 3), (7, 4)]]


@pytest.mark.slow
def test_trl_quickstart(tiny_model, tmp_path, monkeypatch):
    """TRL's documented quick start (docs/source/grpo_trainer.md), its import lines, model and dataset changed."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deepmath.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TINY_MATH))
    from datasets import load_dataset

    from cpu_grpo import GRPOTrainer
    from cpu_grpo.rewards import accuracy_reward

    dataset = load_dataset("json", data_files=str(tmp_path / "deepmath.jsonl"), split="train")

    trainer = GRPOTrainer(
        model=tiny_model,
        reward_funcs=accuracy_reward,
        train_dataset=dataset,
    )
    trainer.train()
    run = tmp_path / f"{tiny_model.rstrip('/').split('/')[-1]}-GRPO"  # TRL's default output_dir
    steps = read_jsonl(run / "metrics.jsonl")
    held_out = sum(1 for _ in read_jsonl(run / "eval_before.jsonl"))
    assert len(steps) == 3 * (len(TINY_MATH) - held_out)  # TRL's 3 epochs, one prompt (8 completions) a step
    assert all(s["groups"] == 1 for s in steps)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["profile"] == "python" and summary["steps"] == len(steps)


@pytest.mark.slow
def test_trl_example_script_grpo_tldr(tiny_model, tmp_path, monkeypatch):
    """TRL's examples/scripts/grpo_tldr.py, its import lines, model and dataset changed: its vLLM server lines are
    refused in one sentence; without them (and the GPU dtype), it trains LoRA adapters with a KL to the base."""
    monkeypatch.chdir(tmp_path)
    from datasets import Dataset
    from peft import LoraConfig

    from cpu_grpo import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list([{"prompt": f"SUBREDDIT: r/tifu\nPOST: story number {i}\nTL;DR:"}
                                 for i in range(20)])

    def reward_num_unique_chars(completions, **kwargs):
        return [len(set(c)) for c in completions]

    gpu_only = dict(use_vllm=True, vllm_mode="server", model_init_kwargs={"torch_dtype": "bfloat16"})
    script = dict(output_dir="test", bf16=True, gradient_checkpointing=True, per_device_train_batch_size=2,
                  gradient_accumulation_steps=8, num_generations=2, log_level="debug", logging_steps=1, beta=0.1)
    with pytest.raises(ConfigError, match=r"GRPOConfig\(use_vllm=True\) is not supported here"):
        GRPOConfig(**script, **gpu_only)
    training_args = GRPOConfig(**script, max_completion_length=32)  # the tiny model never stops: 32, not 512
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=tiny_model, args=training_args, reward_funcs=reward_num_unique_chars,
                          train_dataset=dataset, peft_config=peft_config)
    trainer.train()
    steps = read_jsonl(tmp_path / "test" / "metrics.jsonl")
    assert steps and all(s["groups"] == 8 and not math.isnan(s["kl"]) for s in steps)  # 2 x 8 completions, pairs
    saved = yaml.safe_load((tmp_path / "test" / "train_config.yaml").read_text())
    assert (saved["use_lora"], saved["lora_r"], saved["lora_alpha"], saved["beta"]) == (True, 8, 16, 0.1)
    assert saved["gradient_checkpointing"] is True and saved["bf16"] == "true"


def test_an_eval_dataset_is_the_held_out_set(tiny_model, tmp_path):
    """With an eval_dataset, all of train_dataset trains and all of eval_dataset is evaluated (a saved DatasetDict
    in the run directory, which `cpu-grpo train --task` reads the same way)."""
    from cpu_grpo.data.loaders import load_task

    held = rows(50)[40:]
    cfg = GRPOTrainer(tiny_model, length_reward, quick(tmp_path / "run"), rows(40), eval_dataset=held).config()
    assert cfg.task == str(tmp_path / "run" / "dataset") and cfg.eval_size == 10
    assert len(load_task(cfg.task, split="train")) == 40
    assert [ex.question for ex in load_task(cfg.task, split="test")] == [r["prompt"][0]["content"] for r in held]


def test_a_model_object_is_trained_under_its_own_name(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    trainer = GRPOTrainer(model, length_reward, quick(tmp_path / "run"), rows())
    assert trainer.config().model == tiny_model and trainer.model is model
