"""`cpu_grpo.GRPOConfig`: TRL's GRPOConfig, field for field where this tool has the meaning, TRL's defaults.

A field TRL has and this tool does not (vLLM, DeepSpeed, SAPO's temperatures, ...) is refused in one sentence when
you set it to anything but TRL's default, never ignored; a misspelt one names the nearest. This tool's own fields
(`use_lora`, `dynamic_sampling`, `eval_size`, ...: docs/config.md) are taken too. docs/python-api.md is the table.
"""

from __future__ import annotations

import dataclasses
import math

from .config import TrainConfig, nearest
from .config.trl import BATCH, RENAMED, from_trl
from .errors import ConfigError

# TRL 1.16's GRPOConfig (and TrainingArguments) fields this tool reads, with TRL's defaults
TRL_DEFAULTS = dict(
    output_dir=None, run_name=None, seed=42, learning_rate=1e-6, lr_scheduler_type="linear", warmup_steps=0,
    weight_decay=0.0, max_grad_norm=1.0, num_train_epochs=3.0, max_steps=-1, per_device_train_batch_size=8,
    gradient_accumulation_steps=1, generation_batch_size=None, steps_per_generation=None, num_generations=8,
    max_completion_length=512, temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, epsilon_high=None,
    num_iterations=1, loss_type="dapo", scale_rewards="group", reward_weights=None, bf16=None,
    gradient_checkpointing=True, logging_steps=10, save_strategy="steps", save_steps=500, save_total_limit=None,
    report_to="none", log_completions=False, trust_remote_code=False, min_p=None, repetition_penalty=1.0,
    importance_sampling_level="token", mask_truncated_completions=False, top_entropy_quantile=1.0,
    multi_objective_aggregation="sum_then_normalize",
)
# the fields that mean nothing more on a CPU, whatever their value
NO_EFFECT = ("use_cpu", "disable_tqdm", "log_level", "logging_dir", "overwrite_output_dir")
# TRL's fields this tool does not have (TRL 1.16's defaults): refused unless left at them
TRL_ONLY = dict(
    model_init_kwargs=None, router_aux_loss_coef=None, disable_dropout=False, cast_lm_head_to_fp32=False,
    num_generations_eval=None, ds3_gather_for_generation=True, shuffle_dataset=True, pad_to_multiple_of="auto",
    generation_kwargs=None, chat_template_kwargs=None, cache_implementation=None,
    use_vllm=False, vllm_mode="colocate", vllm_model_impl="vllm", vllm_enable_sleep_mode=False,
    vllm_structured_outputs_regex=None, vllm_server_base_url=None, vllm_server_host="0.0.0.0", vllm_server_port=8000,
    vllm_server_timeout=240.0, vllm_group_port=51216, vllm_gpu_memory_utilization=0.3, vllm_max_model_length=None,
    vllm_tensor_parallel_size=1, delta=None, sapo_temperature_neg=1.05, sapo_temperature_pos=1.0, vespo_k_pos=2.0,
    vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0, sync_ref_model=False,
    ref_model_mixup_alpha=0.6, ref_model_sync_steps=512, entropy_coef=0.0,
    use_adaptive_entropy=False, entropy_coef_min=0.0, entropy_coef_max=1.0, entropy_coef_delta=0.005,
    entropy_target=0.2, vllm_importance_sampling_correction=True,
    vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=3.0,
    vllm_importance_sampling_clip_min=None, off_policy_mask_threshold=None, use_bias_correction_kl=True,
    log_multimodal=True, num_completions_to_print=None, log_unique_prompts=False, log_completions_hub_repo=None,
    use_transformers_continuous_batching=False, transformers_continuous_batching_config=None,
    use_transformers_paged=False, vllm_importance_sampling_cap=None, remove_unused_columns=False,
)
WHY = {"vllm": "rollouts here come from this tool's own sampler on the CPU",
       "deepspeed": "this tool trains on CPU processes (the CLI's --nproc runs torchrun)",
       "fsdp": "this tool trains on CPU processes (the CLI's --nproc runs torchrun)",
       "fp16": "bf16 is the CPU's half precision (bf16=True, the default)",
       "push_to_hub": "nothing here reaches the hub: save_model() and `cpu-grpo export` write the model",
       "eval_strategy": "the run evaluates its held-out set before and after training (eval_size)"}
OURS = {f.name for f in dataclasses.fields(TrainConfig)}


def _transformers_defaults() -> dict:
    from transformers import TrainingArguments

    return {f.name: f.default_factory() if callable(f.default_factory) else f.default
            for f in dataclasses.fields(TrainingArguments) if f.init}


class GRPOConfig:
    """TRL's `GRPOConfig(output_dir=..., learning_rate=..., num_generations=..., ...)`; read what a field sets
    here in docs/python-api.md.

    >>> GRPOConfig("out", learning_rate=1e-5, num_generations=4, per_device_train_batch_size=8).fields(100)["steps"]
    150
    >>> GRPOConfig(learnig_rate=1e-5)
    Traceback (most recent call last):
    ...
    cpu_grpo.errors.ConfigError: GRPOConfig has no field learnig_rate (did you mean learning_rate?).
    """

    def __init__(self, output_dir: str | None = None, **kwargs):
        given = {"output_dir": output_dir, **kwargs} if output_dir is not None else dict(kwargs)
        theirs = None
        for name, value in given.items():
            if name in TRL_DEFAULTS or name in OURS or name in NO_EFFECT:
                continue
            theirs = theirs or {**_transformers_defaults(), **TRL_ONLY}
            if name not in theirs:
                raise ConfigError(f"GRPOConfig has no field {name}{nearest(name, [*TRL_DEFAULTS, *OURS, *theirs])}.")
            if getattr(value, "value", value) != theirs[name]:  # an enum of transformers' or its value
                why = next((w for key, w in WHY.items() if key in name), "cpu-grpo has no such option yet")
                raise ConfigError(f"GRPOConfig({name}={value!r}) is not supported here ({why}): remove it "
                                  "(docs/python-api.md lists what each field does here).")
        self.__dict__.update({**TRL_DEFAULTS, **given})
        self._given = set(given)
        self.fields(1)  # checked now, as TRL checks its config when it is made

    def __repr__(self) -> str:
        return f"GRPOConfig({', '.join(f'{k}={getattr(self, k)!r}' for k in sorted(self._given))})"

    def fields(self, train_rows: int) -> dict:
        """This tool's config fields for a run on `train_rows` training prompts (steps from num_train_epochs
        where max_steps is not set, as TRL counts them)."""
        trl = {k: getattr(self, k) for k in TRL_DEFAULTS}
        ours = {k: getattr(self, k) for k in self._given if k in OURS and k not in TRL_DEFAULTS}
        if ours.get("max_tool_calling_iterations", 0) is None:  # TRL's default, no limit: this tool's default
            del ours["max_tool_calling_iterations"]
        if self.epsilon_high is None:  # TRL: the upper clip is epsilon's
            trl["epsilon_high"] = self.epsilon
        trl["scale_rewards"] = {True: "group", False: "none"}.get(self.scale_rewards, self.scale_rewards)
        trl["bf16"] = "false" if self.bf16 is False else "true"  # TRL: bf16 unless fp16
        trl["report_to"] = [] if self.report_to in ("none", None, []) else \
            [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        if self.save_strategy not in ("steps", "no"):
            raise ConfigError(f"save_strategy {self.save_strategy!r} is not available here: use 'steps' (a "
                              "checkpoint every save_steps and at the end) or 'no' (at the end only).")
        if self.save_strategy == "no":
            trl["save_steps"] = 0
        trl["min_p"] = self.min_p or 0.0  # TRL: None is off
        trl["log_completions_every"] = max(1, int(self.logging_steps)) if self.log_completions else 0
        if self.reward_weights is None:
            del trl["reward_weights"]  # one 1.0 per reward function, filled in by the trainer
        for name in ("output_dir", "run_name"):
            trl[name] = trl[name] or ""
        for name in ("log_completions", "logging_steps", "num_train_epochs", "save_strategy"):
            del trl[name]
        for name in self._given & set(TRL_DEFAULTS):  # a TRL name and this tool's for one field: one of them
            same = RENAMED.get(name, "prompts_per_step" if name in BATCH else None)
            if same in ours:
                raise ConfigError(f"{name} (TRL's) and {same} (this tool's) set the same field: give one of them.")
        mine = {RENAMED.get(k, k) for k in ours} | ({*BATCH} if "prompts_per_step" in ours else set())
        fields = from_trl({k: v for k, v in trl.items() if k not in ours and k not in mine},
                          ours.get("num_generations", self.num_generations))
        if "steps" not in fields and "steps" not in ours:
            fields["steps"] = math.ceil(self.num_train_epochs * train_rows / fields["prompts_per_step"])
        return {**fields, **ours}
