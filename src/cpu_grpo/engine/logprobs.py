"""Per-token log-probabilities of chosen tokens from hidden states and the output head, in chunks: the (N, T, V)
log-softmax is never materialised in fp32, forward or backward (docs/how-it-works.md)."""

from __future__ import annotations

import torch
from torch import Tensor

# the most bytes of probabilities token_logprobs keeps for its backward instead of recomputing them: a 0.5B Qwen's
# 4 x 320 completion tokens over its 151,936 words in bf16 take 389 MB, and recomputing them costs the lm_head's
# matmul again (a third of the head's work; bench/README.md, issue 49)
KEEP_BYTES = 2**30


def token_logprobs(hidden: Tensor, lm_head: Tensor, targets: Tensor, temperature: float = 1.0,
                   chunk: int = 1024, keep_bytes: int = KEEP_BYTES) -> Tensor:
    """log p(target) for each position, never materialising (N, T, V) logits in fp32, forward or backward.

    hidden (N, T, H), lm_head (V, H), targets (N, T) -> (N, T) fp32. The matmuls run in hidden's dtype (an
    fp32 lm_head is cast once, and its gradient comes back in fp32, not through a bf16 round trip). Each
    chunk of positions gets its softmax from the fused kernel (fp32 inside, hidden's dtype out) and
    log p = log softmax[target]: relative precision, so a bf16 probability is within 0.4% (0.004 nats).
    The probabilities are kept for the backward (d logp / d logits = onehot(target) - softmax) while they
    take at most `keep_bytes`; beyond that the backward recomputes them (one more lm_head matmul). The
    temperature divides the hidden states, not the (N, V) logits: (h / T) W^T = (h W^T) / T, in H/V of the divisions.
    """
    h = hidden.reshape(-1, hidden.shape[-1])  # (N*T, H)
    out = _ChunkedLogprob.apply(h, lm_head, targets.reshape(-1), temperature, chunk, keep_bytes)
    return out.view(targets.shape)


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, tgt: Tensor, temperature: float, chunk: int, keep_bytes: int) -> Tensor:
        wc, h = w.to(h.dtype), h / temperature if temperature != 1.0 else h
        keep = h.shape[0] * w.shape[0] * h.element_size() <= keep_bytes
        out = torch.empty(h.shape[0], dtype=torch.float32)
        kept = []
        for i in range(0, h.shape[0], chunk):
            probs = (h[i:i + chunk] @ wc.t()).softmax(-1)  # (chunk, V)
            p = probs.gather(-1, tgt[i:i + chunk, None]).squeeze(-1).float()
            out[i:i + chunk] = p.clamp_min(torch.finfo(torch.float32).tiny).log()
            if keep:
                kept.append(probs)
        ctx.save_for_backward(h, wc, tgt)  # h divided by the temperature
        ctx.kept, ctx.temperature, ctx.chunk, ctx.w_dtype = kept, temperature, chunk, w.dtype
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, w, tgt = ctx.saved_tensors
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = None
        for k, i in enumerate(range(0, h.shape[0], ctx.chunk)):
            hc, gc = h[i:i + ctx.chunk], grad[i:i + ctx.chunk, None].to(h.dtype)
            probs = ctx.kept[k] if ctx.kept else (hc @ w.t()).softmax(-1)
            d = probs.mul_(-gc)  # -softmax * grad, then + onehot * grad (probs are not needed again)
            d.scatter_add_(-1, tgt[i:i + ctx.chunk, None], gc)
            if grad_h is not None:  # d/dh of (h/T) W^T: W^T / T
                grad_h[i:i + ctx.chunk] = d @ w
            if ctx.needs_input_grad[1]:  # hc is h / T already
                part = (d.t() @ hc).float()
                grad_w = part if grad_w is None else grad_w.add_(part)
        ctx.kept = None
        if grad_h is not None and ctx.temperature != 1.0:
            grad_h.div_(ctx.temperature)
        return grad_h, grad_w.to(ctx.w_dtype) if grad_w is not None else None, None, None, None, None


@torch.no_grad()
def token_entropies(hidden: Tensor, lm_head: Tensor, temperature: float = 1.0, chunk: int = 1024) -> Tensor:
    """The entropy (nats) of the next-word distribution at each position, in chunks, no gradient: hidden (N, T, H),
    lm_head (V, H) -> (N, T) fp32. An lm_head matmul more than token_logprobs; taken only where asked
    (top_entropy_quantile < 1)."""
    h = hidden.reshape(-1, hidden.shape[-1])
    w = lm_head.to(h.dtype)
    out = torch.empty(h.shape[0], dtype=torch.float32)
    for i in range(0, h.shape[0], chunk):
        logits = (h[i:i + chunk] @ w.t()).float() / temperature
        logp = logits.log_softmax(-1)
        out[i:i + chunk] = -(logp.exp() * logp).sum(-1)
    return out.view(hidden.shape[:-1])
