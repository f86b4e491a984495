"""`cpu_grpo.GRPOTrainer`: TRL's GRPOTrainer, run by this tool's loop on the CPU.

    from cpu_grpo import GRPOConfig, GRPOTrainer      # was: from trl import GRPOConfig, GRPOTrainer
    trainer = GRPOTrainer(model="smollm2-135m", reward_funcs=[my_reward], train_dataset=dataset,
                          args=GRPOConfig(output_dir="out", learning_rate=1e-5, num_generations=8))
    trainer.train()                                     # the run directory `out`: the CLI's, step for step
    trainer.evaluate()                                  # held-out accuracy before and after, paired

The trainer turns its arguments into the run's config (grpo_config.py) and the CLI's task and reward specs:
datasets are written into the run directory (`out/dataset.jsonl`, or `out/dataset/` with an eval_dataset), so
that `cpu-grpo train --task out/dataset.jsonl ...` repeats the run; functions that no module path reaches (a
script's, a notebook's) are handed to the loop by name for the run's length.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import shutil
from pathlib import Path

from . import config
from .errors import ConfigError, RunDirError, UserError
from .grpo_config import GRPOConfig

PROFILE = "python"  # summary.json's profile of a run started from Python


class GRPOTrainer:
    """TRL's signature; the arguments this tool cannot honour (optimizers, quantization, a rollout function) are
    refused when given, each in one sentence. `tools`: typed functions with a docstring, or builtin names
    ("calculator"), as `cpu-grpo train --tools` takes them; `environment_factory`: a class (or a callable that
    makes one) or a dict of them by name, as TRL takes it (data/environments.py)."""

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config=None, tools=None, rollout_func=None,
                 environment_factory=None):
        refused = {"reward_processing_classes": reward_processing_classes, "quantization_config":
                   quantization_config, "rollout_func": rollout_func}
        if name := next((k for k, v in refused.items() if v is not None), None):
            raise ConfigError(f"GRPOTrainer({name}=...) is not supported by cpu-grpo yet: remove it.")
        if tuple(optimizers) != (None, None):
            raise ConfigError("GRPOTrainer(optimizers=...) is not supported: the optimizer is AdamW (learning_rate, "
                              "weight_decay, max_grad_norm and lr_scheduler_type in GRPOConfig set it).")
        if train_dataset is None:
            raise ConfigError("GRPOTrainer needs a train_dataset: a datasets.Dataset, a list of dicts with a "
                              "'prompt', or a task name or file as `cpu-grpo train --task` takes.")
        if isinstance(model, str) and not model:
            raise ConfigError("GRPOTrainer(model=''): give a model id, an alias, a directory or a model object.")
        self.model_spec, self._given = _model(model, processing_class)
        if args is None:  # TRL: the model's name and -GRPO
            args = GRPOConfig(f"{self.model_spec.rstrip('/').split('/')[-1]}-GRPO")
        if not isinstance(args, GRPOConfig):
            raise ConfigError(f"args is a {type(args).__name__}: give cpu_grpo.GRPOConfig(...) (TRL's field names).")
        self.args = args
        self.rewards, self.functions = _rewards(reward_funcs)
        self.tools = list(tools or [])
        if bad := next((t for t in self.tools if not (callable(t) or isinstance(t, str))), None):
            raise ConfigError(f"tools=[...] holds a {type(bad).__name__}: give functions (typed, with a docstring) "
                              "or builtin names such as 'calculator'.")
        self.environments = _environments(environment_factory)
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.lora = _lora(peft_config)
        self.callbacks = [c() if isinstance(c, type) else c for c in callbacks or []]
        self.run_dir = Path(args.output_dir or "runs/python")
        self._trained, self._loaded = False, None

    def add_callback(self, callback) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    @property
    def model(self):
        """The model: the object you gave (trained in place); else, once a checkpoint exists, its newest one
        (LoRA merged), loaded on first use; None before."""
        from .engine.models import load_model
        from .train import checkpoint

        if self._given:
            return self._given[0]
        last = checkpoint.latest(self.run_dir)
        if last is not None and (self._loaded is None or self._loaded[0] != last):
            self._loaded = (last, load_model(str(last), log=lambda *a: None)[0])
        return self._loaded[1] if last is not None else None

    def config(self, resume: bool = False) -> config.TrainConfig:
        """The run's config, as `cpu-grpo train` would take it (its train_config.yaml)."""
        task, eval_size = _task(self.train_dataset, self.eval_dataset, self.run_dir, write=not resume)
        rows = _train_rows(task)
        fields = self.args.fields(rows)
        fields.setdefault("reward_weights", [1.0] * len(self.rewards))
        mine = {"model": self.model_spec, "task": task, "rewards": self.rewards, "output_dir": str(self.run_dir),
                **({"tools": [t if isinstance(t, str) else t.__name__ for t in self.tools]} if self.tools else {}),
                **({"environment": [f"{n}={key}" if n else key for n, key in self.environments]}
                   if self.environments else {}),
                "train_size": max(config.TrainConfig.train_size, rows), **self.lora,
                **({"eval_size": eval_size} if eval_size else {})}
        return config.build(None, None, {**fields, **mine})

    def train(self, resume_from_checkpoint: bool | str | None = None):
        """Train (or continue the run in output_dir: True, or the path of its newest checkpoint); returns
        transformers' TrainOutput(global_step, training_loss, metrics)."""
        from transformers.trainer_utils import TrainOutput

        from .data import environments, rewards, tools
        from .engine import models
        from .train.loop import train

        if self._trained:
            raise UserError("train() was called already: it trained the run in "
                            f"{self.run_dir}; to go on, make a GRPOTrainer with a larger max_steps and call "
                            "train(resume_from_checkpoint=True).")
        resume = _resume(resume_from_checkpoint, self.run_dir)
        if not resume and (self.run_dir / "metrics.jsonl").exists():
            raise RunDirError(f"{self.run_dir} already holds a run: pass train(resume_from_checkpoint=True) to "
                              "continue it, or choose another output_dir (nothing was overwritten).")
        cfg = self.config(resume)
        self._trained = True
        hooks = _Callbacks(self.callbacks, self.args, cfg.total_steps)
        hooks.call("on_train_begin")
        given = models.given(self.model_spec, *self._given) if self._given else contextlib.nullcontext()
        envs = environments.given({key: f for (_, key), f in self.environments.items()})
        with given, rewards.given(self.functions), tools.given([t for t in self.tools if callable(t)]), envs:
            train(cfg, profile=PROFILE, resume=resume, stop=hooks.stop, hooks=hooks)
        records = [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["loss"] for r in records if isinstance(r.get("loss"), float) and math.isfinite(r["loss"])]
        return TrainOutput(records[-1]["step"] if records else 0, sum(losses) / max(1, len(losses)),
                           {"train_runtime": sum(r["step_seconds"] for r in records), **self._summary()})

    def evaluate(self) -> dict:
        """The run's held-out accuracy before and after training and the paired change (McNemar), per held-out
        set: `eval_accuracy_before`, `eval_accuracy`, `eval_accuracy_change`, `eval_p_value`, `eval_n`
        (`eval_<set>_...` when the run has several)."""
        if not (self.run_dir / "summary.json").exists():
            raise UserError("evaluate() reports a run's held-out accuracy before and after training: call train() "
                            "first (it evaluates both), or use `cpu-grpo eval --model MODEL --task TASK`.")
        return self._summary()

    def _summary(self) -> dict:
        path = self.run_dir / "summary.json"
        levels = json.loads(path.read_text())["levels"] if path.exists() else {}
        out = {}
        for name, e in levels.items():
            key = "eval" if len(levels) == 1 else f"eval_{name}"
            out.update({f"{key}_accuracy_before": e["before"]["accuracy"], f"{key}_n": e["before"]["n"]})
            if "after" in e:
                out[f"{key}_accuracy"] = e["after"]["accuracy"]
            if "delta" in e:
                out.update({f"{key}_accuracy_change": e["delta"]["diff"], f"{key}_p_value": e["delta"]["p_value"]})
        return out

    def save_model(self, output_dir: str | None = None) -> Path:
        """The trained model (or the LoRA adapter) in a Hugging Face directory, `from_pretrained` ready: output_dir,
        else the run's own (as TRL saves to args.output_dir)."""
        from .train import checkpoint

        last = checkpoint.latest(self.run_dir)
        if last is None:
            raise UserError(f"save_model(): {self.run_dir} holds no checkpoint yet: call train() first.")
        out = Path(output_dir or self.run_dir)
        out.mkdir(parents=True, exist_ok=True)
        for file in last.iterdir():
            if file.is_file() and not file.name.startswith(".") and file.name not in KEPT_IN_RUN:
                shutil.copy2(file, out / file.name)
        return out


KEPT_IN_RUN = ("trainer_state.pt", "train_config.yaml", "STAGE_END", "GOOD", "ewc.pt")


def _model(model, processing_class) -> tuple[str, tuple | None]:
    """The run's model spec, and the (model, tokenizer) objects to train where you gave objects."""
    if isinstance(model, str):
        if processing_class is None:
            return model, None
        from .engine.models import load_model

        return model, (load_model(model)[0], processing_class)
    from transformers import AutoTokenizer, PreTrainedModel

    if not isinstance(model, PreTrainedModel) or hasattr(model, "peft_config"):
        raise ConfigError(f"model is a {type(model).__name__}: give a transformers PreTrainedModel (for LoRA, the "
                          "base model and peft_config=LoraConfig(...)), a model id, an alias or a directory.")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"the model is on {device}: cpu-grpo trains on the CPU; move it with model.to('cpu').")
    spec = model.name_or_path or type(model).__name__
    tok = processing_class or AutoTokenizer.from_pretrained(spec)
    return spec, (model, tok)


def _rewards(reward_funcs) -> tuple[list[str], dict]:
    """The run's reward specs, and the functions handed over by name (those no module path reaches)."""
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if reward_funcs is None or not funcs:
        raise ConfigError("GRPOTrainer needs reward_funcs: a function (completions, **columns) -> list of floats, "
                          "a builtin name (docs/tasks.md), or a list of them.")
    specs, handed = [], {}
    for fn in funcs:
        if isinstance(fn, str):
            specs.append(fn)
            continue
        if not callable(fn):
            raise ConfigError(f"reward_funcs holds a {type(fn).__name__}: give functions or their names.")
        name = getattr(fn, "__name__", type(fn).__name__)
        module = getattr(fn, "__module__", "__main__")
        try:
            found = module != "__main__" and getattr(importlib.import_module(module), name, None) is fn
        except Exception:
            found = False
        spec = f"{module}:{name}" if found else name
        if spec in specs:
            raise ConfigError(f"two reward functions are named {name}: give them different names (each is logged "
                              "as reward/<name>).")
        specs.append(spec)
        if not found:
            handed[spec] = fn
    return specs, handed


def _environments(factory) -> dict[tuple[str, str], object]:
    """TRL's environment_factory (a callable, or a dict of them by name) as {(name, key): factory}: the key it is
    handed to the loop by (`cpu-grpo train --environment name=key`), the name a row's `environment` column gives
    ("" for the one every row uses)."""
    if factory is None:
        return {}
    named = factory if isinstance(factory, dict) else {"": factory}
    if bad := next((n for n, f in named.items() if not callable(f) or not isinstance(n, str) or "=" in n), None):
        raise ConfigError(f"environment_factory: {bad!r} is not a name and a class: give a class (or a callable that "
                          "returns an environment), or a dict of them by name, as TRL takes it.")
    out = {}
    for i, (name, f) in enumerate(named.items()):
        key = getattr(f, "__name__", "")
        out[(name, key if key.isidentifier() and key not in (k for _, k in out) else f"environment_{i}")] = f
    return out


def _lora(peft_config) -> dict:
    """A peft LoraConfig as the run's LoRA fields; what they cannot say is refused."""
    if peft_config is None:
        return {}
    from peft import LoraConfig

    if not isinstance(peft_config, LoraConfig):
        raise ConfigError(f"peft_config is a {type(peft_config).__name__}: cpu-grpo trains LoRA adapters; give "
                          "peft.LoraConfig(r=..., lora_alpha=...).")
    plain = LoraConfig()
    for name in ("bias", "use_rslora", "use_dora", "modules_to_save", "layers_to_transform", "init_lora_weights"):
        if getattr(peft_config, name) != getattr(plain, name):
            raise ConfigError(f"LoraConfig({name}={getattr(peft_config, name)!r}) is not supported here: leave it "
                              "at peft's default (r, lora_alpha, lora_dropout and target_modules are read).")
    targets = peft_config.target_modules
    targets = "all-linear" if targets is None else targets if isinstance(targets, str) else ",".join(sorted(targets))
    return {"use_lora": True, "lora_r": peft_config.r, "lora_alpha": peft_config.lora_alpha,
            "lora_dropout": peft_config.lora_dropout, "lora_target_modules": targets}


def _task(train_dataset, eval_dataset, run_dir: Path, write: bool) -> tuple[str, int]:
    """The run's --task for the datasets (written into the run directory), and the held-out size when an
    eval_dataset is given (all of it)."""
    if isinstance(train_dataset, str) and eval_dataset is None:
        return train_dataset, 0
    train, held = _rows(train_dataset, "train_dataset"), _rows(eval_dataset, "eval_dataset")
    if eval_dataset is None:
        path = run_dir / "dataset.jsonl"
        if write:
            run_dir.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(row) + "\n" for row in train))
        return str(path), 0
    path = run_dir / "dataset"
    if write:
        try:
            from datasets import Dataset, DatasetDict
        except ImportError:
            raise ConfigError("an eval_dataset is kept as a saved dataset: pip install datasets") from None
        DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(held)}).save_to_disk(str(path))
    return str(path), len(held)


def _rows(dataset, name: str) -> list[dict]:
    """A dataset's rows as JSON-ready dicts."""
    if dataset is None:
        return []
    if isinstance(dataset, str):
        raise ConfigError(f"{name} is a task name or path: with an eval_dataset, give both as datasets or lists of "
                          "dicts (or give the task alone: its held-out fifth is evaluated).")
    kind = type(dataset).__name__
    if kind in ("IterableDataset", "DatasetDict", "IterableDatasetDict") or isinstance(dataset, dict):
        raise ConfigError(f"{name} is a {kind}: give one split as a datasets.Dataset (dataset['train']) or a list "
                          "of dicts.")
    rows = [dict(row) for row in dataset]
    try:
        json.dumps(rows[:1])
    except TypeError as e:
        raise ConfigError(f"{name}: a row holds something that is not text, a number, a list or a dict ({e}): "
                          "keep columns of plain data.") from None
    if not rows or not all(isinstance(row, dict) for row in rows):
        raise ConfigError(f"{name} is empty or not rows of dicts: give rows with a 'prompt'.")
    return rows


def _train_rows(task: str) -> int:
    from .data.loaders import load_task

    return len(load_task(task, n=None, split="train"))


def _resume(value, run_dir: Path) -> bool:
    """train(resume_from_checkpoint=...): True, a path to the run's newest checkpoint, or nothing."""
    if value in (None, False):
        return False
    if value is True:
        return True
    from .train import checkpoint

    newest = checkpoint.latest(run_dir)
    if newest is None or Path(value).resolve() != newest.resolve():
        raise UserError(f"resume_from_checkpoint={value!r}: a run continues from its newest complete checkpoint "
                        f"({newest or 'none yet'} in {run_dir}): pass True.")
    return True


class _Callbacks:
    """transformers' TrainerCallbacks heard from the loop (train/trackers.Hooks): on_train_begin, on_step_end,
    on_log (every logging_steps), on_save and on_train_end, with TRL's metric names; `control.should_training_stop`
    ends the run after the step at hand, its checkpoint saved (as Ctrl-C does)."""

    def __init__(self, callbacks: list, args: GRPOConfig, total_steps: int):
        from transformers import TrainerControl, TrainerState

        from .train.step import StopFlag

        every = args.logging_steps if args.logging_steps >= 1 else max(1, math.ceil(args.logging_steps * total_steps))
        self.callbacks, self.args, self.every = callbacks, args, int(every)
        self.state = TrainerState(max_steps=total_steps, logging_steps=self.every, save_steps=args.save_steps)
        self.control, self.stop = TrainerControl(), StopFlag()

    def call(self, event: str, **kwargs) -> None:
        for callback in self.callbacks:
            result = getattr(callback, event, None)
            out = result(self.args, self.state, self.control, **kwargs) if result else None
            self.control = out if out is not None else self.control
        if self.control.should_training_stop and not self.stop.requested:
            self.stop.requested = True
            print(f"a callback asked training to stop (control.should_training_stop) at step "
                  f"{self.state.global_step}: the run ends after this step, its checkpoint saved")

    def step_end(self, record: dict) -> None:
        from .train.trackers import trl_metrics

        self.state.global_step = record["step"]
        self.call("on_step_end")
        if record["step"] % self.every == 0 or record["step"] == self.state.max_steps:
            logs = trl_metrics(record)
            self.state.log_history.append({**logs, "step": record["step"]})
            self.call("on_log", logs=logs)

    def saved(self, checkpoint: Path) -> None:
        self.call("on_save", checkpoint=str(checkpoint))

    def finished(self, summary: dict) -> None:
        self.call("on_train_end", metrics=summary)
