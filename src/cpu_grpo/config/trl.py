"""TRL's `GRPOConfig` field names, read as this tool's fields: one table for the Python API (`cpu_grpo.GRPOConfig`),
the YAML file and the command line (`--max-completion-length 256` is `--max-new-tokens 256`).

TRL's batch is counted in completions (`per_device_train_batch_size` x processes x `steps_per_generation`, the
`generation_batch_size`); this tool's in prompts: `prompts_per_step` = `generation_batch_size / num_generations`.
One rollout batch is one optimizer step here, as in TRL's default (`steps_per_generation` =
`gradient_accumulation_steps`). This module must not import torch.
"""

from __future__ import annotations

from ..errors import ConfigError

# TRL's name -> this tool's field of the same meaning
RENAMED = {
    "max_completion_length": "max_new_tokens",
    "max_steps": "steps",
    "save_steps": "save_every",
    "save_total_limit": "keep_checkpoints",
    "lr_scheduler_type": "lr_scheduler",
}
# TRL's names read together into prompts_per_step
BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size", "steps_per_generation")
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}


def from_trl(values: dict, num_generations: int, world_size: int = 1) -> dict:
    """`values` with TRL's names replaced by this tool's fields (the others as they are), `num_generations` the
    run's. A name given both ways, a batch that holds no whole groups, or a value this tool has no meaning for is a
    ConfigError in TRL's words.

    >>> from_trl({"max_completion_length": 256, "per_device_train_batch_size": 16}, num_generations=8)
    {'max_new_tokens': 256, 'prompts_per_step': 2}
    >>> from_trl({"lr_scheduler_type": "constant_with_warmup", "save_total_limit": None}, 8)
    {'keep_checkpoints': 1000000, 'lr_scheduler': 'constant'}
    """
    out = {k: v for k, v in values.items() if k not in RENAMED and k not in BATCH}
    for trl, ours in RENAMED.items():
        if trl not in values:
            continue
        if ours in values:
            raise ConfigError(f"{trl} and {ours} are the same field (TRL's name and this tool's): give one of them.")
        out[ours] = _value(trl, values[trl])
    if steps := out.get("steps"):  # TRL: max_steps -1 is "from num_train_epochs"
        if steps < 0:
            del out["steps"]
    if any(k in values for k in BATCH):
        if "prompts_per_step" in values:
            raise ConfigError("per_device_train_batch_size (TRL's, in completions) and prompts_per_step (this "
                              "tool's) set the same batch: give one of them.")
        out["prompts_per_step"] = prompts_per_step(values, num_generations, world_size)
    return out


def _value(trl: str, value):
    if trl == "lr_scheduler_type":
        name = getattr(value, "value", value)  # transformers' SchedulerType enum or its string
        if name not in SCHEDULERS:
            raise ConfigError(f"lr_scheduler_type {name!r} is not available here: use linear, cosine, constant or "
                              "constant_with_warmup (warmup_steps applies to each).")
        return SCHEDULERS[name]
    if trl == "save_total_limit" and value is None:  # TRL: keep them all
        return 1_000_000
    return value


def prompts_per_step(values: dict, num_generations: int, world_size: int = 1) -> int:
    """Prompts per optimizer step from TRL's batch fields, checked as TRL's GRPOConfig checks them.

    >>> prompts_per_step({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4}, 8)
    2
    >>> prompts_per_step({"per_device_train_batch_size": 6}, 8)
    Traceback (most recent call last):
    ...
    cpu_grpo.errors.ConfigError: generation_batch_size (6) must be divisible by num_generations (8).
    """
    per_device = values.get("per_device_train_batch_size", 8)
    accumulation = values.get("gradient_accumulation_steps", 1)
    generation, steps = values.get("generation_batch_size"), values.get("steps_per_generation")
    if min(per_device, accumulation) < 1:
        raise ConfigError("per_device_train_batch_size and gradient_accumulation_steps must be >= 1.")
    if generation is not None and steps is not None:
        raise ConfigError("'generation_batch_size' and 'steps_per_generation' can not be both configured at the same "
                          "time")
    if generation is not None:
        if generation % (per_device * world_size):
            raise ConfigError(f"generation_batch_size ({generation}) must be divisible by the global batch size "
                              f"({per_device * world_size}).")
        steps = generation // (per_device * world_size)
    steps = accumulation if steps is None else steps
    if steps != accumulation:
        raise ConfigError(f"steps_per_generation {steps} differs from gradient_accumulation_steps {accumulation}: "
                          "here one rollout batch makes one optimizer step; give generation_batch_size = "
                          "per_device_train_batch_size x gradient_accumulation_steps, or leave it unset.")
    generation = per_device * world_size * steps
    if generation % num_generations:
        raise ConfigError(f"generation_batch_size ({generation}) must be divisible by num_generations "
                          f"({num_generations}).")
    return generation // num_generations
