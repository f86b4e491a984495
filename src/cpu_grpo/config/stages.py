"""The curriculum's plan: stages (names, tasks, steps and their own settings) parsed from a config, steps shared
among them, and the completion limit of each held-out set. A run's stages are `plan(cfg)`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine")


def _bool(value) -> bool:
    """true/false as YAML or the command line write them; ValueError otherwise."""
    text = str(value).lower()
    if isinstance(value, bool) or text in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value if isinstance(value, bool) else text in ("1", "true", "yes", "on")
    raise ValueError(value)


@dataclass(frozen=True)
class Stage:
    """A curriculum stage as the run trains it, resolved once by `plan`: every setting is the stage's own where it
    gives one, else the run's."""

    name: str
    task: str
    steps: int
    promote_at: float  # move on when validation accuracy reaches this (0: no promotion check, run all steps)
    learning_rate: float
    max_new_tokens: int  # the completion limit of its rollouts
    eval_max_new_tokens: int  # the completion limit its task's held-out sets and promotion checks are evaluated at
    lr_scheduler: str  # one of SCHEDULES
    lr_over_stage: bool  # lr_scheduler runs over this stage's own steps from its learning rate (the stage set one),
    # else over the run's steps after warmup
    prioritized_sampling: bool
    dynamic_sampling_keep: str
    prompts_per_step: int
    held_out: bool  # its task's test split is a held-out set (false: measure it apart, e.g. with cpu-grpo eval)


# what a stage may say (a name, or a mapping in a --config file); those of STAGE_SETTINGS it leaves out are the run's
_STAGE_KEYS = {"name", "task", "steps", "promote_at", "learning_rate", "max_new_tokens", "lr_scheduler",
               "prioritized_sampling", "dynamic_sampling_keep", "prompts_per_step", "held_out"}
# the run's fields a stage may set for itself: given in a --config file or on the command line, they hold in every
# stage of a profile (a stage's own value wins only in stages you write yourself)
STAGE_SETTINGS = ("learning_rate", "lr_scheduler", "max_new_tokens", "prioritized_sampling", "dynamic_sampling_keep",
                  "prompts_per_step")


def parse_stage(spec) -> dict:
    """'basic', 'basic:10' or {'name': ..., 'task': ..., 'steps': ...} -> a dict of the stage's keys that it gives
    (plan resolves the rest)."""
    if isinstance(spec, str):
        if spec.strip()[:1] in "[{":  # JSON or a YAML flow list typed on the command line
            raise ConfigError("--stages takes names or name:steps: put stage mappings in a --config YAML file.")
        name, _, steps = spec.strip().partition(":")
        spec = {"name": name, **({"steps": steps} if steps else {})}
    if not isinstance(spec, dict) or not spec.get("name"):
        raise ConfigError(f"stage {spec!r}: give a name (e.g. basic), name:steps, or a mapping with a name.")
    unknown = set(spec) - _STAGE_KEYS
    if unknown:
        raise ConfigError(f"stage '{spec['name']}': unknown key(s) {', '.join(sorted(unknown))}: use "
                          f"{', '.join(sorted(_STAGE_KEYS))}.")
    out = {"name": str(spec["name"]), "task": str(spec.get("task") or spec["name"])}
    try:
        out |= {key: kind(spec[key]) for key, kind in (("steps", int), ("promote_at", float), ("learning_rate", float),
                ("max_new_tokens", int), ("lr_scheduler", str), ("dynamic_sampling_keep", str),
                ("prompts_per_step", int)) if spec.get(key) is not None}
        out |= {key: _bool(spec[key]) for key in ("prioritized_sampling", "held_out") if spec.get(key) is not None}
    except (TypeError, ValueError, ConfigError):
        raise ConfigError(f"stage '{spec['name']}': steps, max_new_tokens, prompts_per_step integers, promote_at and "
                          "learning_rate numbers, prioritized_sampling and held_out true or false.") from None
    if min(out.get(k, 0) for k in ("steps", "learning_rate", "max_new_tokens", "prompts_per_step")) < 0 \
            or not 0 <= out.get("promote_at", 0) <= 1 or out.get("lr_scheduler", "constant") not in SCHEDULES \
            or out.get("dynamic_sampling_keep", "first") not in ("first", "hardest"):
        raise ConfigError(f"stage '{spec['name']}': steps, learning_rate, max_new_tokens, prompts_per_step >= 0, "
                          "promote_at in [0, 1], lr_scheduler constant, linear or cosine, dynamic_sampling_keep first "
                          "or hardest.")
    return out


def scale_stages(stages: list, steps: int) -> list:
    """A profile's stages, every one with its own steps, scaled to `steps` in all in the same proportions (largest
    remainder, each at least 1); stages without steps already share `steps`, so they are left as they are.

    >>> scale_stages(["basic:30", "intermediate:10", "advanced:10"], 10)
    [{'name': 'basic', 'task': 'basic', 'steps': 6}, {'name': 'intermediate', 'task': 'intermediate', 'steps': 2}, \
{'name': 'advanced', 'task': 'advanced', 'steps': 2}]
    """
    specs = [parse_stage(s) for s in stages]
    total = sum(s.get("steps", 0) for s in specs)
    if any("steps" not in s for s in specs) or total == 0:
        return stages
    if steps < len(specs):
        raise ConfigError(f"steps {steps} < {len(specs)} stages: give {len(specs)} or more, or --stages.")
    shares = [max(1, steps * s["steps"] // total) for s in specs]
    by_remainder = sorted(range(len(specs)), key=lambda i: -(steps * specs[i]["steps"] % total))
    for i in by_remainder[:max(0, steps - sum(shares))]:
        shares[i] += 1
    while sum(shares) > steps:  # the minimum of 1 took more than the proportion gave
        shares[shares.index(max(shares))] -= 1
    return [{**s, "steps": n} for s, n in zip(specs, shares, strict=True)]


def under_your_fields(stages: list, given, steps: int | None = None) -> list:
    """A profile's stages under the fields you gave (a --config file, the command line), so that what you give wins
    everywhere: each of STAGE_SETTINGS in `given` is dropped from every stage (the run's value, yours, then holds in
    each), and `steps`, when given, scales the stages' own steps to it (scale_stages).

    >>> under_your_fields([{"name": "a", "max_new_tokens": 320, "learning_rate": 2e-4}], {"max_new_tokens"})
    [{'name': 'a', 'task': 'a', 'learning_rate': 0.0002}]
    """
    specs = [{k: v for k, v in parse_stage(s).items() if k not in given} for s in stages]
    return scale_stages(specs, steps) if steps is not None else specs


def _specs(cfg) -> list[dict]:
    """The stages as given (dicts of parse_stage's keys), each with its steps: stages without steps share what
    `steps` leaves (the remainder goes to the last); no stages: the run's task for `steps`."""
    if not cfg.stages:
        return [{"name": cfg.task, "task": cfg.task, "steps": cfg.steps}]
    names = [s["name"] for s in cfg.stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"stage names must be distinct, got {', '.join(names)}: rename the repeated ones.")
    fixed = sum(s["steps"] for s in cfg.stages if "steps" in s)
    free = [i for i, s in enumerate(cfg.stages) if "steps" not in s]
    rest = cfg.steps - fixed
    if free and rest < len(free):
        raise ConfigError(f"steps {cfg.steps} leaves {rest} for {len(free)} stage(s) without steps: raise steps "
                          "or give each stage its own.")
    return [s if "steps" in s else {**s, "steps": rest // len(free) + (rest % len(free) if i == free[-1] else 0)}
            for i, s in enumerate(cfg.stages)]


def plan(cfg) -> list[Stage]:
    """The stages of a run, each resolved: its own settings where it gives them, the run's elsewhere."""
    limits = eval_limits(cfg)
    return [_resolve(cfg, s, limits) for s in _specs(cfg)]


def _resolve(cfg, spec: dict, limits: dict[str, int]) -> Stage:
    """One stage's every setting: its own, else the run's. Its evaluation limit is its held-out sets' (the largest
    of them where it joins several), else its own max_new_tokens, else the run's eval_max_new_tokens."""
    from ..data.loaders import Task  # the data wing on demand: `cpu-grpo --help` starts without it

    own_eval = spec.get("max_new_tokens") or cfg.eval_max_new_tokens
    return Stage(
        name=spec["name"], task=spec["task"], steps=spec["steps"], promote_at=spec.get("promote_at", 0.0),
        learning_rate=spec.get("learning_rate") or cfg.learning_rate,
        max_new_tokens=spec.get("max_new_tokens") or cfg.max_new_tokens,
        eval_max_new_tokens=max(limits.get(t, own_eval) for t in Task.of(spec["task"]).parts),
        lr_scheduler=spec.get("lr_scheduler") or cfg.lr_scheduler, lr_over_stage=bool(spec.get("lr_scheduler")),
        prioritized_sampling=spec.get("prioritized_sampling", cfg.prioritized_sampling),
        dynamic_sampling_keep=spec.get("dynamic_sampling_keep") or cfg.dynamic_sampling_keep,
        prompts_per_step=spec.get("prompts_per_step") or cfg.prompts_per_step, held_out=spec.get("held_out", True))


def eval_limits(cfg) -> dict[str, int]:
    """Each held-out set's completion limit (each held-out stage's task, or its levels where it joins them; then
    eval_task's entries): the largest max_new_tokens of the stages that set one and train on it, else
    eval_max_new_tokens."""
    from ..data.loaders import Task

    own: dict[str, int] = {}
    for s in (s for s in _specs(cfg) if s.get("held_out", True)):
        own.update({t: max(own.get(t, 0), s.get("max_new_tokens", 0)) for t in Task.of(s["task"]).parts})
    tasks = list(own) + [x.strip() for x in cfg.eval_task.split(",") if x.strip()]
    return {t: own.get(t) or cfg.eval_max_new_tokens for t in dict.fromkeys(tasks)}
