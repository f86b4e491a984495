"""Training configuration: one dataclass with help text; profiles (profiles.py); YAML files; CLI overrides.

Precedence, lowest first: field defaults < profile < --config YAML file < --key value on the command line. A field
you give (file or command line) wins everywhere: in every stage of a profile's curriculum too (`steps` scales their
own steps; a stage's own max_new_tokens, prompts_per_step, ... gives way to yours), while stages you write yourself
keep their own values.
This module must not import torch: `cpu-grpo --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import ConfigError
from ..profiles import PROFILES
from .files import coerce, load_file
from .stages import SCHEDULES, STAGE_SETTINGS, parse_stage, plan, under_your_fields
from .trl import BATCH, RENAMED, from_trl

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # TRL's


def _sampler_checks(c) -> list[tuple[bool, str]]:
    return [(c.lora_rollout in ("unmerged", "merged"), "lora_rollout must be unmerged or merged"),
            (c.rollout_quantization in ("none", "int8"), "rollout_quantization must be none or int8"),
            (c.rollout_quantization == "none" or not (c.tools or c.environment),
             "rollout_quantization int8 does not take tools or environments yet: leave it none for them"),
            (c.vllm_importance_sampling_mode in IS_MODES,
             f"vllm_importance_sampling_mode must be one of {', '.join(IS_MODES)}")]


def _f(default, help: str, **kw):
    if isinstance(default, list):
        return field(default_factory=lambda d=default: list(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    # -- model
    model: str = _f("smollm2-135m", "alias (smollm2-135m, qwen2.5-coder-0.5b: both offline; qwen2.5-0.5b), local HF "
                                    "directory, .gguf file or hub id")
    trust_remote_code: bool = _f(False, "allow a hub model to run its own Python code (off unless you trust it)")
    # -- data
    task: str = _f("basic", "training data: basic | intermediate | advanced | mix | gsm8k | countdown | code | "
                            "rg:NAME[:key=value,...] (a reasoning-gym task) | levels or rg: tasks joined by + "
                            "(basic+intermediate, advanced+gsm8k) | a file (.jsonl, .json, .csv, .parquet) "
                            "or a save_to_disk directory | hf:NAME[:config][:split]")
    eval_task: str = _f("", "extra held-out sets, comma-separated (same forms as task); the test split of every "
                           "stage's task is always evaluated")
    eval_size: int = _f(250, "held-out problems per evaluated set, before training and after each stage (0: none)")
    eval_every_stage: bool = _f(True, "evaluate every held-out set after each stage (the forgetting matrix); off: "
                                      "before training and after the last stage only")
    train_size: int = _f(20000, "problems drawn from the generator for training (files: their first N training "
                                "lines; a fifth of a file of your own is held out, by a hash of each question)")
    skip_bad_lines: bool = _f(False, "skip malformed JSONL lines (with a count) instead of stopping")
    instruction: str = _f(
        "Solve the problem step by step. Write the final answer on its own last line as '#### <number>'.",
        "text appended to every math question in the user message (not to prompts of your own)")
    system_prompt: str = _f("", "a system turn before every prompt (a chat prompt of your own that has one keeps it)")
    prompt_column: str = _f("prompt", "the column of a data file holding the prompt: text, or chat messages (TRL's "
                                      "conversational format); rows without it are read as GSM8K (question, answer)")
    column_map: str = _f("", "columns renamed before anything reads them, 'yours:ours,...' (e.g. 'problem:prompt,"
                             "solution:answer'); every other column reaches the reward functions by its own name")
    correct_reward: str = _f("", "the reward (one of rewards, 0/1) that decides 'correct' in evaluations; '': math "
                                 "problems by their answer, rows of your own by the first reward")
    # -- curriculum
    stages: list[str] = _f([], "curriculum stages in order: basic,intermediate,advanced or name:steps; in YAML also "
                               "mappings with name, task, steps, promote_at and the stage's own learning_rate, "
                               "lr_scheduler, max_new_tokens, prioritized_sampling, dynamic_sampling_keep, "
                               "prompts_per_step, and held_out (false: its task adds no held-out set); a field you "
                               "give (file or command line) replaces a profile's stages' own value of it. Empty: one "
                               "stage on task")
    promote_every: int = _f(5, "steps between promotion checks of stages that have promote_at")
    promote_size: int = _f(50, "validation problems per promotion check (disjoint from the held-out set)")
    prioritized_sampling: bool = _f(False, "draw a stage's problem types in proportion to max(1 - p, 0.2), p: how "
                                           "often its rollouts got the type right so far (Kimi k1.5); off: the "
                                           "stage's shuffled order. Problems from files are one type")
    ewc_lambda: float = _f(0.0, "EWC weight on earlier stages (Fisher normalised to mean 1 per stage; 0: off)")
    ewc_decoupled: bool = _f(False, "EWC as a pull of the weights towards the earlier stages' after each optimizer "
                                    "step, theta -= min(1, lr*lambda*F)*(theta - anchor), like AdamW's weight decay; "
                                    "off: the penalty's gradient joins the policy gradient, where clipping and "
                                    "Adam's scaling cancel its strength (docs/curriculum.md)")
    fisher_samples: int = _f(32, "sampled completions used to estimate the Fisher diagonal at the end of a stage")
    # -- rollouts
    steps: int = _f(30, "optimizer steps (with stages: the budget split equally among stages without steps)")
    prompts_per_step: int = _f(8, "prompts per step (B)")
    num_generations: int = _f(8, "completions sampled per prompt (G), the group of GRPO")
    max_new_tokens: int = _f(96, "completion length limit during training")
    eval_max_new_tokens: int = _f(256, "completion length limit during evaluation (greedy)")
    temperature: float = _f(0.7, "sampling temperature for rollouts (log-probs use the same temperature)")
    top_k: int = _f(0, "top-k sampling for rollouts (0: off)")
    top_p: float = _f(1.0, "nucleus sampling for rollouts (1.0: off)")
    min_p: float = _f(0.0, "min-p sampling for rollouts: only words at least min_p times as likely as the likeliest "
                           "(Nguyen et al. 2024; 0: off)")
    repetition_penalty: float = _f(1.0, "rollouts: the logits of words already in the prompt or the completion are "
                                        "divided by it where positive, multiplied where negative (CTRL, as "
                                        "transformers and vLLM apply it; 1.0: off). The update's log-probs are the "
                                        "model's own, as in TRL")
    # -- rewards
    rewards: list[str] = _f(["correctness", "correct_format"],
                            "reward functions: builtin names, module:function, file.py:function or a reward "
                            "model's directory; not given, a task that brings its verifier (countdown, code, rg:) "
                            "is rewarded and judged by it alone")
    reward_weights: list[float] = _f([1.0, 0.2], "one weight per reward function")
    multi_objective_aggregation: str = _f("sum_then_normalize", "several rewards: sum_then_normalize (their "
                                          "weighted sum, then the group's advantage) | normalize_then_sum (GDPO, "
                                          "Liu et al. 2026: each reward normalised within its group, the weighted "
                                          "sum normalised over the batch; scale_rewards does not apply)")
    reward_timeout: float = _f(120.0, "seconds each reward function may take on one batch of completions: past it, "
                                      "the batch scores 0 with a warning, and 3 batches in a row stop the run (0: no "
                                      "limit)")
    allow_unisolated_code: bool = _f(False, "where no sandbox works (bubblewrap missing, no user namespaces), run a "
                                            "code reward's model-written code with process limits only (off: such "
                                            "a run is refused; on only where you would give the model a shell)")
    score_truncated: bool = _f(False, "score completions cut at max_new_tokens like the others (off: they earn no "
                                      "credit, penalties still count, since an answer that never ends is no answer)")
    # -- tools (TRL's): the model may call them; the conversation, its results included, stays within max_new_tokens
    tools: list[str] = _f([], "tools the model may call, typed Python functions with a docstring: builtin names "
                              "(calculator) or file.py:f,g or module:f; trained and evaluated with them, their "
                              "results masked out of the loss (docs/tasks.md)")
    environment: list[str] = _f([], "environments the model acts in (TRL's environment_factory): file.py:Class or "
                                    "module:Class, one instance a rollout, reset with its row, its public methods "
                                    "the tools, its get_reward() the reward `environment`; several as "
                                    "name=file.py:Class, picked by the rows' environment column (docs/tasks.md)")
    max_tool_calling_iterations: int = _f(5, "with tools: rounds of tool calls a conversation may make before its "
                                             "last turn")
    # -- GRPO
    loss_type: str = _f("dapo", "aggregation: grpo (per-sequence mean), dapo (token mean), dr_grpo (constant)")
    scale_rewards: str = _f("group", "advantage scale: group std, batch std, or none (Dr. GRPO)")
    beta: float = _f(0.0, "KL weight to the frozen reference (0: no reference model is kept)")
    epsilon: float = _f(0.2, "lower clip of the ratio: 1 - epsilon")
    epsilon_high: float = _f(0.2, "upper clip of the ratio: 1 + epsilon_high (DAPO uses 0.28)")
    num_iterations: int = _f(1, "updates per rollout batch; > 1 stores old log-probs")
    importance_sampling_level: str = _f("token", "the ratio that is clipped: token (PPO, GRPO) | sequence (GSPO, "
                                                 "Zheng et al. 2025: the geometric mean of a completion's token "
                                                 "ratios, one for the whole completion; use with loss_type grpo)")
    vllm_importance_sampling_correction: bool = _f(True, "(TRL's name) where rollouts come from other weights than "
                                                         "the trainer's (rollout_quantization int8), weigh each "
                                                         "token's loss by the trainer's over the sampler's probability")
    vllm_importance_sampling_mode: str = _f("sequence_mask", "token_truncate | token_mask | sequence_truncate | "
                                                             "sequence_mask (TRL's): the ratio per token or per "
                                                             "completion, clipped to [clip_min, clip_max] or 0 outside")
    vllm_importance_sampling_clip_min: float = _f(0.0, "the ratio's lower bound (0: none, TRL's None)")
    vllm_importance_sampling_clip_max: float = _f(3.0, "the ratio's upper bound (0: none, TRL's None)")
    mask_truncated_completions: bool = _f(False, "leave completions cut at max_new_tokens out of the loss (DAPO; "
                                                 "their rewards still count in their group's advantages)")
    top_entropy_quantile: float = _f(1.0, "train only on the tokens whose entropy is in this top fraction of a "
                                          "micro-batch's (Wang et al. 2025, 'Beyond the 80/20 rule': 0.2; 1.0: all "
                                          "tokens)")
    dynamic_sampling: int = _f(0, "DAPO's dynamic sampling: up to this many rollout batches a step, until "
                                  "prompts_per_step groups whose first reward (correctness) differs within the group "
                                  "are found; only those are trained (0: off, every group of one batch)")
    dynamic_sampling_keep: str = _f("first", "which varying groups dynamic sampling trains when it finds more than "
                                             "prompts_per_step: first (DAPO) | hardest (fewest right answers)")
    dynamic_sampling_refill: str = _f("batch", "what dynamic sampling draws after the first batch: batch (DAPO: "
                                               "prompts_per_step prompts again) | missing (as many prompts as groups "
                                               "are still missing: fewer rollouts thrown away)")
    train_samples: int = _f(0, "of each trained group's num_generations samples, train on this many with the widest "
                               "spread of rewards (PODS max-variance down-sampling, Xu et al. 2025; the advantages "
                               "are computed over them; 0: all)")
    # -- optimisation
    learning_rate: float = _f(2e-5, "AdamW learning rate")
    lr_scheduler: str = _f("constant", "constant | linear | cosine (after warmup)")
    warmup_steps: int = _f(0, "linear warmup steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    max_grad_norm: float = _f(1.0, "gradient clipping by global norm (0: off)")
    micro_batch_size: int = _f(
        0, "sequences per forward/backward: whole groups when >= num_generations, else parts of a group "
        "(0: from a 2.5 GB budget for activations)")
    bf16: str = _f("true", "bf16 rollouts and bf16 autocast in training: true (wherever the CPU has bf16 kernels) | "
                           "auto (only where they are not clearly slower than its fp32 ones, probed at the start: "
                           "faster there, but see results/demo-dtype) | false (fp32)", const="true")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward: less memory, slower")
    use_lora: bool = _f(False, "train LoRA adapters (peft) instead of all weights")
    lora_r: int = _f(16, "LoRA rank")
    lora_alpha: int = _f(32, "LoRA alpha")
    lora_dropout: float = _f(0.0, "dropout on the LoRA adapters' input while training (peft's lora_dropout)")
    lora_target_modules: str = _f("all-linear", "the layers that get adapters: all-linear (every linear layer but "
                                                "the output head), or module names separated by commas (q_proj,v_proj)")
    lora_rollout: str = _f("unmerged", "how a LoRA run samples: unmerged (the adapters applied beside the frozen bf16 "
                                       "base: no copy) | merged (from a bf16 copy with the adapters merged after "
                                       "each update: faster rollouts, a copy of the adapted weights more memory)")
    rollout_quantization: str = _f("none", "none | int8: the layers' matmuls of rollouts in int8 (weights per "
                                           "channel, each token's own scale; oneDNN's u8 x s8 kernel, VNNI), the "
                                           "output layer and the update as before (issue 70: being measured)")
    # -- run
    seed: int = _f(0, "seed for data order, sampling and initialisation")
    output_dir: str = _f("", "where the run goes (default: runs/<run_name>)")
    run_name: str = _f("", "name of the run (default: the profile and a timestamp)")
    save_every: int = _f(20, "save a checkpoint every N steps (and always at the end)")
    keep_checkpoints: int = _f(2, "complete checkpoints kept (oldest removed first; the newest one whose weights "
                                  "sampled a step that taught something is kept too)")
    on_collapse: str = _f("warn", "when every group's rewards have been all equal for 5 steps in a row (nothing is "
                                  "learned): warn, or stop the run")
    threads: int = _f(0, "torch threads (0: one per physical core that other work leaves free, measured at start)")
    allocator: str = _f("auto", "memory allocator of `cpu-grpo train`: auto (jemalloc where the system has it: half "
                                "the memory of glibc's at the same speed; glibc otherwise), jemalloc, or glibc")
    ddp_timeout: int = _f(1800, "seconds a rank waits for the others (torchrun runs) before the run stops with a "
                                "message naming the rank that failed")
    report_to: list[str] = _f([], "experiment trackers besides metrics.jsonl: tensorboard, trackio, wandb (offline "
                                  "unless WANDB_MODE says otherwise); extra: pip install 'cpu-grpo[track]'")
    log_completions_every: int = _f(10, "steps between tables of sampled completions sent to report_to trackers "
                                        "(0: never)")

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        unknown_trackers = sorted(set(self.report_to) - {"tensorboard", "trackio", "wandb"})
        checks = [
            (self.steps >= 0 and self.prompts_per_step >= 1, "steps must be >= 0 and prompts_per_step >= 1"),
            (self.num_generations >= 2, "num_generations must be >= 2: GRPO compares samples within a group"),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.temperature > 0, "temperature must be > 0: rollouts are sampled, and their log-probs are divided "
                                   "by it (greedy decoding is for evaluation only)"),
            (self.top_k >= 0, "top_k must be >= 0 (0: off)"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p < 1 and self.repetition_penalty > 0, "min_p must be in [0, 1) and repetition_penalty > 0"),
            (self.importance_sampling_level in ("token", "sequence"), "importance_sampling_level: token or sequence"),
            (0 < self.top_entropy_quantile <= 1, "top_entropy_quantile must be in (0, 1] (1.0: every token)"),
            (self.multi_objective_aggregation in ("sum_then_normalize", "normalize_then_sum"),
             "multi_objective_aggregation must be sum_then_normalize or normalize_then_sum (GDPO)"),
            (len(self.rewards) >= 1, "give at least one reward function"),
            (len(self.rewards) == len(self.reward_weights),
             f"rewards has {len(self.rewards)} entries but reward_weights has {len(self.reward_weights)}: "
             "give one weight per reward function"),
            (min(self.reward_timeout, self.max_tool_calling_iterations) >= 0,
             "reward_timeout and max_tool_calling_iterations must be >= 0"),
            (self.loss_type in ("grpo", "dapo", "dr_grpo"), "loss_type must be grpo, dapo or dr_grpo"),
            (self.scale_rewards in ("group", "batch", "none"), "scale_rewards must be group, batch or none"),
            (self.beta >= 0, "beta must be >= 0"),
            (0 <= self.epsilon < 1 and self.epsilon_high >= 0, "epsilon must be in [0, 1), epsilon_high >= 0"),
            (self.num_iterations >= 1, "num_iterations must be >= 1"),
            (self.dynamic_sampling >= 0, "dynamic_sampling must be >= 0 (rollout batches a step at most; 0: off)"),
            (self.dynamic_sampling_keep in ("first", "hardest"), "dynamic_sampling_keep must be first or hardest"),
            (self.dynamic_sampling_refill in ("batch", "missing"), "dynamic_sampling_refill must be batch or missing"),
            (self.train_samples == 0 or 2 <= self.train_samples <= self.num_generations,
             f"train_samples must be 0 (all) or between 2 and num_generations ({self.num_generations})"),
            (self.learning_rate > 0, "learning_rate must be > 0"),
            (self.weight_decay >= 0, "weight_decay must be >= 0"),
            (self.max_grad_norm >= 0, "max_grad_norm must be >= 0 (0: no clipping)"),
            (0 <= self.threads <= 1024, "threads must be between 0 (one per physical core) and 1024"),
            (len(self.run_name) <= 200 and "/" not in self.run_name and self.run_name not in (".", ".."),
             "run_name must be a plain directory name of at most 200 characters (no '/')"),
            (self.allocator in ("auto", "jemalloc", "glibc"), "allocator must be auto, jemalloc or glibc"),
            (self.ddp_timeout >= 1, "ddp_timeout must be >= 1 second"),
            (self.lr_scheduler in SCHEDULES, "lr_scheduler must be constant, linear or cosine"),
            (self.micro_batch_size >= 0, "micro_batch_size must be >= 0 (0: automatic)"),
            *_sampler_checks(self),
            (0 <= self.lora_dropout < 1 and self.lora_target_modules.strip(", "),
             "lora_dropout must be in [0, 1) and lora_target_modules name at least one module (or all-linear)"),
            (self.eval_size >= 0 and self.train_size >= 1, "eval_size must be >= 0 and train_size >= 1"),
            (self.save_every >= 0 and self.keep_checkpoints >= 1, "save_every >= 0 and keep_checkpoints >= 1"),
            (self.on_collapse in ("warn", "stop"), "on_collapse must be warn or stop"),
            (self.ewc_lambda >= 0 and self.fisher_samples >= 1, "ewc_lambda must be >= 0 and fisher_samples >= 1"),
            (self.promote_every >= 1 and self.promote_size >= 1, "promote_every and promote_size must be >= 1"),
            (not unknown_trackers, f"report_to takes tensorboard, trackio, wandb, not {', '.join(unknown_trackers)}"),
            (self.log_completions_every >= 0, "log_completions_every must be >= 0 (0: never)"),
            (not self.correct_reward or self.correct_reward in self.rewards,
             f"correct_reward {self.correct_reward!r} is not one of rewards ({', '.join(self.rewards)}): name one"),
            (all(":" in pair for pair in self.column_map.split(",") if pair.strip()),
             "column_map takes 'yours:ours' pairs separated by commas, e.g. 'problem:prompt,solution:answer'"),
        ]
        if failed := next((message for ok, message in checks if not ok), None):
            raise ConfigError(failed)
        self.stages = [parse_stage(s) for s in self.stages]
        plan(self)  # raises on an impossible plan

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in plan(self))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in fields(TrainConfig)}


def build(profile: str | None = None, file: str | None = None, overrides: dict | None = None) -> TrainConfig:
    """Apply profile, file and overrides, check every key, and return a validated config."""
    if profile and profile not in PROFILES:
        raise ConfigError(f"unknown profile '{profile}': use one of {', '.join(PROFILES)}.")
    values: dict = dict(PROFILES.get(profile, {}) if profile else {})
    mine = _ours({**(load_file(file) if file else {}), **(overrides or {})}, values)
    if "task" in mine and "stages" not in mine:  # a task of your own replaces the profile's curriculum
        values.pop("stages", None)
    values.update(mine)
    if "rewards" not in mine and isinstance(values.get("task"), str) and not values.get("stages"):
        from ..data.loaders import Task

        if verifier := Task.of(values["task"]).verifier:  # a task that brings its verifier: its reward and judge
            values.update(rewards=[verifier], reward_weights=[1.0])
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}{nearest(unknown[0], _FIELDS)}: see "
                          "`cpu-grpo train --help` for the fields.")
    coerced = {k: coerce(_FIELDS[k], v) for k, v in values.items()}
    if coerced.get("environment"):  # TRL: the environments' get_reward is a reward, weight 1, beside any given
        given = coerced["rewards"] if "rewards" in mine else []
        if "environment" not in given:
            weights = coerced["reward_weights"] if "reward_weights" in mine else [1.0] * len(given)
            coerced.update(rewards=[*given, "environment"], reward_weights=[*weights, 1.0])
    if "stages" not in mine and coerced.get("stages"):  # the profile's stages: the fields you gave win in each
        coerced["stages"] = under_your_fields(coerced["stages"], set(mine) & set(STAGE_SETTINGS),
                                              coerced["steps"] if "steps" in mine else None)
    return TrainConfig(**coerced)


def nearest(name: str, names) -> str:
    """' (did you mean X?)' for the known name nearest to a misspelt one, else ''."""
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _ours(mine: dict, profile: dict) -> dict:
    """The fields you gave, TRL's names among them (config/trl.py) read as this tool's."""
    if not any(k in RENAMED or k in BATCH for k in mine):
        return mine
    read = {k: coerce(_FIELDS[RENAMED[k]], v) if k in RENAMED and v is not None and not isinstance(v, int | float)
            else _number(k, v) if k in BATCH and v is not None else v for k, v in mine.items()}
    generations = coerce(_FIELDS["num_generations"], mine.get("num_generations", profile.get(
        "num_generations", _FIELDS["num_generations"].default)))
    return from_trl(read, generations, int(os.environ.get("WORLD_SIZE", "1")))


def _number(key: str, value) -> int:
    try:
        if isinstance(value, bool) or float(value) != int(float(value)):
            raise ValueError
        return int(float(value))
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: cannot read {value!r} as int.") from None


def resolve(profile: str | None, file: str | None, overrides: dict, resume: bool = False) -> tuple[TrainConfig, str]:
    """The config a run gets (`cpu-grpo train`'s, and the web page's check of it): profile < file < overrides; with
    `resume`, the run's saved config < file < overrides, and a line that says which and what changed."""
    run = overrides.get("output_dir") or overrides.get("run_name") and Path("runs") / overrides["run_name"]
    saved = Path(run) / "train_config.yaml" if resume and run else None  # the run's own, when it has one
    if saved is None or not saved.is_file():
        return build(profile, file, overrides), ""
    old = load_file(saved)
    mine = _ours({**(load_file(file) if file else {}), **overrides}, old)
    for key in ("model", "use_lora"):  # the checkpoint's weights fit only the model they were trained on
        if key in mine and build(None, None, {key: mine[key]}).to_dict()[key] != old.get(key):
            raise ConfigError(f"the run in {saved.parent} trained with {key} {old.get(key)!r}: resume it "
                              f"without --{key.replace('_', '-')}, or start a new run for {mine[key]!r}")
    cfg = build(None, None, {**old, **mine})
    changed = [f"{k}: {old.get(k)!r} -> {getattr(cfg, k)!r}" for k in mine if old.get(k) != getattr(cfg, k)]
    return cfg, f"resuming with the run's config {saved}" + (f"; changed here: {', '.join(changed)}" if changed else "")


def save(cfg: TrainConfig, path: str | Path) -> None:
    """Write the config as YAML, atomically (a full disk leaves the old file, never an empty one)."""
    import yaml

    tmp = Path(f"{path}.tmp")
    tmp.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    os.replace(tmp, path)


def reference() -> str:
    """docs/config.md: every field with its default and help, and the profiles (`make docs` writes it)."""
    intro = ("Generated from `src/cpu_grpo/config/__init__.py` by `make docs`: do not edit. Every field is a YAML key "
             "and a `--flag` (underscores as dashes); precedence: defaults < `--profile` < `--config` file < "
             "`--field value`.")
    rows = ["# Config reference", "", intro, ""]
    for f in fields(TrainConfig):
        default = f.default_factory() if callable(f.default_factory) else f.default
        rows.append(f"- `{f.name}` (default `{json.dumps(default)}`): {f.metadata['help']}")
    rows += ["", "## Profiles", ""]
    rows += [f"- `{name}`: {', '.join(f'`{k}: {json.dumps(v)}`' for k, v in p.items()) or '(the defaults)'}"
             for name, p in PROFILES.items()]
    return "\n".join(rows) + "\n"


def describe(cfg: TrainConfig) -> str:
    """The resolved config, one `key: value` per line, for the start of a run."""
    return "\n".join(f"  {k}: {v}" for k, v in cfg.to_dict().items())
