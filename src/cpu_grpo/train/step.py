"""One GRPO step, readable top to bottom: sample, reward, advantage, update, record.

How it departs from the paper (Shao et al., 2024) and from TRL's GRPOTrainer:
1. Rollouts come from a bf16 copy of the policy with a hand-written KV-cache decoder (rollout.py),
   refreshed from the fp32 master weights after every optimizer step.
2. The default aggregation is `dapo` (token mean over the batch), as in TRL; `grpo` and `dr_grpo` are there.
3. With beta = 0 and one update per rollout, sequences whose advantage is 0 (groups whose rewards are all
   equal) are left out of the update: their gradient is exactly 0, so skipping them changes nothing but time.
4. Log-probs come from the hidden states and a chunked logsumexp, never a (N, T, V) fp32 log-softmax.
5. A completion cut at the length limit earns no credit from any reward function, penalties stay (TRL scores it
   like any other, or masks it out of the loss): an answer that never ends is no answer, and scoring it
   taught a model to write its answer and then pad to the limit.
6. Under torchrun, each rank samples its share of the step's groups and trains on them; the rest of the step
   sees the whole batch, gathered (distributed.py says how). Every decision that ends a loop (a stop request, a
   stage already done) is agreed by all ranks, so that they always meet in the same collectives.
7. With `dynamic_sampling: N` (DAPO, Yu et al., 2025), a step samples up to N batches of prompts_per_step prompts
   until that many groups whose correctness differs within the group are found, and trains on those alone: a group
   whose samples are all right or all wrong teaches nothing about the answer (with format and length rewards it
   would still teach those). `dynamic_sampling_refill: missing` draws, after the first batch, only as many prompts
   as groups are still missing. Every group sampled is logged. `dynamic_sampling_keep: hardest` trains, of the
   groups found, those with the fewest right answers (Kimi k1.5 samples problems by their failure rate).
8. With `train_samples: m` (PODS, Xu et al., 2025), each kept group trains on the m of its samples whose rewards
   spread widest (the best k and the worst m - k), its advantages computed over those m: the update costs m/G.
The run around the step (stages, evaluations, resume, stop, report) is train.py.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..config import TrainConfig
from ..config.stages import Stage
from ..data import rewards, tasks
from ..engine.prompts import encode_prompts
from ..engine.rollout import progress_lines
from ..machine.allocator import peak_rss_mb, rss_mb
from ..rundir import append_jsonl
from . import checkpoint
from .grpo import decoupled_rewards, group_advantages, max_variance
from .runstate import Progress, Run, TrainingError
from .update import Rollout, Update, check_update, update

COLLAPSE_STEPS = 5  # steps in a row in which every group's rewards were all equal, before a warning or a stop


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


class StepResult(NamedTuple):
    """One GRPO step over every group sampled: its metrics.jsonl record, the rollout (B groups of G: N = B*G), the
    weighted total reward (N,), each reward function's values (N each) and the advantages (N,) (0 for groups not
    trained); the problems it drew from the stage's order, and the run's guard counters after it (the loop puts
    them in its Progress)."""

    record: dict
    rollout: Rollout
    total: torch.Tensor
    per_fn: dict[str, list[float]]
    adv: torch.Tensor
    drawn: int
    all_equal_steps: int  # steps in a row in which every group's rewards were all equal
    bad_steps: int  # updates skipped in a row for a non-finite gradient
    micro_cap: int  # the largest micro-batch for the rest of the run (0: none)


def sample(r: Run, batch: list[tasks.Example], limit: int, what: str = "") -> Rollout:
    """G completions of up to `limit` tokens for each problem of the batch, from the bf16 sampler (seeded by the
    run's generator); a rollout that takes long says how far it is, as `what` (rollout.progress_lines)."""
    cfg, tok = r.cfg, r.tok
    prompts = encode_prompts(tok, [ex.chat(cfg.instruction, cfg.system_prompt) for ex in batch])
    sampling = r.sampling(limit)
    if what:
        sampling = dataclasses.replace(sampling, progress=progress_lines(r.log, what))
    completions = r.sampler.generate(prompts, cfg.num_generations, sampling, r.gen)
    truncated = [len(c) >= limit and c[-1] not in r.stops for c in completions]
    return Rollout(batch, prompts, completions, tok.batch_decode(completions, skip_special_tokens=True), truncated)


def refill_size(cfg: TrainConfig, n: int, found: int, ranks: int = 1) -> int:
    """Prompts dynamic sampling draws next when `found` of the `n` groups it needs teach something: a whole batch
    again (DAPO), or with `dynamic_sampling_refill: missing` the groups still missing (rounded up to a multiple of
    the ranks, so that each rank samples as many)."""
    if cfg.dynamic_sampling_refill == "batch":
        return n
    return min(n, -(-(n - found) // ranks) * ranks)


def teaching(cfg: TrainConfig, stage: Stage, per_fn: dict[str, list[float]]) -> list[int]:
    """The groups the update trains on. With `dynamic_sampling` (DAPO), the stage's prompts_per_step groups whose
    first reward function (correctness by default) is not the same for every sample: the first ones, or with the
    stage's `dynamic_sampling_keep: hardest` those with the lowest mean of it (the first among equals), in their
    order; otherwise every group."""
    g, n = cfg.num_generations, stage.prompts_per_step
    groups = len(next(iter(per_fn.values()))) // g
    if not cfg.dynamic_sampling:
        return list(range(groups))
    first = torch.tensor(next(iter(per_fn.values())), dtype=torch.float).nan_to_num(0.0).view(groups, g)
    varies = (first != first[:, :1]).any(dim=1).nonzero().flatten().tolist()
    if stage.dynamic_sampling_keep == "hardest":
        varies = sorted(sorted(varies, key=lambda i: first[i].mean().item())[:n])
    return varies[:n]


def score(cfg: TrainConfig, reward_fns, rollout: Rollout, log=print, stop=None) -> tuple[torch.Tensor, dict]:
    """Every reward function on the completions: the weighted total (N,) and each function's values. Each call may
    take `reward_timeout` seconds (then it scores 0); `stop()` turning true interrupts it (rewards.RewardStopped).

    A completion cut at the length limit earns no credit (its positive rewards count as 0; penalties such as
    `overlong` stay) unless `score_truncated`: otherwise a model can write its answer and then anything until the
    limit (`#### 70` and bare `####` lines) and be paid for it.
    """
    g, batch = cfg.num_generations, rollout.batch
    columns = {**rewards.reward_columns(batch, g), "completion_ids": rollout.completions}
    ids = [ex.id for ex in batch for _ in range(g)]
    completions = rewards.as_completions(rollout.texts, batch, g)
    per_fn = {}
    for fn in reward_fns:
        values = rewards.call_reward(fn, completions, columns, ids, log, cfg.reward_timeout, stop)
        per_fn[fn.__name__] = [min(v, 0.0) if cut and not cfg.score_truncated else v
                               for v, cut in zip(values, rollout.truncated, strict=True)]
    total = torch.zeros(len(rollout.texts))
    for w, values in zip(cfg.reward_weights, per_fn.values(), strict=True):
        total += w * torch.tensor(values).nan_to_num(0.0)
    return total, per_fn


def advantages(cfg: TrainConfig, total: torch.Tensor, per_fn: dict[str, list[float]], rows: torch.Tensor,
               g: int) -> tuple[torch.Tensor, dict]:
    """The advantages of the completions `rows` (whole groups of g) and their stats: of the weighted total reward
    within each group (sum_then_normalize), or GDPO's (normalize_then_sum); a completion no reward function scored
    (every one returned None) is left out of its group's baseline and gets 0."""
    matrix = torch.tensor(list(per_fn.values()), dtype=torch.float).T[rows]  # (n, K)
    if cfg.multi_objective_aggregation == "normalize_then_sum":
        return group_advantages(decoupled_rewards(matrix, torch.tensor(cfg.reward_weights), g), g, "batch")
    return group_advantages(total[rows].masked_fill(torch.isnan(matrix).all(dim=1), math.nan), g, cfg.scale_rewards)


def grpo_step(r: Run, p: Progress, stage: Stage, ref, reward_fns, draw, stop: StopFlag) -> StepResult | None:
    """One GRPO step of `stage` from `p`: sample, score, advantage, update. `draw(pos)` gives the step's
    stage.prompts_per_step problems at position `pos` of the stage's order. Returns what it did over every group
    sampled, or None when a stop was requested during sampling or a reward function (the rollout is discarded: the
    last complete step is what gets saved)."""
    cfg, g, comm, times = r.cfg, r.cfg.num_generations, r.world.comm_seconds, {"rollout": 0.0, "scoring": 0.0}
    t0, n = time.time(), stage.prompts_per_step
    # ---------------------------------------------------------------- sample (this rank's share of the groups)
    # and reward (the whole batch); with dynamic sampling, again until n groups teach something
    drawn, parts, keep = 0, [], []
    while True:
        t = time.time()
        want = refill_size(cfg, n, len(keep), r.world.size) if parts else n
        part = sample(r, draw(p.data_pos + drawn)[:want][r.world.rank::r.world.size], stage.max_new_tokens,
                      f"  step {p.step + 1}: sampling")
        drawn += want
        times["rollout"] += time.time() - t
        if stop_agreed(r, stop):
            return None
        t = time.time()
        try:  # one process: a stop interrupts a reward function that hangs (ranks wait for its time limit)
            scored = score(cfg, reward_fns, part, r.log, (lambda: stop.requested) if r.world.size == 1 else None)
        except rewards.RewardStopped:  # the rollout is discarded, as in sampling
            return None
        parts.append(_gathered(r, part, *scored))
        times["scoring"] += time.time() - t
        rollout = sum((p[0] for p in parts[1:]), parts[0][0])
        total = torch.cat([p[1] for p in parts])
        per_fn = {k: [v for p in parts for v in p[2][k]] for k in parts[0][2]}
        keep = teaching(cfg, stage, per_fn)
        if len(keep) >= n or len(parts) >= max(1, cfg.dynamic_sampling):
            break
    r.sampler.release()  # its memory goes to the update's activations; refresh() brings it back
    # ---------------------------------------------------------------- advantage (within each group)
    _, adv_stats = advantages(cfg, total, per_fn, torch.arange(len(total)), g)  # of every group sampled
    m = cfg.train_samples or g  # of each kept group, the samples trained (PODS: the widest spread of rewards)
    picks = [max_variance(total[i * g:(i + 1) * g], m) for i in keep]
    rows = torch.tensor([i * g + j for i, pick in zip(keep, picks, strict=True) for j in pick], dtype=torch.long)
    adv = torch.zeros_like(total)  # a group or sample left out is not trained: 0 in groups.jsonl
    if keep:
        adv[rows] = advantages(cfg, total, per_fn, rows, m)[0]
    solved = all(sampled_correct(cfg, rollout, per_fn))
    all_equal = _warn_no_signal(r, p, per_fn, adv_stats["frac_zero_std"], solved, r.log)
    t2 = time.time()
    # ---------------------------------------------------------------- update (on the groups kept)
    upd = update(r, ref, rollout.groups(keep, g, picks), adv[rows], stage.max_new_tokens, p.micro_cap)
    bad = check_update(r, p, upd, r.log)
    upd = upd._replace(groups=[keep[i] for i in upd.groups])  # as groups of the whole rollout
    record = _record(r, p, drawn, rollout, total, per_fn, adv_stats, upd, dict(zip(keep, picks, strict=True)),
                     (t0, times, t2, time.time()))
    record |= {"sample_batches": len(parts), "groups": len(rollout.batch)}
    if r.world.size > 1:  # in collectives: transfers, and waiting for the slowest rank
        record["time_comm"] = r.world.comm_seconds - comm
    return StepResult(record, rollout, total, per_fn, adv, drawn, all_equal, bad, upd.micro_cap)


def stop_agreed(r: Run, stop: StopFlag) -> bool:
    """Whether any rank was asked to stop (then every rank stops here, at the same point)."""
    stop.requested = r.world.any(stop.requested)
    return stop.requested


def _gathered(r: Run, rollout: Rollout, total: torch.Tensor, per_fn: dict) -> tuple[Rollout, torch.Tensor, dict]:
    """Every rank's groups back in the step's prompt order (one process: as they are)."""
    if r.world.size == 1:
        return rollout, total, per_fn
    g = r.cfg.num_generations
    mine = [(ex, p, rollout.completions[i * g:(i + 1) * g], rollout.texts[i * g:(i + 1) * g],
             rollout.truncated[i * g:(i + 1) * g], total[i * g:(i + 1) * g].tolist(),
             {k: v[i * g:(i + 1) * g] for k, v in per_fn.items()})
            for i, (ex, p) in enumerate(zip(rollout.batch, rollout.prompts, strict=True))]
    whole = r.world.interleave(mine)

    def flat(j: int) -> list:
        return [x for group in whole for x in group[j]]

    return (Rollout([x[0] for x in whole], [x[1] for x in whole], flat(2), flat(3), flat(4)), torch.tensor(flat(5)),
            {k: [x for group in whole for x in group[6][k]] for k in per_fn})


def sampled_correct(cfg: TrainConfig, rollout: Rollout, per_fn: dict) -> list[bool]:
    """Whether each sampled completion is correct as the evaluations judge it (eval.evaluate.Judge): a math row by
    its extracted answer (unless `correct_reward` is set), any other row by the correct reward (`correct_reward`,
    else the first) scoring 1, as scored (a completion cut at the limit earns nothing from it)."""
    g = cfg.num_generations
    judged = list(per_fn.values())[cfg.rewards.index(cfg.correct_reward) if cfg.correct_reward else 0]
    by_answer = rewards.correctness_reward(rollout.texts, [ex.answer for ex in rollout.batch for _ in range(g)])
    return [bool(a) if ex.math and not cfg.correct_reward else v == 1.0
            for i, (a, v) in enumerate(zip(by_answer, judged, strict=True)) for ex in [rollout.batch[i // g]]]


def _record(r: Run, p: Progress, drawn: int, rollout: Rollout, total, per_fn: dict, adv_stats: dict, upd: Update,
            picks: dict[int, list[int]], times) -> dict:
    """The line of metrics.jsonl of the step after `p` that drew `drawn` problems, whose update trained the samples
    `picks[i]` of each group i it trained (TRL's names for the trackers are in trackers.TRL_NAMES)."""
    cfg, g, (t0, phases, t2, t3) = r.cfg, r.cfg.num_generations, times
    n, c_tokens = len(rollout.completions), sum(len(c) for c in rollout.completions)
    trained = sum(len(rollout.prompts[i]) * len(picks[i]) + sum(len(rollout.completions[i * g + j]) for j in picks[i])
                  for i in upd.groups)  # a sequence's tokens: its prompt's and its completion's
    return {
        "step": p.step + 1, "stage_step": p.stage_step + 1, "loss": upd.sums["loss"], "reward": total.mean().item(),
        **{f"reward/{key}": float(torch.tensor(v).nanmean()) for key, v in per_fn.items()},
        "accuracy": sum(sampled_correct(cfg, rollout, per_fn)) / n,
        "kl": upd.sums["kl_sum"] / max(1, c_tokens) if cfg.beta > 0 else math.nan,
        "ewc_penalty": upd.sums["ewc_penalty"], "ewc_grad_norm": upd.sums["ewc_grad_norm"],
        "clip_frac": upd.sums["clip_frac_sum"] / max(1, c_tokens),
        "completion_len": c_tokens / n, "truncated_frac": sum(rollout.truncated) / n, **adv_stats,
        "frac_skipped": 1 - len(upd.groups) / len(rollout.batch), "grad_norm": upd.grad_norm,
        "lr": r.sched.get_last_lr()[0], "micro_batch_size": upd.micro_batch,
        "time_rollout": phases["rollout"], "time_scoring": phases["scoring"], "time_update": t3 - t2,
        "step_seconds": t3 - t0, "rollout_tok_s": c_tokens / max(phases["rollout"], 1e-9),
        "train_tok_s": trained * cfg.num_iterations / max(t3 - t2, 1e-9),
        "peak_rss_mb": peak_rss_mb(), "rss_mb": rss_mb(), "data_pos": p.data_pos + drawn,
    }


def _warn_no_signal(r: Run, p: Progress, per_fn: dict, frac_zero_std: float, solved: bool, log) -> int:
    """Say so when a step can teach nothing: no reward function scored anything, or every group has been all-equal
    for COLLAPSE_STEPS steps in a row (the update has nothing to push towards); then stop if `on_collapse: stop`,
    naming the newest weights known good: the checkpoint that sampled the last step with a signal (kept by the
    rotation: checkpoint.mark_good), else the base model. A step with a signal marks the weights that sampled it.
    When every sample of the step was right (`solved`) the task is learned, not lost: say that, and go on.
    Returns the steps in a row without one, this step's included."""
    if all(math.isnan(v) for values in per_fn.values() for v in values):
        log(f"warning: step {p.step + 1}: every reward function returned None or nan for every completion, so "
            "nothing is learned: check the reward functions")
    if frac_zero_std < 1 and r.world.main:
        checkpoint.mark_good(r.dir, p.step)
    all_equal = p.all_equal_steps + 1 if frac_zero_std == 1 else 0
    if all_equal != COLLAPSE_STEPS:
        return all_equal
    if solved:
        log(f"note: for {COLLAPSE_STEPS} steps every sample was right, so these problems teach nothing more: the "
            "model has learned them; stop here (the newest checkpoint holds it) or give it harder ones")
        return all_equal
    good = checkpoint.last_good(checkpoint.complete(r.dir / "checkpoints"))
    kept = (f"; {good[0]} holds the newest weights whose rollouts taught something (to go on from there, move the "
            "newer checkpoints aside and --resume)") if good else \
        f"; no checkpoint holds weights whose rollouts taught something: start again from {r.cfg.model}"
    what = (f"for {COLLAPSE_STEPS} steps every group's rewards were all equal, so nothing is learned: an easier "
            "task, a higher temperature, a lower learning rate or a reward with partial credit gives the groups a "
            f"signal (read groups.jsonl){kept}")
    if r.cfg.on_collapse == "stop":
        raise TrainingError(f"stopped (on_collapse: stop): {what}")
    log(f"warning: {what}")
    return all_equal


def log_groups(r: Run, n: int, stage: str, step: StepResult, tracker) -> None:
    """Every group of step `n`, for inspection: prompt, G completions, rewards per function, advantages; and every
    `log_completions_every` steps a table of them for the report_to trackers."""
    g, rollout, total, per_fn, adv = r.cfg.num_generations, step.rollout, step.total, step.per_fn, step.adv
    for i, ex in enumerate(rollout.batch):
        sl = slice(i * g, (i + 1) * g)
        append_jsonl(r.dir / "groups.jsonl", {
            "step": n, "group": i, "stage": stage, "question": ex.question, "answer": ex.answer,
            "difficulty": ex.difficulty, "completions": rollout.texts[sl],
            "rewards": {k: v[sl] for k, v in per_fn.items()}, "total": total[sl].tolist(),
            "advantages": [round(a, 4) for a in adv[sl].tolist()], "zero_std": float(total[sl].std()) < 1e-6,
        })
    if r.cfg.log_completions_every and n % r.cfg.log_completions_every == 0:
        tracker.table("completions", ["prompt", "completion", "answer", "reward", "advantage"],
                      [[rollout.batch[i // g].question, t, rollout.batch[i // g].answer, float(total[i]),
                        float(adv[i])] for i, t in enumerate(rollout.texts)], n)
