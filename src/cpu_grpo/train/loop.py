"""A training run: the GRPO step (step.py) repeated through the curriculum's stages, with the evaluations before
and after, checkpoints, resume, stop requests and the report.

A run is a list of curriculum stages (one by default). After each stage every held-out set is evaluated (a row
of the forgetting matrix; `eval_every_stage: false` keeps the last only), the Fisher diagonal is estimated, and
later stages add the EWC penalty's gradient to the policy gradient (stages.py around the loop, curriculum.py for
the math). Under torchrun every rank runs this; rank 0 alone writes the run directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shutil
import signal
import time
from pathlib import Path

import torch

from .. import rundir
from ..config import TrainConfig, describe, save
from ..config.stages import plan
from ..data import rewards
from ..data.loaders import Task
from ..engine.threads import set_threads
from ..eval import report
from ..machine import allocator, planner
from ..rundir import RunLock, read_json, stage_eval_path, write_status
from . import checkpoint, curriculum, distributed
from .runstate import Progress, Run, TrainingError, build_run, disk_full, open_run_dir, save_checkpoint
from .stage_run import (
    StageRun,
    check_base_records,
    enter_stage,
    evaluate_all,
    finish_stage,
    fitting,
    promoted,
    validation_accuracy,
)
from .step import StopFlag, grpo_step, log_groups, stop_agreed
from .trackers import Hooks, Tracker, summary_metrics

__all__ = ["train", "StopFlag"]


def train(cfg: TrainConfig, profile: str = "default", resume: bool = False, log=print, stop: StopFlag | None = None,
          hooks: Hooks | None = None) -> Path:
    """Train with GRPO through the stages; evaluate before and after each; write the report. Returns the run dir.
    Under torchrun every rank calls this; rank 0 alone writes the run directory and logs. `stop` set (by a signal
    or by a caller) ends the run after the step at hand, as Ctrl-C does; `hooks` hears of each step, checkpoint
    and the end (the Python API's callbacks)."""
    t_start = time.time()
    world = distributed.init(cfg.ddp_timeout)
    run_dir, created = None, False
    try:
        distributed.same_config(world, cfg.to_dict())
        fewest = min(s.prompts_per_step for s in plan(cfg))
        if fewest < world.size:
            raise TrainingError(f"prompts_per_step {fewest} is less than the {world.size} ranks: each "
                                "rank samples whole groups, so give at least one prompt per rank")
        run_dir, ckpt, created = world.broadcast(open_run_dir(cfg, profile, resume) if world.main else None)
        with RunLock(run_dir) if world.main else contextlib.nullcontext():
            if world.main:
                write_status(run_dir, state="starting", message="")  # a resumed run forgets an earlier failure
            run_dir = _train(cfg, world, run_dir, ckpt, t_start, log if world.main else _quiet, profile,
                             stop or StopFlag(log=log), hooks if world.main else None)
        world.broadcast(None)  # every rank waits for rank 0's report, then all leave the group together
        return run_dir
    except BaseException as e:
        lost = isinstance(e, distributed.CollectiveFailed)  # another rank is gone: say which
        if lost:  # torchrun sends SIGTERM to the ranks left: finish this sentence first (it takes ~2 s)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        failure = distributed.RankError(distributed.lost_rank_message(world, e)) if lost else _plainly(e, run_dir)
        if not lost:
            distributed.record_failure(world, failure)  # for the other ranks' message
        theirs = isinstance(e, rundir.RunLocked)  # another process's run: its status and files are not ours
        if world.main and created and not theirs and _only_its_own_files(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # a start that failed leaves no run behind
        elif world.main and run_dir is not None and not theirs:
            try:
                write_status(run_dir, state="failed", message=f"{type(failure).__name__}: {failure}"[:300])
            except OSError:  # a full disk: the error itself matters more than the status file
                pass
        if failure is not e:
            raise failure from None
        raise


def _only_its_own_files(run_dir: Path) -> bool:
    """Whether the run directory holds nothing but what a start writes (no evaluation, step, log or tracker)."""
    return {p.name for p in run_dir.iterdir()} <= {"train_config.yaml", "status.json", "run.lock"}


def _plainly(e: BaseException, run_dir: Path | None) -> BaseException:
    """A full disk, or a directory the run may not write (read-only, no permission), wherever the run writes (lock,
    logs, evaluations, report; checkpoints say it themselves) as one sentence that says how to go on; any other
    error as it is."""
    unwritable = getattr(e, "errno", None) in checkpoint.NOT_WRITABLE
    if run_dir is None or isinstance(e, TrainingError) or not (disk_full(e) or unwritable):
        return e
    what = Path(e.filename).name if getattr(e, "filename", None) else "the run's files"
    last = checkpoint.latest(run_dir) if run_dir.is_dir() else None
    then = f"continue with --resume (from {last.name})" if last else \
        "continue with --resume" if (run_dir / "train_config.yaml").exists() else "run the same command again"
    if unwritable:
        return TrainingError(f"{Path(e.filename).parent if getattr(e, 'filename', None) else run_dir} cannot be "
                             f"written ({e.strerror}) while writing {what}: make it writable and {then}")
    free = shutil.disk_usage(run_dir).free / 2**20
    return TrainingError(f"the disk holding {run_dir} is full ({free:.0f} MB free) while writing {what}: free "
                         f"some space and {then}")


def _quiet(*args, **kwargs) -> None:
    """The log of ranks other than 0."""


class _NoTracker:
    """The tracker of ranks other than 0."""

    def log(self, record: dict) -> None:
        pass

    def finish(self, summary: dict) -> None:
        pass


def _train(cfg: TrainConfig, world, run_dir: Path, ckpt: Path | None, t_start: float, log, profile: str,
           stop: StopFlag, hooks: Hooks | None) -> Path:
    threads = set_threads(cfg.threads or None, ranks_here=world.local_size, log=log)
    malloc = allocator.setup(cfg.allocator)
    stages = plan(cfg)
    ranks = f", {world.size} ranks" if world.size > 1 else ""
    log(f"run: {run_dir}  (threads {threads}{ranks}, allocator {malloc})\nconfig:\n{describe(cfg)}")
    eval_set = curriculum.held_out(cfg)
    # refused now, not after the base evaluation, and before the config is saved over a resumed run's own
    if eval_set and (run_dir / "eval_before.jsonl").exists():
        log(check_base_records(run_dir / "eval_before.jsonl", eval_set))
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    fns = [rewards.load_reward(spec, cfg.max_new_tokens) for spec in cfg.rewards]  # a bad reward (each stage loads
    for part in dict.fromkeys(p for st in stages for p in Task.of(st.task).parts):  # its own), bad training data,
        data = curriculum.load(cfg, part, 16 if Task.of(part).levels else cfg.train_size, cfg.seed, "train")
        rewards.check_columns(fns, data, part, ["environments"] if cfg.environment else [])  # now, not at step 1
    if line := rewards.sandbox_for(fns, cfg.allow_unisolated_code):  # model code: sandboxed, or refused here
        log(line)
    if world.main:
        save(cfg, run_dir / "train_config.yaml")
    r, ref, p = build_run(cfg, run_dir, ckpt, log, world, commit=rundir.code_version(),  # now: the checkout may change
                          saved=hooks.saved if hooks else None)
    eval_set = [dataclasses.replace(s, examples=fitting(r, s.examples, s.max_new_tokens, s.task)) for s in eval_set]
    if world.main and world.size == 1:  # the forecast, to set beside the steps that follow
        machine = planner.Machine.measure(0.4)
        log(planner.forecast(cfg, planner.Shapes.of(r.model.config), machine, cfg.model))
    # from here a stop request is honoured after the evaluation or step at hand
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    tracker = Tracker(run_dir, log, cfg.total_steps, cfg.report_to, cfg.to_dict(), hooks) if world.main else \
        _NoTracker()
    try:
        # ---------------------------------------------------------------- evaluate the base model
        if world.broadcast(bool(eval_set) and not (run_dir / "eval_before.jsonl").exists()):
            if world.main:
                write_status(run_dir, state="evaluating", step=p.step, stage="base", stage_index=-1,
                             total_steps=cfg.total_steps, num_stages=len(stages))
            log(f"evaluating the base model on {sum(len(s.examples) for s in eval_set)} held-out problems ...")
            evaluate_all(r, eval_set, run_dir / "eval_before.jsonl")
        # ---------------------------------------------------------------- train, stage after stage
        for k, stage in enumerate(stages):
            if k < p.stage_index:
                continue
            if k > p.stage_index:
                p = dataclasses.replace(p, stage_index=k, stage_step=0, data_pos=0, type_counts={}, validation=None,
                                        stage_ended=False)
            s = enter_stage(r, k, stage, len(stages))
            reward_fns = [rewards.load_reward(spec, stage.max_new_tokens) for spec in cfg.rewards]  # `overlong`
            p = _run_stage(r, p, ref, reward_fns, s, tracker, stop)
            if stop_agreed(r, stop):
                break
            resumed = p.stage_ended  # from this stage's own end checkpoint
            p = dataclasses.replace(p, stage_ended=True)
            finish_stage(r, p, s, eval_set, resumed)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return _finish(r, p, stages, eval_set, tracker, stop, t_start, profile)


def _run_stage(r: Run, p: Progress, ref, reward_fns, s: StageRun, tracker, stop: StopFlag) -> Progress:
    """GRPO steps on one stage from `p` until its steps are done, it is promoted, or a stop is requested; returns
    the progress after them. Every rank holds the same progress, so all agree on when the stage ends."""
    cfg, main, stage, k = r.cfg, r.world.main, s.stage, s.index
    val = curriculum.validation(cfg, stage) if stage.promote_at else []
    if main:
        write_status(r.dir, state="training", step=p.step, stage=stage.name, stage_index=k,
                     total_steps=cfg.total_steps, num_stages=s.count)

    priority = curriculum.TypePriority(s.data, s.order, cfg.seed + k) if stage.prioritized_sampling else None

    def draw(pos: int) -> list:  # a step's problems: at position pos of the stage's order, or by type (p's counts)
        if priority:
            return priority.draw(pos, stage.prompts_per_step, p.type_counts)
        return [s.data[s.order[(pos + i) % len(s.order)]] for i in range(stage.prompts_per_step)]

    while p.stage_step < stage.steps and not promoted(p, stage) and not stop_agreed(r, stop):
        step = grpo_step(r, p, stage, ref, reward_fns, draw, stop)
        if step is None:
            break
        counts = priority.count(p.type_counts, step.rollout.batch, step.scored.first) \
            if priority else p.type_counts
        # ---------------------------------------------------------------- the run's progress: here alone
        p = dataclasses.replace(p, step=p.step + 1, stage_step=p.stage_step + 1, data_pos=p.data_pos + step.drawn,
                                type_counts=counts, stage_ended=False, all_equal_steps=step.all_equal_steps,
                                bad_steps=step.bad_steps, micro_cap=step.micro_cap)
        p = dataclasses.replace(p, validation=validation_accuracy(r, stage, val, p.stage_step))
        record = {**step.record, "stage": stage.name, "stage_index": k, "stage_steps": stage.steps,
                  **({"validation_accuracy": p.validation} if p.validation is not None else {})}
        tracker.log(record)
        if main:
            log_groups(r, p.step, stage.name, step, tracker)
            write_status(r.dir, state="training", step=p.step)
        if promoted(p, stage):
            r.log(f"stage '{stage.name}' promoted at step {p.stage_step}: validation accuracy {p.validation:.3f} >= "
                  f"{stage.promote_at}")
            break
        if cfg.save_every and p.step % cfg.save_every == 0 and p.stage_step < stage.steps:
            save_checkpoint(r, p)
    return p


def _finish(r: Run, p: Progress, stages, eval_set, tracker, stop: StopFlag, t_start: float, profile: str) -> Path:
    """The last checkpoint (at `p`); then either the stop message or the report (summary.json, report.md,
    trackers)."""
    run_dir, log = r.dir, r.log
    last = checkpoint.latest(run_dir)
    if r.world.broadcast(p.step > 0 and (last is None or not last.name.endswith(f"{p.step:06d}"))):
        save_checkpoint(r, p)
    if not r.world.main:
        return run_dir
    if stop.requested:
        tracker.finish({})
        write_status(run_dir, state="stopped", step=p.step)
        if p.step:
            log(f"stopped at step {p.step}: complete checkpoint in {checkpoint.latest(run_dir)}; "
                "continue with the same command and --resume")
        else:
            log("stopped before the first step: run the same command again (the base evaluation is kept)")
        return run_dir
    if eval_set:
        final = stage_eval_path(run_dir, len(stages) - 1, stages[-1].name)
        shutil.copyfile(final, run_dir / "eval_after.jsonl")
    summary = report.write_summary(run_dir, r.cfg, p.step, time.time() - t_start, log, profile, r.commit)
    tracker.finish(summary_metrics(summary, read_json(run_dir / "forgetting.json")))
    write_status(run_dir, state="finished", step=p.step)
    return run_dir
