"""A run's parts (Run: its directory, model, sampler, optimizer) and where it is (Progress); built fresh or from a
checkpoint."""

from __future__ import annotations

import errno
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from ..config import TrainConfig
from ..config.stages import Stage
from ..data.environments import Environments
from ..engine.models import bf16_supported, load_model
from ..engine.sampler import Sampler, Sampling, stop_ids
from ..errors import RunDirError, UserError
from ..machine.doctor import bf16_wanted
from ..rundir import cut_jsonl, read_jsonl
from . import checkpoint, ewc
from .distributed import SINGLE, World

RANK_SEED = 7919  # rank r samples with seed + RANK_SEED * r


class TrainingError(UserError):
    """Training cannot go on (non-finite gradients or weights); the message says what to change."""


def run_dir_for(cfg: TrainConfig, profile: str = "default") -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    name = cfg.run_name or f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("runs") / name


def make_optimizer(cfg: TrainConfig, model) -> torch.optim.Optimizer:
    """AdamW over the trainable weights; its learning rate is set before each step (`learning_rate`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel over each parameter (135M parameters: 0.06 s a step here, the default loop ~1 s)
    return torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=True)


def schedule(name: str, frac: float) -> float:
    """The learning rate's factor at `frac` (0 to 1) of a schedule's steps.

    >>> [schedule("linear", f) for f in (0.0, 0.5, 1.0)], schedule("cosine", 0.5)
    ([1.0, 0.5, 0.0], 0.5)
    """
    frac = min(1.0, frac)
    return {"constant": 1.0, "linear": 1 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[name]


def learning_rate(cfg: TrainConfig, stage: Stage, step: int, start: int) -> float:
    """The learning rate of the run's step `step` (0-based) in `stage`, which began at step `start`: the stage's
    rate times a factor, of the stage's own lr_scheduler over its steps where it has one, else of the run's (warmup,
    then lr_scheduler over the run's steps). Set on the optimizer before each step, as nanoGPT does: a resumed run
    needs no scheduler state."""
    if stage.lr_over_stage:
        factor = schedule(stage.lr_scheduler, (step - start) / stage.steps)
    elif step < cfg.warmup_steps:
        factor = (step + 1) / (cfg.warmup_steps + 1)
    else:
        factor = schedule(cfg.lr_scheduler, (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps))
    return stage.learning_rate * factor


def set_learning_rate(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def prepare_model(cfg: TrainConfig, log, bf16: bool):
    # LoRA: the frozen weights need no fp32 master (half the memory, no casts); loaded in bf16 straight away
    low = cfg.use_lora and bf16
    model, tok = load_model(cfg.model, cfg.trust_remote_code, log=log, dtype=torch.bfloat16 if low else None)
    if cfg.use_lora:
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_target_modules if cfg.lora_target_modules == "all-linear" else \
            [m.strip() for m in cfg.lora_target_modules.split(",") if m.strip()]
        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM"),
                               autocast_adapter_dtype=True)  # the adapters themselves stay fp32
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, tok


@dataclass(frozen=True)
class Progress:
    """Where a run is: what changes as it trains and a resume must restore. Saved in every checkpoint; only the loop
    makes a new one (from what a step or a stage's end did)."""

    step: int = 0  # optimizer steps in the whole run
    stage_index: int = 0  # the stage being trained
    stage_step: int = 0  # steps done in that stage
    data_pos: int = 0  # prompts of that stage's training order consumed
    type_counts: dict = field(default_factory=dict)  # that stage's rollouts by problem type: [samples, right]
    validation: float | None = None  # that stage's validation accuracy at its last step (None: no check then)
    stage_ended: bool = False  # that stage's end (evaluation, Fisher, tagged checkpoint) is done at this step
    bad_steps: int = 0  # updates skipped in a row for a non-finite gradient
    all_equal_steps: int = 0  # steps in a row in which every group's rewards were all equal
    micro_cap: int = 0  # after running out of memory: the largest micro-batch for the rest of the run (0: none)

    @classmethod
    def restored(cls, state: dict, run_dir: Path) -> Progress:
        """The progress a checkpoint's trainer state saved; from a checkpoint saved before Progress, its own keys
        (a stage's end from its tag, its validation accuracy from stages.jsonl)."""
        if "progress" in state:
            return cls(**state["progress"])
        ended = bool(state.get("tag"))
        k, step = state.get("stage_index", 0), state["step"]
        records = [x for x in read_jsonl(run_dir / "stages.jsonl") if x["stage_index"] == k and x["end_step"] == step]
        return cls(step, k, state.get("stage_step", step), state["data_pos"], state.get("type_counts", {}),
                   records[-1]["validation_accuracy"] if ended and records else None, ended,
                   all_equal_steps=state.get("all_equal_steps", 0))


@dataclass(frozen=True)
class Run:
    """What the loop works with (its progress travels apart, as a Progress); no global state, so a process can hold
    several (tests) or one per rank. Built once by build_run, never reassigned; only the EWC anchors grow as stages
    end."""

    cfg: TrainConfig
    dir: Path
    model: torch.nn.Module
    tok: PreTrainedTokenizerBase
    sampler: Sampler
    opt: torch.optim.Optimizer
    gen: torch.Generator
    stops: tuple[int, ...]
    autocast: bool
    log: Callable[..., None]
    world: World = SINGLE  # this process's rank among the data-parallel ranks (one process: SINGLE)
    ewc: ewc.EWC = field(default_factory=ewc.EWC)
    commit: str = ""  # the code this process started with (rundir.code_version), for summary.json
    saved: Callable[[Path], None] = field(default=lambda path: None, repr=False)  # told of each checkpoint (rank 0)
    tools: list[Callable] = field(default_factory=list)  # the tools the model may call (data/tools.py)
    environments: Environments | None = None  # the environments it acts in (data/environments.py)

    def sampling(self, max_new_tokens: int, greedy: bool = False) -> Sampling:
        """How rollouts are sampled up to `max_new_tokens` (the config's temperature and top-k/p), or the greedy
        evaluation."""
        c, pad = self.cfg, self.tok.pad_token_id
        if greedy:
            return Sampling(max_new_tokens, self.stops, pad, temperature=0.0)
        return Sampling(max_new_tokens, self.stops, pad, c.temperature, c.top_k, c.top_p, c.min_p,
                        c.repetition_penalty, logprobs=c.rollout_quantization != "none" and
                        c.vllm_importance_sampling_correction)


def open_run_dir(cfg: TrainConfig, profile: str, resume: bool) -> tuple[Path, Path | None, bool]:
    """The run directory, the checkpoint to resume from, and whether the directory is new; refuses to overwrite
    or to resume nothing."""
    if resume and not (cfg.output_dir or cfg.run_name):
        raise RunDirError("--resume needs the run to continue: pass its --output-dir or --run-name.")
    run = run_dir_for(cfg, profile)
    if run.exists() and not run.is_dir():
        raise RunDirError(f"--output-dir {run} is a file, not a directory: choose another --output-dir.")
    ckpt = checkpoint.latest_good(run) if resume else None
    found = [c.name for c in checkpoint.candidates(run / "checkpoints")] if resume and ckpt is None else []
    if found:  # never silently from step 0 over checkpoints that are there
        raise RunDirError(f"--resume: none of the checkpoints under {run}/checkpoints ({', '.join(found)}) can be "
                          "resumed from (see the warnings above): repair one or restore it from a backup, or start "
                          "a new run with another --output-dir.")
    if resume and ckpt is None and not (run / "train_config.yaml").exists():
        raise RunDirError(f"--resume: {run} holds no run to continue: start a new run without --resume.")
    if not resume and (run / "metrics.jsonl").exists():
        raise RunDirError(f"{run} already holds a run: pass --resume to continue it, or choose another --output-dir "
                         "or --run-name (nothing was overwritten).")
    created = not run.exists()
    run.mkdir(parents=True, exist_ok=True)
    return run, ckpt, created


def build_run(cfg: TrainConfig, run_dir: Path, ckpt: Path | None, log, world: World = SINGLE, commit: str = "",
              saved: Callable[[Path], None] | None = None) -> tuple[Run, torch.nn.Module | None, Progress]:
    """Model, sampler, optimizer and generator; restored from `ckpt` when resuming. Returns (run, reference,
    progress). Called under the run's lock: half-written checkpoint directories and log records past `ckpt` are
    removed. Every rank builds its own; each samples with its own generator (rank 0's seed is the run's seed)."""
    if world.main:
        checkpoint.remove_partial(run_dir)
    autocast = world.broadcast(bf16_wanted(cfg.bf16))  # rank 0's probe decides for all
    if cfg.bf16 == "auto" and bf16_supported() and not autocast:
        log("bf16 matmuls run slower than fp32 ones on this CPU: rollouts and training in fp32 (bf16: auto; "
            "--bf16 true forces bf16)")
    model, tok = prepare_model(cfg, log, autocast)
    ref = Sampler(model, dtype=torch.float32, copy=True).net if cfg.beta > 0 else None  # frozen base, before any resume
    if ckpt is not None:
        model = checkpoint.load_weights(model, ckpt)
    else:
        world.same_params(model)
    opt = make_optimizer(cfg, model)
    sampler = Sampler(model, dtype=torch.bfloat16 if autocast else torch.float32,
                      copy=cfg.use_lora and cfg.lora_rollout == "merged", int8=cfg.rollout_quantization == "int8")
    gen = torch.Generator().manual_seed(cfg.seed + RANK_SEED * world.rank)
    anchors = ckpt is not None and (ckpt / ewc.EWC_FILE).exists()
    run = Run(cfg, run_dir, model, tok, sampler, opt, gen, stop_ids(tok, model), autocast, log, world, commit=commit,
              tools=offered_tools(cfg.tools, cfg.model, tok),
              environments=offered_environments(cfg.environment, cfg.model, tok, cfg.rewards),
              ewc=ewc.EWC.load(ckpt / ewc.EWC_FILE) if anchors else ewc.EWC(), **({"saved": saved} if saved else {}))
    progress = Progress()
    if ckpt is not None:
        state = checkpoint.load_state(ckpt)
        opt.load_state_dict(state["optimizer"])  # a checkpoint's "scheduler" (before 2026-12-04) is not needed
        _restore_rng(run, state)
        progress = Progress.restored(state, run_dir)
        log(f"resumed from {ckpt} at step {progress.step} (stage {progress.stage_index + 1}, step "
            f"{progress.stage_step} in it)")
    # records of steps after the checkpoint (all of them before a first one) are logged again as the steps rerun;
    # a run stopped before its first checkpoint starts again in place, its base evaluation kept
    dropped = sum(cut_jsonl(run_dir / name, progress.step) for name in ("metrics.jsonl", "groups.jsonl")) \
        if world.main else 0
    if dropped:
        log(f"{dropped} log records of steps after {ckpt or 'the start'} dropped: those steps run again")
    return run, ref, progress


def offered_tools(specs: list[str], model: str, tok) -> list[Callable]:
    """The tools `specs` name, once the model's chat template is seen to show them to the model (a template that
    ignores `tools=` would train a model on calls it was never told it could make)."""
    if not specs:
        return []
    from ..data.tools import load_tools

    tools = load_tools(specs)
    shown_by_template(tools, model, tok)
    return tools


def offered_environments(specs: list[str], model: str, tok, rewards: list[str]) -> Environments | None:
    """The environments `specs` name, each made once and checked (a reset; tools the template shows; a reward when
    `rewards` has no other)."""
    if not specs:
        return None
    from ..data.environments import EnvError, load_environments, methods

    envs = load_environments(specs)
    probes = [pool[0] for pool in envs.pools.values()]
    shown_by_template([m for env in probes for m in methods(env)], model, tok)
    if rewards == ["environment"] and not any(hasattr(env, "get_reward") for env in probes):
        raise EnvError(f"no reward: the environment ({', '.join(specs)}) has no get_reward method and no --rewards "
                       "were given; give it a get_reward(self) -> float, or name reward functions")
    return envs


def shown_by_template(tools: list[Callable], model: str, tok) -> None:
    """Refuses a chat template that would not show these tools to the model."""
    if not tools:
        return
    from ..data.tools import ToolError, schemas

    turn = [{"role": "user", "content": "?"}]
    shown = tok.apply_chat_template(turn, tools=schemas(tools), tokenize=False, add_generation_prompt=True)
    if shown == tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True):
        raise ToolError(f"the chat template of {model} does not show tools to the model: use a model whose "
                        "template takes tools (Qwen2.5, Qwen3, Llama 3.x, SmolLM3)")


def _restore_rng(run: Run, state: dict) -> None:
    """This rank's sampling state; with another number of ranks than the run saved, fresh streams (and a note)."""
    saved = state.get("rng_ranks") or [state["rng"]]
    if len(saved) == run.world.size:
        checkpoint.restore_rng(saved[run.world.rank], run.gen)
        return
    if run.world.main:
        checkpoint.restore_rng(saved[0], run.gen)
    run.log(f"note: the run was saved with {len(saved)} rank(s) and resumes with {run.world.size}: it continues "
            "from the same weights and data position, but its samples differ from those of an uninterrupted run")


def save_checkpoint(r: Run, p: Progress, tag: str = "") -> None:
    """A complete checkpoint of the run at `p`; never one with non-finite weights (the older ones stay the last good).
    Every rank calls it (their sampling states are gathered); rank 0 writes."""
    bad = [n for n, p in r.model.named_parameters() if p.requires_grad and not torch.isfinite(p).all()]
    if bad:
        raise TrainingError(f"{len(bad)} weight tensors are not finite (first: {bad[0]}) at step {p.step}: "
                            "nothing was saved; lower --learning-rate and resume from the last checkpoint")
    rngs = r.world.gather(checkpoint.rng_state(r.gen))
    if not r.world.main:
        return
    state = {"optimizer": r.opt.state_dict(), "rng": rngs[0], "rng_ranks": rngs, "progress": asdict(p)}
    extra = (lambda d: r.ewc.save(d / ewc.EWC_FILE)) if r.ewc.fisher else None
    try:
        path = checkpoint.save(r.dir, p.step, r.model, r.tok, r.cfg, state, keep=r.cfg.keep_checkpoints, tag=tag,
                               extra=extra)
    except Exception as e:  # OSError; torch.save's RuntimeError; safetensors' SafetensorError
        if not disk_full(e):
            raise
        free = shutil.disk_usage(r.dir).free / 2**20
        last = checkpoint.latest(r.dir)
        raise TrainingError(f"the disk holding {r.dir} is full ({free:.0f} MB free) while saving the checkpoint of "
                            f"step {p.step}: free some space and continue with --resume (from "
                            f"{last.name if last else 'the start'})") from None
    r.saved(path)


def disk_full(e: BaseException) -> bool:
    """ENOSPC, as Python raises it or as torch.save reports it from its C++ writer."""
    return getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e) or \
        "inline_container" in str(e)
