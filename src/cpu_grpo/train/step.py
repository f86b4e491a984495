"""One GRPO step, readable top to bottom: sample, reward, advantage, update, record.

How it departs from the paper (Shao et al., 2024) and from TRL's GRPOTrainer:
1. Rollouts come from a bf16 copy of the policy with a hand-written KV-cache decoder (engine/sampler.py),
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

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..config import TrainConfig
from ..config.stages import Stage
from ..data import rewards
from ..machine.allocator import peak_rss_mb, rss_mb
from ..rundir import append_jsonl
from . import checkpoint
from .grpo import decoupled_rewards, group_advantages, max_variance
from .rollout import Rollout, Scored, correct, gathered, sample, score
from .runstate import Progress, Run, TrainingError, learning_rate, set_learning_rate
from .update import Learner, Update, backward, check_update, prepare, summed

COLLAPSE_STEPS = 5  # steps in a row in which every group's rewards were all equal, before a warning or a stop


@dataclass
class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes the step at hand, saves a complete checkpoint, and exits (an
    evaluation: the batch at hand, its records kept; `doing` says which). A second signal aborts."""

    requested: bool = False
    presses: int = 0
    log: object = field(default=print, repr=False)
    doing: str = "finishing this step and saving a checkpoint (Ctrl-C again to abort without saving)"

    def __call__(self, signum, frame):
        self.presses += 1
        if self.presses > 1:
            raise KeyboardInterrupt
        self.requested = True
        self.log(f"stop requested: {self.doing}")


class StepResult(NamedTuple):
    """One GRPO step over every group sampled: its metrics.jsonl record, the rollout (B groups of G: N = B*G), its
    rewards and the advantages (N,) (0 for groups not trained); the problems it drew from the stage's order, and the
    run's guard counters after it (the loop puts them in its Progress)."""

    record: dict
    rollout: Rollout
    scored: Scored
    adv: torch.Tensor
    drawn: int
    all_equal_steps: int  # steps in a row in which every group's rewards were all equal
    bad_steps: int  # updates skipped in a row for a non-finite gradient
    micro_cap: int  # the largest micro-batch for the rest of the run (0: none)


class Sampled(NamedTuple):
    """A step's sampling: every group sampled (all ranks'), scored; the groups the update trains; the problems drawn
    from the stage's order and the rollout batches it took."""

    rollout: Rollout
    scored: Scored
    keep: list[int]
    drawn: int
    batches: int


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
    """One GRPO step of `stage` from `p`: sample, score, advantage, update, and the optimizer's steps.
    `draw(pos)` gives the step's stage.prompts_per_step problems at position `pos` of the stage's order. Returns
    what it did over every group sampled, or None when a stop was requested during sampling or a reward function
    (the rollout is discarded: the last complete step is what gets saved)."""
    cfg, g, comm, times = r.cfg, r.cfg.num_generations, r.world.comm_seconds, {"rollout": 0.0, "scoring": 0.0}
    t0 = time.time()
    # ---------------------------------------------------------------- sample and score
    s = sample_and_score(r, p, stage, reward_fns, draw, stop, times)
    if s is None:
        return None
    rollout, scored, keep = s.rollout, s.scored, s.keep
    r.sampler.release()  # its memory goes to the update's activations; refresh() brings it back
    right = correct(cfg, rollout, scored)  # as the evaluations judge it
    # ---------------------------------------------------------------- advantage (within each group)
    total, per_fn = scored.total, scored.per_fn
    _, adv_stats = advantages(cfg, total, per_fn, torch.arange(len(total)), g)  # of every group sampled
    m = cfg.train_samples or g  # of each kept group, the samples trained (PODS: the widest spread of rewards)
    picks = [max_variance(total[i * g:(i + 1) * g], m) for i in keep]
    rows = torch.tensor([i * g + j for i, pick in zip(keep, picks, strict=True) for j in pick], dtype=torch.long)
    adv = torch.zeros_like(total)  # a group or sample left out is not trained: 0 in groups.jsonl
    if keep:
        adv[rows] = advantages(cfg, total, per_fn, rows, m)[0]
    all_equal = _warn_no_signal(r, p, per_fn, adv_stats["frac_zero_std"], all(right), r.log)
    if p.stage_step == 0:
        _warn_cut(rollout.truncated, stage.max_new_tokens, r.log)
    t2 = time.time()
    # ---------------------------------------------------------------- update (on the groups kept) and step
    start = p.step - p.stage_step  # the stage's first step
    learner = Learner.of(r)  # what the update works on
    batch = prepare(learner, ref, rollout.groups(keep, g, picks), adv[rows], stage.max_new_tokens, p.micro_cap)
    set_learning_rate(r.opt, learning_rate(cfg, stage, p.step, start))
    passes = []
    for _ in range(cfg.num_iterations):
        passes.append(backward(learner, batch))
        if not passes[-1].stepped:
            break  # a gradient that is not finite, or nothing trained: no step, and the update ends
        r.opt.step()
        if cfg.ewc_decoupled:  # EWC's pull back toward the anchors, after the step
            r.ewc.pull(r.model, cfg.ewc_lambda, r.opt.param_groups[0]["lr"])
    r.sampler.refresh()  # the new weights, for the next rollout
    upd = summed(learner, batch, passes)
    bad = check_update(p, upd, cfg.max_grad_norm, r.dir / "checkpoints", r.log)
    upd = upd._replace(groups=[keep[i] for i in upd.groups])  # as groups of the whole rollout
    lr_next = learning_rate(cfg, stage, p.step + 1, start)  # logged, as transformers' Trainer logs it
    record = _record(r, p, s, right, adv_stats, upd, dict(zip(keep, picks, strict=True)), lr_next,
                     (t0, times, t2, time.time()))
    if r.world.size > 1:  # in collectives: transfers, and waiting for the slowest rank
        record["time_comm"] = r.world.comm_seconds - comm
    return StepResult(record, rollout, scored, adv, s.drawn, all_equal, bad, upd.micro_cap)


def sample_and_score(r: Run, p: Progress, stage: Stage, reward_fns, draw, stop: StopFlag,
                     times: dict) -> Sampled | None:
    """This rank's share of the step's groups sampled, the whole batch scored; with dynamic sampling, again until
    stage.prompts_per_step groups teach something. None when a stop was requested (the rollout is discarded)."""
    cfg, n = r.cfg, stage.prompts_per_step
    drawn, batches, keep, rollout, scored = 0, 0, [], None, None
    while not batches or len(keep) < n and batches < max(1, cfg.dynamic_sampling):
        t = time.time()
        want = refill_size(cfg, n, len(keep), r.world.size) if batches else n
        part = sample(cfg, r.tok, r.sampler, r.sampling(stage.max_new_tokens), r.gen,
                      draw(p.data_pos + drawn)[:want][r.world.rank::r.world.size], r.log,
                      f"  step {p.step + 1}: sampling", r.tools, r.environments)
        drawn, batches = drawn + want, batches + 1
        times["rollout"] += time.time() - t
        if stop_agreed(r, stop):
            return None
        t = time.time()
        try:  # one process: a stop interrupts a reward function that hangs (ranks wait for its time limit)
            mine = score(cfg, reward_fns, part, r.log, (lambda: stop.requested) if r.world.size == 1 else None)
        except rewards.RewardStopped:  # the rollout is discarded, as in sampling
            return None
        part, mine = gathered(r.world, part, mine)
        rollout, scored = (part, mine) if rollout is None else (rollout + part, scored + mine)
        times["scoring"] += time.time() - t
        keep = teaching(cfg, stage, scored.per_fn)
    return Sampled(rollout, scored, keep, drawn, batches)


def stop_agreed(r: Run, stop: StopFlag) -> bool:
    """Whether any rank was asked to stop (then every rank stops here, at the same point)."""
    stop.requested = r.world.any(stop.requested)
    return stop.requested


def _record(r: Run, p: Progress, s: Sampled, right: list[bool], adv_stats: dict, upd: Update,
            picks: dict[int, list[int]], lr: float, times) -> dict:
    """The line of metrics.jsonl of the step after `p`, whose update trained the samples `picks[i]` of each group i
    it trained (TRL's names for the trackers are in trackers.TRL_NAMES)."""
    cfg, g, (t0, phases, t2, t3) = r.cfg, r.cfg.num_generations, times
    rollout, total, per_fn = s.rollout, s.scored.total, s.scored.per_fn
    n, c_tokens = len(rollout.completions), sum(len(c) for c in rollout.completions)
    trained = sum(len(rollout.prompts[i]) * len(picks[i]) + sum(len(rollout.completions[i * g + j]) for j in picks[i])
                  for i in upd.groups)  # a sequence's tokens: its prompt's and its completion's
    return {
        "step": p.step + 1, "stage_step": p.stage_step + 1, "loss": upd.sums["loss"], "reward": total.mean().item(),
        **{f"reward/{key}": float(torch.tensor(v).nanmean()) for key, v in per_fn.items()},
        "accuracy": sum(right) / n,
        "kl": upd.sums["kl_sum"] / max(1, c_tokens) if cfg.beta > 0 else math.nan,
        "ewc_penalty": upd.sums["ewc_penalty"], "ewc_grad_norm": upd.sums["ewc_grad_norm"],
        "clip_frac": upd.sums["clip_frac_sum"] / max(1, c_tokens),
        "completion_len": c_tokens / n, "truncated_frac": sum(rollout.truncated) / n, **adv_stats,
        "frac_skipped": 1 - len(upd.groups) / len(rollout.batch), "grad_norm": upd.grad_norm,
        "lr": lr, "micro_batch_size": upd.micro_batch,
        "time_rollout": phases["rollout"], "time_scoring": phases["scoring"], "time_update": t3 - t2,
        "step_seconds": t3 - t0, "rollout_tok_s": c_tokens / max(phases["rollout"], 1e-9),
        "train_tok_s": trained * cfg.num_iterations / max(t3 - t2, 1e-9),
        "peak_rss_mb": peak_rss_mb(), "rss_mb": rss_mb(), "data_pos": p.data_pos + s.drawn,
        "sample_batches": s.batches, "groups": len(rollout.batch),
        **({"tool_calls": sum(t.calls for t in rollout.turns) / n, "tool_failures":
            sum(t.failed for t in rollout.turns) / n} if rollout.turns is not None else {}),
        **({"sampler_kl": upd.sums["is_kl_sum"] / max(1, c_tokens), "sampler_far_frac": upd.sums["is_far_sum"] /
            max(1, c_tokens), "sampler_corrected_frac": upd.sums["is_clipped_sum"] /
            max(1, n if cfg.vllm_importance_sampling_mode.startswith("sequence") else c_tokens)}
           if "is_kl_sum" in upd.sums else {}),
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


def _warn_cut(truncated: list[bool], limit: int, log) -> None:
    """Say so when a stage's first step cut most completions at the limit: the right answers it can reward are then
    the short ones, and training pulls towards stopping early (results/ablation: at 96 tokens, learning rate 2e-4
    and one rollout batch a step, the 0.5B model came to answer rg:basic_arithmetic with bare guesses, and did so
    with cut completions left out of the loss too)."""
    cut = sum(truncated)
    if cut >= 0.75 * len(truncated):
        log(f"warning: {cut} of {len(truncated)} completions of the first step were cut at {limit} tokens, so only "
            "short ones can earn a reward and training may teach the model to stop working early: give it more "
            "--max-new-tokens")


def log_groups(r: Run, n: int, stage: str, step: StepResult, tracker) -> None:
    """Every group of step `n`, for inspection: prompt, G completions (with tools, each exchange too), rewards per
    function, advantages; and every
    `log_completions_every` steps a table of them for the report_to trackers."""
    g, rollout, adv = r.cfg.num_generations, step.rollout, step.adv
    total, per_fn = step.scored.total, step.scored.per_fn
    for i, ex in enumerate(rollout.batch):
        sl = slice(i * g, (i + 1) * g)
        append_jsonl(r.dir / "groups.jsonl", {
            "step": n, "group": i, "stage": stage, "question": ex.question, "answer": ex.answer,
            "difficulty": ex.difficulty, "completions": rollout.texts[sl],
            "rewards": {k: v[sl] for k, v in per_fn.items()}, "total": total[sl].tolist(),
            "advantages": [round(a, 4) for a in adv[sl].tolist()], "zero_std": float(total[sl].std()) < 1e-6,
            **({"transcripts": [t.messages for t in rollout.turns[sl]]} if rollout.turns is not None else {}),
        })
    if r.cfg.log_completions_every and n % r.cfg.log_completions_every == 0:
        tracker.table("completions", ["prompt", "completion", "answer", "reward", "advantage"],
                      [[rollout.batch[i // g].question, t, rollout.batch[i // g].answer, float(total[i]),
                        float(adv[i])] for i, t in enumerate(rollout.texts)], n)
