"""The policy-gradient update of one step's samples, in the pieces the step (step.py) calls around its optimizer
steps: `prepare` (the groups trained, the micro-batch, old and reference log-probs when needed), `backward` (the
loss's gradient over micro-batches, summed over the ranks, EWC, clipping; a smaller micro-batch after running out
of memory), `summed` (the update over its passes), and the checks of what it did (a non-finite gradient skips it;
an exploded or vanished one is said). grpo.py has the loss."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..engine.batching import SharedPrompts, auto_micro_rows, group_logprobs, micro_batches
from .distributed import World
from .ewc import EWC
from .grpo import grpo_loss, high_entropy, sampler_correction
from .rollout import Rollout
from .runstate import Progress, Run, TrainingError

BAD_STEPS = 3  # updates in a row with a non-finite gradient before the run stops
EXPLODED = 1e4  # a gradient norm (before clipping) past which an update is said to have exploded


class Learner(NamedTuple):
    """What an update works on, and nothing else of the run: the config, the policy and its optimizer, the
    numerics it trains in, the ranks its gradient is summed over, the EWC anchors that pull it, and the log."""

    cfg: object  # TrainConfig
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    pad: int
    autocast: bool
    world: World
    ewc: EWC
    log: object  # Callable[..., None]

    @classmethod
    def of(cls, r: Run) -> Learner:
        return cls(r.cfg, r.model, r.opt, r.tok.pad_token_id, r.autocast, r.world, r.ewc, r.log)


class Update(NamedTuple):
    """What one update did: loss sums over micro-batches, gradient norm, whether an optimizer step was taken (not
    when no rank trained a group, or the gradient was not finite), micro-batch size, groups trained, and the largest
    micro-batch for the rest of the run (0: none; set after running out of memory)."""

    sums: dict
    grad_norm: float
    stepped: bool
    micro_batch: int = 0
    groups: list | tuple = ()  # of the rollout it was given
    micro_cap: int = 0


@dataclass
class Batch:
    """What a step's update trains: the rollout's groups on this rank that teach something (every rank's in
    `trained`), their advantages, the completion limit, the micro-batch size (halved after running out of memory:
    `micro_cap` then holds for the rest of the run) and the old and reference log-probs computed once."""

    rollout: Rollout
    adv: torch.Tensor
    limit: int
    groups: list[int]
    trained: list[int]
    mb: int
    micro_cap: int = 0
    fixed: dict = field(default_factory=dict)


def prepare(r: Learner, ref, rollout: Rollout, adv: torch.Tensor, limit: int, micro_cap: int = 0) -> Batch:
    """The update's batch: the groups that teach something (completions of up to `limit` tokens), in micro-batches
    of at most `micro_cap` sequences (0: no cap), with their fixed log-probs."""
    cfg, g, world = r.cfg, rollout.group_size or r.cfg.num_generations, r.world
    skip_zero = cfg.beta == 0 and cfg.num_iterations == 1  # zero advantage, zero gradient: skip the group
    groups = [i for i in range(world.rank, len(rollout.batch), world.size)  # this rank's groups
              if not (skip_zero and bool((adv[i * g:(i + 1) * g] == 0).all()))]
    trained = sorted(x for part in world.gather(groups) for x in part)  # every rank's
    mb = cfg.micro_batch_size or auto_micro_rows(r.model, max((len(p) for p in rollout.prompts), default=1),
                                                 max((len(c) for c in rollout.completions), default=1), g,
                                                 width=2 if r.autocast else 4)
    batch = Batch(rollout, adv, limit, groups, trained, min(mb, micro_cap or mb), micro_cap)
    _smaller_when_out_of_memory(r, batch, lambda: batch.fixed.update(_fixed_logprobs(r, ref, batch)))
    return batch


def backward(r: Learner, batch: Batch) -> Update:
    """The loss's gradient over the batch's micro-batches, summed over the ranks, EWC's term, clipped: this pass's
    loss sums (this rank's), its gradient norm and whether the optimizer may step (a gradient that is finite, of a
    group some rank trained or of EWC). After running out of memory, again at half the micro-batch."""
    return _smaller_when_out_of_memory(r, batch, lambda: _gradient(r, batch))


def summed(r: Learner, batch: Batch, passes: list[Update]) -> Update:
    """The update over its passes: loss sums averaged over num_iterations and summed over the ranks; the last
    pass's gradient norm."""
    sums = {k: sum(p.sums[k] for p in passes) / r.cfg.num_iterations for k in passes[0].sums}
    ranks = [k for k in ("loss", "clip_frac_sum", "kl_sum", "is_kl_sum", "is_far_sum", "is_clipped_sum") if k in sums]
    sums |= dict(zip(ranks, r.world.sum([sums[k] for k in ranks]), strict=True))
    return Update(sums, passes[-1].grad_norm, all(p.stepped for p in passes), batch.mb, batch.trained,
                  batch.micro_cap)


def _smaller_when_out_of_memory(r: Learner, batch: Batch, work):
    """work(), again with half the micro-batch each time it runs out of memory (nothing was stepped: the same
    work, smaller pieces); the smaller size holds for the rest of the run."""
    while True:
        try:
            return work()
        except (RuntimeError, MemoryError) as e:
            if batch.mb <= 1 or not _out_of_memory(e):
                raise
        r.opt.zero_grad(set_to_none=True)
        r.log(f"out of memory with {batch.mb} sequences a micro-batch: this update again, and the rest of the run, "
              f"with {batch.mb // 2}")
        batch.mb = batch.micro_cap = batch.mb // 2


def _fixed_logprobs(r: Learner, ref, batch: Batch) -> dict:
    """Old (num_iterations > 1) and reference (beta > 0) log-probs of this rank's groups, per micro-batch, computed
    once before the updates."""
    cfg, rollout = r.cfg, batch.rollout
    g, pad = rollout.group_size or cfg.num_generations, r.pad
    lengths = [len(c) for c in rollout.completions]
    fixed = {}
    if cfg.num_iterations > 1 or ref is not None:
        with torch.no_grad():
            for part, samples in micro_batches(batch.groups, g, batch.mb, lengths):
                for kind, net in (("old", r.model if cfg.num_iterations > 1 else None), ("ref", ref)):
                    if net is not None:
                        fixed[part, samples, kind] = group_logprobs(net, rollout.prompts, rollout.completions, part,
                                                                    g, pad, cfg.temperature, r.autocast,
                                                                    samples=samples)[0]
    return fixed


def _gradient(r: Learner, batch: Batch) -> Update:
    """backward's work at the batch's micro-batch size (never a step: the caller steps)."""
    cfg, model, rollout, adv = r.cfg, r.model, batch.rollout, batch.adv
    g, groups, mb, fixed = rollout.group_size or cfg.num_generations, batch.groups, batch.mb, batch.fixed
    prompts, completions = rollout.prompts, rollout.completions
    lengths = [len(c) for c in completions]
    # mask_truncated_completions (DAPO): a completion cut at the limit is left out of the loss and its normaliser
    masked = [cfg.mask_truncated_completions and cut for cut in rollout.truncated]
    kept = 1.0 - torch.tensor(masked, dtype=torch.float)
    # with tools, only the tokens the model wrote are trained and counted (tool results are not its actions)
    written = _written(rollout, lengths)
    trained = [n if written is None else int(written[i].sum()) for i, n in enumerate(lengths)]
    norm = {"num_seqs": len(completions), "max_new_tokens": batch.limit,
            "num_tokens": max(1, sum(n for n, out in zip(trained, masked, strict=True) if not out))}
    entropy = cfg.top_entropy_quantile < 1
    sums = {"loss": 0.0, "clip_frac_sum": 0.0, "kl_sum": 0.0, "ewc_penalty": 0.0, "ewc_grad_norm": 0.0}
    corrected = rollout.sampler_logps is not None and cfg.vllm_importance_sampling_correction
    if corrected:  # every rank has these sums, trained or not (summed() adds them over the ranks)
        sums |= {"is_kl_sum": 0.0, "is_far_sum": 0.0, "is_clipped_sum": 0.0}
    r.opt.zero_grad(set_to_none=True)
    shared = SharedPrompts(model, prompts, r.pad, r.autocast, cfg.gradient_checkpointing) \
        if SharedPrompts.fit(model, mb, g) else None  # a group in parts: its prompt runs once
    for part, samples in micro_batches(groups, g, mb, lengths):
        logp, mask, *ent = group_logprobs(model, prompts, completions, part, g, r.pad,
                                          cfg.temperature, r.autocast, cfg.gradient_checkpointing, samples,
                                          shared.prefix(part) if shared else None, entropy)
        rows = [i * g + j for i in part for j in samples]
        mask = mask * kept[rows, None]
        if written is not None:
            mask = mask * written[rows, :mask.shape[1]]
        old = fixed.get((part, samples, "old"), logp.detach())
        weight, st_is = sampler_correction(old, _padded(rollout.sampler_logps, rows, logp.shape[1]), mask,
                                           cfg.vllm_importance_sampling_mode, cfg.vllm_importance_sampling_clip_min,
                                           cfg.vllm_importance_sampling_clip_max) if corrected else (None, {})
        loss, st = grpo_loss(logp, old, fixed.get((part, samples, "ref")), adv[rows], mask, norm,
                             cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type, cfg.importance_sampling_level,
                             high_entropy(ent[0], mask, cfg.top_entropy_quantile) if entropy else None, weight)
        loss.backward()
        sums["loss"] += loss.item()
        for key, v in (st | st_is).items():
            sums[key] = sums.get(key, 0.0) + v
    if shared:
        shared.close()
    if batch.trained:
        r.world.sum_grads([p for p in model.parameters() if p.requires_grad])
    # EWC: lambda * F * (theta - anchor) joins the policy gradient (ewc.EWC), once, after the sum;
    # decoupled, it pulls the weights back after the optimizer step instead
    sums["ewc_penalty"], sums["ewc_grad_norm"] = r.ewc.apply(model, cfg.ewc_lambda, grad=not cfg.ewc_decoupled)
    if not (batch.trained or r.ewc.fisher and cfg.ewc_lambda):
        return Update(sums, 0.0, False)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or math.inf)
    if not torch.isfinite(grad_norm):  # never step with nan/inf: the caller counts and reports it
        r.opt.zero_grad(set_to_none=True)
        return Update(sums, float(grad_norm), False)
    return Update(sums, float(grad_norm), True)


def check_update(p: Progress, upd: Update, max_grad_norm: float, checkpoints, log) -> int:
    """A non-finite gradient skipped the update of the step after `p` (the weights are as they were): say so, and
    stop the run after BAD_STEPS such steps in a row. A finite gradient that exploded (a norm over EXPLODED that the
    EWC penalty does not explain) or vanished (exactly 0 where groups were trained, with a non-zero loss: saturated
    weights) is said in one line, since the weights may be wrecked though every number is finite. Returns the
    updates skipped in a row, this one included (`checkpoints`: where the last finite weights are)."""
    grad_norm, loss, trained = upd.grad_norm, upd.sums["loss"], bool(upd.groups)
    if not math.isfinite(grad_norm):
        bad = p.bad_steps + 1
        log(f"step {p.step + 1}: the gradient is not finite (loss {loss}): update skipped")
        if bad >= BAD_STEPS:
            raise TrainingError(f"the gradient was not finite in {BAD_STEPS} steps in a row: lower --learning-rate, "
                                f"check --temperature and the rewards; the checkpoints in {checkpoints} hold "
                                "the last finite weights")
        return bad
    if grad_norm > EXPLODED and upd.sums["ewc_grad_norm"] < grad_norm / 2:
        log(f"warning: step {p.step + 1}: the gradient norm is {grad_norm:.3g} (clipped to {max_grad_norm}): "
            "the update exploded; if the rewards fall from here, lower --learning-rate")
    elif grad_norm == 0 and trained and loss != 0:
        log(f"warning: step {p.step + 1}: the gradient is exactly 0 with a loss of {loss:.3g}: the weights may be "
            "saturated by an earlier update; lower --learning-rate")
    return 0


def _padded(rows_of: list[list[float]], rows: list[int], t: int) -> torch.Tensor:
    """(len(rows), t) of the given rows' values, NaN past each row's end."""
    out = torch.full((len(rows), t), float("nan"))
    for i, r in enumerate(rows):
        out[i, :len(rows_of[r])] = torch.tensor(rows_of[r][:t])
    return out


def _written(rollout: Rollout, lengths: list[int]) -> torch.Tensor | None:
    """The (N, T) mask of the tokens the model wrote (tools' results 0; T the longest completion), or None."""
    if rollout.turns is None:
        return None
    out = torch.zeros(len(lengths), max(lengths, default=0))
    for i, t in enumerate(rollout.turns):
        out[i, :len(t.model_mask)] = torch.tensor(t.model_mask, dtype=torch.float)
    return out


def _out_of_memory(e: BaseException) -> bool:
    return (isinstance(e, MemoryError | torch.OutOfMemoryError) or "can't allocate memory" in str(e)
            or "out of memory" in str(e).lower())
