"""Choosing the next word of each row from its logits: temperature, top-k, top-p, min-p and the repetition
penalty, then one inverse-CDF draw per row (the sampler's inner loop, sampler.py)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# the inverse-CDF draw's block: the first search runs over the per-block sums, the second inside one block
SAMPLE_BLOCK = 1024


def sample_work(rows: int, vocab: int) -> Tensor:
    """The fp32 buffer sample_token writes its probabilities into (rows, vocab rounded up to SAMPLE_BLOCK); kept
    across a rollout's steps: a fresh 39 MB buffer a step (64 rows, 151,936 words) costs ~10 ms of page faults."""
    return torch.empty(rows, -(-vocab // SAMPLE_BLOCK) * SAMPLE_BLOCK)


def sample_token(logits: Tensor, temperature: float, top_k: int, top_p: float,
                 generator: torch.Generator | None, work: Tensor | None = None, min_p: float = 0.0) -> Tensor:
    """logits (N, V) -> token ids (N,); temperature 0 means greedy. `work`: a sample_work buffer of >= N rows.
    After the temperature: top-k, top-p, then min-p (words less likely than min_p times the likeliest are dropped:
    log p < max log p + log min_p).

    Inverse-CDF sampling with one uniform per row (torch.multinomial draws V exponentials per row: 45 ms a step
    at 64 rows), in two levels: the row's mass per block of SAMPLE_BLOCK words, then the words of the block the
    uniform falls in; a softmax and a cumulative sum over all V words cost 5.8x more (bench/sampling_kernels.py).
    """
    if temperature <= 0:
        return logits.argmax(-1)
    n, v = logits.shape
    z = (sample_work(n, v) if work is None else work)[:n]
    z[:, v:] = -math.inf  # the padding to whole blocks: probability 0
    x = z[:, :v]
    x.copy_(logits).mul_(1 / temperature)
    if top_k > 0:
        kth = torch.topk(x, min(top_k, v), dim=-1).values[:, -1:]
        x.masked_fill_(x < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, idx = torch.sort(x, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest set whose mass reaches top_p
        x.masked_fill_(drop.scatter(-1, idx, drop), -math.inf)
    if min_p > 0:
        x.masked_fill_(x < x.amax(-1, keepdim=True) + math.log(min_p), -math.inf)
    nb = z.shape[1] // SAMPLE_BLOCK
    p = z.sub_(x.amax(-1, keepdim=True)).exp_().view(n, nb, SAMPLE_BLOCK)  # unnormalised probabilities
    mass = p.sum(-1)  # (N, blocks)
    cum = mass.cumsum(-1)
    u = torch.rand(n, 1, generator=generator) * cum[:, -1:]
    block = torch.searchsorted(cum, u).clamp_(max=nb - 1)  # (N, 1)
    u = u - (cum.gather(-1, block) - mass.gather(-1, block))  # the uniform's place inside its block
    inside = p.gather(1, block[:, :, None].expand(n, 1, SAMPLE_BLOCK)).squeeze(1).cumsum(-1)
    word = torch.searchsorted(inside, u).clamp_(max=SAMPLE_BLOCK - 1)
    return (block * SAMPLE_BLOCK + word).squeeze(-1).clamp_(max=v - 1)


def seen_words(prompts: list[list[int]], g: int, vocab: int) -> Tensor:
    """(B*G, V): the words of each row's prompt, group-major, for the repetition penalty."""
    seen = torch.zeros(len(prompts) * g, vocab, dtype=torch.bool)
    for i, prompt in enumerate(prompts):
        seen[i * g:(i + 1) * g, torch.tensor(prompt, dtype=torch.long)] = True
    return seen


def penalised(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019), as transformers' RepetitionPenaltyLogitsProcessor applies
    it: the logits of words seen so far divided by `penalty` where positive, multiplied where negative.

    >>> penalised(torch.tensor([[2.0, -2.0, 2.0]]), torch.tensor([[True, True, False]]), 2.0).tolist()
    [[1.0, -4.0, 2.0]]
    """
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
