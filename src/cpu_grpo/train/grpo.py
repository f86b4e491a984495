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

import torch
from torch import Tensor


def group_advantages(rewards: Tensor, num_generations: int, scale: str = "group", eps: float = 1e-4
                     ) -> tuple[Tensor, dict]:
    """rewards (N,) group-major -> advantages (N,), and the fraction of groups whose rewards are all equal."""
    r = rewards.view(-1, num_generations)  # (B, G)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean)
    adv = r - mean
    if scale == "group":
        adv = adv / (std + eps)
    elif scale == "batch":
        adv = adv / (rewards.std() + eps)
    elif scale != "none":
        raise ValueError(f"scale_rewards must be 'group', 'batch' or 'none', not {scale!r}")
    zero_std = std < 1e-6  # (B, 1): all rewards of the group equal
    adv = adv.masked_fill(zero_std, 0.0)
    return adv.reshape(-1), {"frac_zero_std": zero_std.float().mean().item(), "reward_std": std.mean().item()}


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
              loss_type: str = "dapo") -> tuple[Tensor, dict]:
    """Clipped-ratio policy loss (+ beta * k3 KL), aggregated by `loss_type`.

    logp, old_logp, ref_logp, mask: (n, T) for this micro-batch; advantages (n,).
    norm: {"num_seqs", "num_tokens", "max_new_tokens"} of the whole batch, so micro-batches add up exactly.
    Returns the loss to backpropagate and sums for logging (divide by the batch's token count).
    """
    keep = mask.bool()
    mask = mask.to(logp.dtype)
    # padded positions are zeroed before exp, so a non-finite value there cannot leak in as inf * 0 = nan
    logp, old_logp = torch.where(keep, logp, 0.0), torch.where(keep, old_logp, 0.0)
    ratio = torch.exp(logp - old_logp)  # (n, T)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    per_token = -torch.min(unclipped, clipped)
    stats = {"clip_frac_sum": (((unclipped > clipped).float()) * mask).sum().item()}
    if beta > 0:
        delta = torch.where(keep, ref_logp, 0.0) - logp
        kl = torch.exp(delta) - delta - 1  # k3 estimator, >= 0
        per_token = per_token + beta * kl
        stats["kl_sum"] = (kl * mask).sum().item()
    loss = LOSS_TYPES[loss_type](per_token, mask, norm)
    return loss, stats
