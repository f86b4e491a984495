"""GRPO math, pure: tensors in, (tensor, stats) out. No I/O, no config objects.

Letters: B prompts, G samples per prompt, N = B*G sequences, T completion tokens, V vocabulary, H hidden.

1. Advantages are group-normalised rewards (Shao et al., 2024), with the scale configurable: by the
   group's std (`group`, the paper), by the batch's std (`batch`), or not at all (`none`, Dr. GRPO).
   A group whose rewards are all equal gets advantages of exactly 0 (not the float noise of r - mean
   divided by eps), so that the loop can tell it teaches nothing and skip it.
2. The policy term is PPO's clipped ratio with separate low/high epsilons (DAPO's clip-higher).
3. KL to a frozen reference uses the k3 estimator exp(ref - logp) - (ref - logp) - 1, weighted by beta.
4. Aggregation is a choice, since it decides how long answers are weighted (see `LOSS_TYPES`). Every
   variant divides by a normaliser computed over the *whole* batch, so micro-batching with gradient
   accumulation gives the same gradient as one big batch.
5. With one update per rollout, old log-probs are the current ones detached: the ratio is 1, so the loss
   value is just -sum(A * mask) / normaliser (exactly 0 for `grpo` with centred advantages) while its
   gradient is the policy gradient. A loss near 0 is not a bug.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, num_generations: int, scale: str = "group", eps: float = 1e-4
                     ) -> tuple[Tensor, dict]:
    """rewards (N,) group-major -> advantages (N,), and the fraction of groups whose rewards are all equal. A nan
    reward (no reward function scored that completion) is left out of its group's mean and spread, and its
    advantage is 0 (TRL's "unscorable" completions).

    >>> group_advantages(torch.tensor([2.0, 0.0, float("nan"), 1.0]), 4, "none")[0].tolist()
    [1.0, -1.0, 0.0, 0.0]
    """
    r = rewards.view(-1, num_generations)  # (B, G)
    if torch.isnan(r).any():
        mean, std = r.nanmean(dim=1, keepdim=True), _nanstd(r, dim=1)
        everywhere = _nanstd(rewards.view(1, -1), dim=1).squeeze()
    else:
        mean = r.mean(dim=1, keepdim=True)
        std = r.std(dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
        everywhere = rewards.std()
    adv = r - mean
    if scale == "group":
        adv = adv / (std + eps)
    elif scale == "batch":
        adv = adv / (everywhere + eps)
    elif scale != "none":
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', not {scale!r}")
    zero_std = std.nan_to_num(0.0) < 1e-6  # (B, 1): all rewards of the group equal
    adv = adv.masked_fill(zero_std, 0.0).nan_to_num(0.0)
    return adv.reshape(-1), {"frac_zero_std": zero_std.float().mean().item(), "reward_std": std.mean().item()}


def _nanstd(x: Tensor, dim: int) -> Tensor:
    """The unbiased standard deviation along `dim` of the values that are not nan (nan where fewer than two)."""
    n = (~torch.isnan(x)).sum(dim, keepdim=True)
    dev = (x - x.nanmean(dim, keepdim=True)).nan_to_num(0.0)
    return ((dev ** 2).sum(dim, keepdim=True) / (n - 1)).sqrt().masked_fill(n < 2, math.nan)


def decoupled_rewards(per_fn: Tensor, weights: Tensor, num_generations: int, eps: float = 1e-4) -> Tensor:
    """GDPO's reward (Liu et al. 2026; TRL's multi_objective_aggregation="normalize_then_sum"): each function's
    rewards (N, K) normalised within their group, then their weighted sum (N,); nan where no function scored. Its
    advantages are the batch-normalised sum (`group_advantages(..., "batch")`), so that a rare reward is not drowned
    by a frequent one.

    >>> decoupled_rewards(torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 10.0], [0.0, 10.0]]), torch.ones(2), 2)
    tensor([ 0.7070, -0.7070,  0.7070, -0.7070])
    """
    k = per_fn.shape[1]
    grouped = per_fn.view(-1, num_generations, k)
    mean = grouped.nanmean(dim=1, keepdim=True)
    std = _nanstd(grouped, dim=1).nan_to_num(0.0) if num_generations > 1 else torch.zeros_like(mean)
    z = ((grouped - mean) / (std + eps)).view(-1, k)
    total = (z * weights[None, :]).nansum(dim=1)
    return total.masked_fill(torch.isnan(per_fn).all(dim=1), math.nan)


def max_variance(rewards: Tensor, m: int) -> list[int]:
    """The indices of the `m` rewards with the largest variance (PODS' max-variance down-sampling, Xu et al. 2025):
    the k largest and the m - k smallest for the best k, which is where that maximum lies; in ascending order."""
    order = rewards.argsort(stable=True).tolist()
    if m >= len(order):
        return sorted(order)
    splits = [order[:m - k] + order[len(order) - k:] for k in range(m + 1)]
    return sorted(max(splits, key=lambda rows: rewards[rows].var().item()))


def _agg_grpo(per_token: Tensor, mask: Tensor, norm: dict) -> Tensor:
    # mean over each sequence's tokens, then mean over all N sequences of the batch
    seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return seq.sum() / norm["num_seqs"]


def _agg_dapo(per_token: Tensor, mask: Tensor, norm: dict) -> Tensor:
    # one mean over every completion token of the batch: long answers weigh more
    return (per_token * mask).sum() / norm["num_tokens"]


def _agg_dr_grpo(per_token: Tensor, mask: Tensor, norm: dict) -> Tensor:
    # sum over tokens divided by a constant N * max_new_tokens: no length bias at all (Liu et al., 2025)
    return (per_token * mask).sum() / (norm["num_seqs"] * norm["max_new_tokens"])


LOSS_TYPES = {"grpo": _agg_grpo, "dapo": _agg_dapo, "dr_grpo": _agg_dr_grpo}


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, advantages: Tensor, mask: Tensor,
              norm: dict, eps_low: float = 0.2, eps_high: float = 0.2, beta: float = 0.0,
              loss_type: str = "dapo", level: str = "token", trained: Tensor | None = None,
              sampler_weight: Tensor | None = None) -> tuple[Tensor, dict]:
    """Clipped-ratio policy loss (+ beta * k3 KL), aggregated by `loss_type`.

    logp, old_logp, ref_logp, mask: (n, T) for this micro-batch; advantages (n,).
    norm: {"num_seqs", "num_tokens", "max_new_tokens"} of the whole batch, so micro-batches add up exactly.
    level "sequence" (GSPO, Zheng et al. 2025) clips one ratio per completion, exp of the mean of its tokens' log
    ratios, as TRL's importance_sampling_level="sequence". `trained` (n, T) keeps the policy term to those tokens
    (the high-entropy ones, `high_entropy`); the KL term and the normaliser keep every token, as in TRL.
    `sampler_weight` ((n, T) or (n, 1), `sampler_correction`) weighs the policy term of rollouts drawn from other
    weights than the trainer's, as TRL's importance_sampling_ratio.
    Returns the loss to backpropagate and sums for logging (divide by the batch's token count).
    """
    keep = mask.bool()
    mask = mask.to(logp.dtype)
    # padded positions are zeroed before exp, so a non-finite value there cannot leak in as inf * 0 = nan
    logp, old_logp = torch.where(keep, logp, 0.0), torch.where(keep, old_logp, 0.0)
    log_ratio = logp - old_logp  # (n, T)
    if level == "sequence":  # (n, 1): one ratio for the whole completion
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    ratio = torch.exp(log_ratio)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    per_token = -torch.min(unclipped, clipped)
    if trained is not None:
        per_token = per_token * trained
    if sampler_weight is not None:
        per_token = per_token * sampler_weight
    stats = {"clip_frac_sum": (((unclipped > clipped).float()) * mask).sum().item()}
    if beta > 0:
        delta = torch.where(keep, ref_logp, 0.0) - logp
        kl = torch.exp(delta) - delta - 1  # k3 estimator, >= 0
        per_token = per_token + beta * kl
        stats["kl_sum"] = (kl * mask).sum().item()
    loss = LOSS_TYPES[loss_type](per_token, mask, norm)
    return loss, stats


def high_entropy(entropies: Tensor, mask: Tensor, quantile: float) -> Tensor:
    """(n, T) 1.0 on the tokens whose entropy is at or above the (1 - quantile) quantile of the unpadded tokens'
    (Wang et al. 2025, "Beyond the 80/20 rule"; TRL's top_entropy_quantile), 0.0 elsewhere.

    >>> high_entropy(torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.2, 9.0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]), 0.5)
    tensor([[0., 1., 1.],
            [1., 0., 0.]])
    """
    keep = mask.bool()
    if not keep.any():
        return torch.zeros_like(entropies)
    threshold = torch.quantile(entropies[keep].float(), 1 - quantile)
    return ((entropies >= threshold) & keep).to(mask.dtype if mask.is_floating_point() else torch.float)


def sampler_correction(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, mode: str, clip_min: float,
                       clip_max: float) -> tuple[Tensor, dict]:
    """The importance weight of rollouts sampled from other weights than the trainer's (an int8 copy), TRL's
    `vllm_importance_sampling_mode`: the ratio trainer / sampler per token (token_*) or per completion (sequence_*:
    the product over its tokens), clipped to [clip_min, clip_max] (*_truncate) or 0 outside it (*_mask); a bound
    of 0 is none. NaN sampler log-probs (tokens the sampler did not draw) count as a ratio of 1. Returns the weight
    ((n, T) or (n, 1), no gradient) and sums for logging: the mismatch (k1 KL sampler || trainer per token), the
    tokens whose ratio leaves [1/3, 3], and the weights clipped or masked.

    >>> w, st = sampler_correction(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -3.0]]), torch.ones(1, 2),
    ...                            "token_truncate", 0.0, 3.0)
    >>> w.tolist(), st["is_far_sum"], st["is_clipped_sum"]
    ([[1.0, 3.0]], 1.0, 1.0)
    """
    keep = mask.bool()
    diff = torch.nan_to_num(torch.where(keep, old_logp - sampler_logp, 0.0), nan=0.0)
    log_w = diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff
    w = torch.exp(log_w)
    low, high = (clip_min or 0.0), (clip_max or math.inf)
    outside = (w < low) | (w > high)
    w = w.clamp(low, high) if mode.endswith("truncate") else w.masked_fill(outside, 0.0)
    counted = keep.expand_as(outside) if outside.shape == keep.shape else keep.any(-1, keepdim=True)
    stats = {"is_kl_sum": float((-diff * keep).sum()), "is_far_sum": float(((diff.abs() > math.log(3)) & keep).sum()),
             "is_clipped_sum": float((outside & counted).sum())}
    return w.detach(), stats
