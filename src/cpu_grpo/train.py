"""The GRPO training loop, readable top to bottom: sample, reward, advantage, loss, step, log, save.

How it departs from the paper (Shao et al., 2024) and from TRL's GRPOTrainer:
1. Rollouts come from a bf16 copy of the policy with a hand-written KV-cache decoder (rollout.py),
   refreshed from the fp32 master weights after every optimizer step.
2. The default aggregation is `dapo` (token mean over the batch), as in TRL; `grpo` and `dr_grpo` are there.
3. With beta = 0 and one update per rollout, sequences whose advantage is 0 (groups whose rewards are all
   equal) are left out of the update: their gradient is exactly 0, so skipping them changes nothing but time.
4. Log-probs come from the hidden states and a chunked logsumexp, never a (N, T, V) fp32 log-softmax.
5. A run is a list of curriculum stages (one by default). After each stage every held-out set is evaluated
   (a row of the forgetting matrix), the Fisher diagonal is estimated, and later stages add the EWC
   penalty's gradient to the policy gradient (stages.py around the loop, curriculum.py for the math).
6. A completion cut at max_new_tokens scores 0 from every reward function (TRL scores it like any other, or
   masks it out of the loss): an answer that never ends is no answer, and scoring it taught a model to write
   its answer and then pad to the limit.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint, curriculum, evaluate, report, rewards, tasks, tracking
from .batching import auto_micro_rows, group_logprobs, micro_batches
from .config import TrainConfig, describe, plan, save
from .grpo import group_advantages, grpo_loss
from .models import keep_freed_memory, set_threads
from .rollout import encode_prompts
from .runstate import Run, TrainingError, bf16_supported, build_run, open_run_dir, run_dir_for, save_checkpoint
from .stages import enter_stage, finish_stage, promoted, stage_finished
from .trackers import summary_metrics
from .tracking import RunLock, Tracker, append_jsonl, peak_rss_mb, read_json, stage_eval_path, write_status

__all__ = ["train", "group_logprobs", "StopFlag", "bf16_supported", "run_dir_for"]


BAD_STEPS = 3  # updates in a row with a non-finite gradient before the run stops
COLLAPSE_STEPS = 5  # steps in a row in which every group's rewards were all equal, before a warning


@dataclass
class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes the step at hand, saves a complete checkpoint, and exits."""

    requested: bool = False
    presses: int = 0
    log: object = field(default=print, repr=False)

    def __call__(self, signum, frame):
        self.presses += 1
        if self.presses > 1:
            raise KeyboardInterrupt
        self.requested = True
        self.log("stop requested: finishing this step and saving a checkpoint (Ctrl-C again to abort without saving)")


@dataclass
class Rollout:
    """One step's samples: B problems, their prompts and G completions each, group-major (row i*G+j)."""

    batch: list[tasks.Example]
    prompts: list[list[int]]
    completions: list[list[int]]
    texts: list[str]
    truncated: list[bool]  # cut at max_new_tokens before the model ended it


@dataclass
class Update:
    """What one update did: loss sums over micro-batches, gradient norm, micro-batch size, groups trained."""

    sums: dict
    grad_norm: float
    micro_batch: int
    groups: list[int]


def sample(r: Run, batch: list[tasks.Example]) -> Rollout:
    """G completions for each problem of the batch, from the bf16 sampler (seeded by the run's generator)."""
    cfg, tok = r.cfg, r.tok
    prompts = encode_prompts(tok, [ex.question for ex in batch], cfg.instruction)
    completions = r.sampler.generate(prompts, cfg.num_generations, cfg.max_new_tokens, r.stops, tok.pad_token_id,
                                     cfg.temperature, cfg.top_k, cfg.top_p, r.gen)
    r.sampler.release()  # its memory goes to the update's activations; refresh() brings it back
    truncated = [len(c) >= cfg.max_new_tokens and c[-1] not in r.stops for c in completions]
    return Rollout(batch, prompts, completions, tok.batch_decode(completions, skip_special_tokens=True), truncated)


def score(cfg: TrainConfig, reward_fns, rollout: Rollout) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Every reward function on the completions: the weighted total (N,) and each function's values.

    A completion cut at the length limit gets 0 from every function unless `score_truncated`: otherwise a model
    can write its answer and then anything until the limit (`#### 70` and bare `####` lines) and be paid for it.
    """
    g, batch = cfg.num_generations, rollout.batch
    columns = {"answer": [ex.answer for ex in batch for _ in range(g)],
               "difficulty": [ex.difficulty for ex in batch for _ in range(g)],
               "question": [ex.question for ex in batch for _ in range(g)],
               "prompts": [ex.question for ex in batch for _ in range(g)]}
    per_fn = {}
    for fn in reward_fns:
        values = rewards.as_scores(fn.__name__, fn(completions=rollout.texts, **columns), len(rollout.texts))
        per_fn[fn.__name__] = [0.0 if cut and not cfg.score_truncated else v
                               for v, cut in zip(values, rollout.truncated, strict=True)]
    total = torch.zeros(len(rollout.texts))
    for w, values in zip(cfg.reward_weights, per_fn.values(), strict=True):
        total += w * torch.tensor(values).nan_to_num(0.0)
    return total, per_fn


def update(r: Run, ref, rollout: Rollout, adv: torch.Tensor) -> Update:
    """The policy-gradient update on the groups that teach something, in micro-batches; after running out of
    memory before its first optimizer step, again at half the micro-batch (kept for the rest of the run)."""
    cfg, g = r.cfg, r.cfg.num_generations
    skip_zero = cfg.beta == 0 and cfg.num_iterations == 1  # zero advantage, zero gradient: skip the group
    groups = [i for i in range(len(rollout.batch)) if not (skip_zero and bool((adv[i * g:(i + 1) * g] == 0).all()))]
    lengths = [len(c) for c in rollout.completions]
    mb = cfg.micro_batch_size or auto_micro_rows(r.model, max(len(p) for p in rollout.prompts), max(lengths), g)
    mb = min(mb, r.micro_cap or mb)
    while True:
        stepped: list[bool] = []
        try:
            sums, grad_norm = _update(r, ref, rollout, groups, adv, mb, stepped)
            break
        except (RuntimeError, MemoryError) as e:
            if stepped or mb <= 1 or not _out_of_memory(e):
                raise
        r.opt.zero_grad(set_to_none=True)
        r.log(f"out of memory with {mb} sequences a micro-batch: this update again, and the rest of the run, "
              f"with {mb // 2}")
        mb = r.micro_cap = mb // 2
    _count_non_finite(r, grad_norm, sums["loss"], r.log)
    r.sched.step()
    r.sampler.refresh()
    return Update(sums, grad_norm, mb, groups)


def grpo_step(r: Run, ref, reward_fns, batch: list[tasks.Example], stop: StopFlag) -> tuple | None:
    """One GRPO step: sample, score, advantage, update. Returns (record, rollout, total, per_fn, adv), or None when
    a stop was requested during sampling (the rollout is discarded: the last complete step is what gets saved)."""
    cfg, t0 = r.cfg, time.time()
    # ---------------------------------------------------------------- sample
    rollout = sample(r, batch)
    t1 = time.time()
    if stop.requested:
        return None
    # ---------------------------------------------------------------- reward and advantage
    total, per_fn = score(cfg, reward_fns, rollout)
    adv, adv_stats = group_advantages(total, cfg.num_generations, cfg.scale_rewards)
    _warn_no_signal(r, per_fn, adv_stats["frac_zero_std"], r.log)
    t2 = time.time()
    # ---------------------------------------------------------------- update
    upd = update(r, ref, rollout, adv)
    r.step, r.stage_step, r.data_pos = r.step + 1, r.stage_step + 1, r.data_pos + cfg.prompts_per_step
    record = _record(r, rollout, total, per_fn, adv_stats, upd, (t0, t1, t2, time.time()))
    return record, rollout, total, per_fn, adv


def _record(r: Run, rollout: Rollout, total, per_fn: dict, adv_stats: dict, upd: Update, times) -> dict:
    """The step's line of metrics.jsonl (TRL's names for the trackers are in trackers.TRL_NAMES)."""
    cfg, g, (t0, t1, t2, t3) = r.cfg, r.cfg.num_generations, times
    n, c_tokens = len(rollout.completions), sum(len(c) for c in rollout.completions)
    trained = sum(len(rollout.prompts[i]) * g + sum(len(c) for c in rollout.completions[i * g:(i + 1) * g])
                  for i in upd.groups)
    answers = [ex.answer for ex in rollout.batch for _ in range(g)]
    return {
        "step": r.step, "stage_step": r.stage_step, "loss": upd.sums["loss"], "reward": total.mean().item(),
        **{f"reward/{key}": float(torch.tensor(v).nanmean()) for key, v in per_fn.items()},
        "accuracy": sum(rewards.correctness_reward(rollout.texts, answers)) / n,
        "kl": upd.sums["kl_sum"] / max(1, c_tokens) if cfg.beta > 0 else math.nan,
        "ewc_penalty": upd.sums["ewc_penalty"], "clip_frac": upd.sums["clip_frac_sum"] / max(1, c_tokens),
        "completion_len": c_tokens / n, "truncated_frac": sum(rollout.truncated) / n, **adv_stats,
        "frac_skipped": 1 - len(upd.groups) / len(rollout.batch), "grad_norm": upd.grad_norm,
        "lr": r.sched.get_last_lr()[0], "micro_batch_size": upd.micro_batch,
        "time_rollout": t1 - t0, "time_scoring": t2 - t1, "time_update": t3 - t2, "step_seconds": t3 - t0,
        "rollout_tok_s": c_tokens / max(t1 - t0, 1e-9),
        "train_tok_s": trained * cfg.num_iterations / max(t3 - t2, 1e-9),
        "peak_rss_mb": peak_rss_mb(), "data_pos": r.data_pos,
    }


def train(cfg: TrainConfig, profile: str = "default", resume: bool = False, log=print) -> Path:
    """Train with GRPO through the stages; evaluate before and after each; write the report. Returns the run dir."""
    t_start = time.time()
    run_dir, ckpt = open_run_dir(cfg, profile, resume)
    with RunLock(run_dir):
        write_status(run_dir, state="starting", message="")  # a resumed run forgets an earlier failure
        try:
            return _train(cfg, run_dir, ckpt, t_start, log, profile)
        except BaseException as e:
            try:
                write_status(run_dir, state="failed", message=f"{type(e).__name__}: {e}"[:300])
            except OSError:  # a full disk: the error itself matters more than the status file
                pass
            raise


def _train(cfg: TrainConfig, run_dir: Path, ckpt: Path | None, t_start: float, log, profile: str) -> Path:
    threads = set_threads(cfg.threads or None)
    keep_freed_memory()
    stages = plan(cfg)
    log(f"run: {run_dir}  (threads {threads})\nconfig:\n{describe(cfg)}")
    busy = os.getloadavg()[0]
    if busy > 0.5:  # OpenMP threads that share their cores with another job run several times slower
        log(f"note: the CPU is already busy (load average {busy:.1f} on {os.cpu_count()} cores): steps will be slower")
    save(cfg, run_dir / "train_config.yaml")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    reward_fns = [rewards.load_reward(spec) for spec in cfg.rewards]
    eval_set = curriculum.held_out(cfg)
    for st in stages:  # bad training data is reported now, not after the base evaluation
        if st.task not in tasks.LEVELS and st.task != "mix":
            curriculum.load(cfg, st.task, cfg.train_size, cfg.seed, "train")
    r, ref = build_run(cfg, run_dir, ckpt, log)
    r.commit = tracking.code_version()  # now, not at the end: the checkout may change while a run trains
    stop = StopFlag(log=log)  # from here a stop request is honoured after the evaluation or step at hand
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    tracker = Tracker(run_dir, log, cfg.total_steps, cfg.report_to, cfg.to_dict())
    try:
        # ---------------------------------------------------------------- evaluate the base model
        if eval_set and not (run_dir / "eval_before.jsonl").exists():
            write_status(run_dir, state="evaluating", step=r.step, stage="base", stage_index=-1,
                         total_steps=cfg.total_steps, num_stages=len(stages))
            log(f"evaluating the base model on {len(eval_set)} held-out problems ...")
            evaluate.run_eval(r.sampler, r.tok, eval_set, cfg, run_dir / "eval_before.jsonl", r.stops, log)
            curriculum.write_forgetting(run_dir, cfg)
        # ---------------------------------------------------------------- train, stage after stage
        for k, stage in enumerate(stages):
            if k < r.stage_index:
                continue
            if k > r.stage_index:
                r.stage_index, r.stage_step, r.data_pos = k, 0, 0
            train_set, order = enter_stage(r, k, stage, len(stages))
            promoted_at = _run_stage(r, ref, reward_fns, k, stage, len(stages), train_set, order, tracker, stop)
            if stop.requested:
                break
            finish_stage(r, k, stage, len(stages), eval_set, train_set, order, promoted_at)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    return _finish(r, stages, eval_set, tracker, stop, t_start, profile)


def _run_stage(r: Run, ref, reward_fns, k: int, stage, n_stages: int, train_set, order, tracker, stop) -> float | None:
    """GRPO steps on one stage until its steps are done, it is promoted, or a stop is requested; returns the last
    validation accuracy (None when the stage has no promotion check)."""
    cfg = r.cfg
    done = stage_finished(r.dir, k, r.step, promoted_only=True)  # resumed after its promotion
    val = curriculum.validation(cfg, stage) if stage.promote_at else []
    promoted_at = None
    write_status(r.dir, state="training", step=r.step, stage=stage.name, stage_index=k, total_steps=cfg.total_steps,
                 num_stages=n_stages)
    while r.stage_step < stage.steps and not done and not stop.requested:
        batch = [train_set[order[(r.data_pos + i) % len(order)]] for i in range(cfg.prompts_per_step)]
        step = grpo_step(r, ref, reward_fns, batch, stop)
        if step is None:
            break
        record, rollout, total, per_fn, adv = step
        promoted_at = promoted(r, stage, val)
        record = {**record, "stage": stage.name, "stage_index": k, "stage_steps": stage.steps,
                  **({"validation_accuracy": promoted_at} if promoted_at is not None else {})}
        tracker.log(record)
        _log_groups(r, stage.name, rollout, per_fn, total, adv, tracker)
        write_status(r.dir, state="training", step=r.step)
        if promoted_at is not None and promoted_at >= stage.promote_at:
            r.log(f"stage '{stage.name}' promoted at step {r.stage_step}: validation accuracy {promoted_at:.3f} >= "
                  f"{stage.promote_at}")
            break
        if cfg.save_every and r.step % cfg.save_every == 0 and r.stage_step < stage.steps:
            save_checkpoint(r)
    return promoted_at


def _finish(r: Run, stages, eval_set, tracker, stop: StopFlag, t_start: float, profile: str) -> Path:
    """The last checkpoint; then either the stop message or the report (summary.json, report.md, trackers)."""
    run_dir, log = r.dir, r.log
    last = checkpoint.latest(run_dir)
    if r.step > 0 and (last is None or not last.name.endswith(f"{r.step:06d}")):
        save_checkpoint(r)
    if stop.requested:
        tracker.finish({})
        write_status(run_dir, state="stopped", step=r.step)
        if r.step:
            log(f"stopped at step {r.step}: complete checkpoint in {checkpoint.latest(run_dir)}; "
                "continue with the same command and --resume")
        else:
            log("stopped before the first step: run the same command again (the base evaluation is kept)")
        return run_dir
    if eval_set:
        final = stage_eval_path(run_dir, len(stages) - 1, stages[-1].name)
        shutil.copyfile(final, run_dir / "eval_after.jsonl")
    summary = report.write_summary(run_dir, r.cfg, r.step, time.time() - t_start, log, profile, r.commit)
    tracker.finish(summary_metrics(summary, read_json(run_dir / "forgetting.json")))
    write_status(run_dir, state="finished", step=r.step)
    return run_dir


def _update(r: Run, ref, rollout: Rollout, groups: list[int], adv: torch.Tensor, mb: int, stepped: list
            ) -> tuple[dict, float]:
    """Old/reference log-probs when needed, then num_iterations optimizer steps over micro-batches of `mb`
    sequences (appending to `stepped` at each). Returns loss statistics and the gradient norm."""
    cfg, model, g, pad = r.cfg, r.model, r.cfg.num_generations, r.tok.pad_token_id
    prompts, completions = rollout.prompts, rollout.completions
    lengths = [len(c) for c in completions]
    norm = {"num_seqs": len(completions), "num_tokens": max(1, sum(lengths)), "max_len": cfg.max_new_tokens}
    fixed = {}  # old and reference log-probs, computed once before the updates
    if cfg.num_iterations > 1 or ref is not None:
        with torch.no_grad():
            for part, samples in micro_batches(groups, g, mb, lengths):
                if cfg.num_iterations > 1:
                    fixed[part, samples, "old"] = group_logprobs(
                        model, prompts, completions, part, g, pad, cfg.temperature, r.autocast, samples=samples)[0]
                if ref is not None:
                    fixed[part, samples, "ref"] = group_logprobs(
                        ref, prompts, completions, part, g, pad, cfg.temperature, r.autocast, samples=samples)[0]
    sums = {"loss": 0.0, "clip_frac_sum": 0.0, "kl_sum": 0.0, "ewc_penalty": 0.0}
    grad_norm = torch.tensor(0.0)
    for _ in range(cfg.num_iterations):
        r.opt.zero_grad(set_to_none=True)
        for part, samples in micro_batches(groups, g, mb, lengths):
            logp, mask = group_logprobs(model, prompts, completions, part, g, pad, cfg.temperature,
                                        r.autocast, cfg.gradient_checkpointing, samples)
            rows = [i * g + j for i in part for j in samples]
            loss, st = grpo_loss(logp, fixed.get((part, samples, "old"), logp.detach()),
                                 fixed.get((part, samples, "ref")), adv[rows], mask, norm,
                                 cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type)
            loss.backward()
            sums["loss"] += loss.item() / cfg.num_iterations
            for key, v in st.items():
                sums[key] += v / cfg.num_iterations
        # EWC: lambda * F * (theta - anchor) joins the policy gradient (curriculum.EWC)
        sums["ewc_penalty"] += r.ewc.apply(model, cfg.ewc_lambda) / cfg.num_iterations
        if groups or r.ewc.fisher and cfg.ewc_lambda:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or math.inf)
            if not torch.isfinite(grad_norm):  # never step with nan/inf: the caller counts and reports it
                r.opt.zero_grad(set_to_none=True)
                return sums, float(grad_norm)
            r.opt.step()
            stepped.append(True)
    return sums, float(grad_norm)


def _count_non_finite(r: Run, grad_norm: float, loss: float, log) -> None:
    """A non-finite gradient skipped the update (the weights are as they were): say so, and stop the run after
    BAD_STEPS such steps in a row."""
    if math.isfinite(grad_norm):
        r.bad_steps = 0
        return
    r.bad_steps += 1
    log(f"step {r.step + 1}: the gradient is not finite (loss {loss}): update skipped")
    if r.bad_steps >= BAD_STEPS:
        raise TrainingError(f"the gradient was not finite in {BAD_STEPS} steps in a row: lower --learning-rate, check "
                            f"--temperature and the rewards; the checkpoints in {r.dir / 'checkpoints'} hold the last "
                            "finite weights")


def _warn_no_signal(r: Run, per_fn: dict, frac_zero_std: float, log) -> None:
    """Say so when a step can teach nothing: no reward function scored anything, or every group has been all-equal
    for COLLAPSE_STEPS steps in a row (the update has nothing to push towards)."""
    if all(math.isnan(v) for values in per_fn.values() for v in values):
        log(f"warning: step {r.step + 1}: every reward function returned None or nan for every completion, so "
            "nothing is learned: check the reward functions")
    r.all_equal_steps = r.all_equal_steps + 1 if frac_zero_std == 1 else 0
    if r.all_equal_steps == COLLAPSE_STEPS:
        log(f"warning: for {COLLAPSE_STEPS} steps every group's rewards were all equal, so nothing is learned: "
            "an easier task, a higher temperature or a reward with partial credit gives the groups a signal "
            "(read groups.jsonl)")


def _out_of_memory(e: BaseException) -> bool:
    return (isinstance(e, MemoryError | torch.OutOfMemoryError) or "can't allocate memory" in str(e)
            or "out of memory" in str(e).lower())


def _log_groups(r: Run, stage: str, rollout: Rollout, per_fn: dict, total, adv, tracker) -> None:
    """Every group of the step, for inspection: prompt, G completions, rewards per function, advantages; and every
    `log_completions_every` steps a table of them for the report_to trackers."""
    g = r.cfg.num_generations
    for i, ex in enumerate(rollout.batch):
        sl = slice(i * g, (i + 1) * g)
        append_jsonl(r.dir / "groups.jsonl", {
            "step": r.step, "group": i, "stage": stage, "question": ex.question, "answer": ex.answer,
            "difficulty": ex.difficulty, "completions": rollout.texts[sl],
            "rewards": {k: v[sl] for k, v in per_fn.items()}, "total": total[sl].tolist(),
            "advantages": [round(a, 4) for a in adv[sl].tolist()], "zero_std": float(total[sl].std()) < 1e-6,
        })
    if r.cfg.log_completions_every and r.step % r.cfg.log_completions_every == 0:
        tracker.table("completions", ["prompt", "completion", "answer", "reward", "advantage"],
                      [[rollout.batch[i // g].question, t, rollout.batch[i // g].answer, float(total[i]),
                        float(adv[i])] for i, t in enumerate(rollout.texts)], r.step)
