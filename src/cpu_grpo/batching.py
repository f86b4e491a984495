"""The training pass over a batch of groups: log-probs of the completions, micro-batches sized from memory."""

from __future__ import annotations

import torch

from . import llama
from .grpo import token_logprobs
from .rollout import left_pad


def group_logprobs(model, prompts, completions, groups: list[int], g: int, pad_id: int, temperature: float,
                   autocast: bool, checkpointing: bool = False):
    """Log-probs (n, T) of the completions of `groups` (n = len(groups) * G) and their mask (n, T).

    Llama-family models run each prompt once per group (llama.group_forward); others run the full
    left-padded prompt + completion sequences through the HF decoder.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    ps = [prompts[i] for i in groups]
    cs = [completions[i * g + j] for i in groups for j in range(g)]
    pids, pvalid = left_pad(ps, pad_id)
    p_len, t_len = pids.shape[1], max(1, max(len(c) for c in cs))
    cids = torch.full((len(cs), t_len), pad_id, dtype=torch.long)
    cmask = torch.zeros(len(cs), t_len)
    for r, c in enumerate(cs):
        if c:
            cids[r, :len(c)] = torch.tensor(c)
            cmask[r, :len(c)] = 1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if llama.supports(base):
            hidden = llama.group_forward(base, pids, pvalid, cids, g, checkpointing)
        else:
            ids = torch.cat([pids.repeat_interleave(g, 0), cids], dim=1)
            attn = torch.cat([pvalid.repeat_interleave(g, 0).long(), cmask.long()], dim=1)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            out = base.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
            hidden = out[:, p_len - 1:-1]
        head = base.get_output_embeddings().weight
    dtype = torch.bfloat16 if autocast else head.dtype  # explicit: autocast does not reach a backward pass
    return token_logprobs(hidden.to(dtype), head, cids, temperature), cmask  # head: cast inside, fp32 grad


def micro_batches(rows: list[int], size: int):
    for i in range(0, len(rows), size):
        yield rows[i:i + size]


def auto_micro_groups(model, tokens_per_group: int) -> int:
    """Groups per forward/backward from free memory.

    Activations kept for the backward pass are ~ layers * hidden * 60 bytes per token under bf16 autocast
    (~1 MB a token for SmolLM2-135M); the budget is a quarter of the free memory, at most 1.5 GB, so the
    peak stays close to weights + optimizer state.
    """
    import psutil

    cfg = model.config
    per_token = cfg.num_hidden_layers * cfg.hidden_size * 60
    budget = min(psutil.virtual_memory().available * 0.25, 1.5e9)
    return int(max(1, budget // (per_token * tokens_per_group)))
