"""The training pass over a batch of groups: log-probs of the completions, micro-batches sized from memory."""

from __future__ import annotations

import itertools

import torch

from . import llama
from .arch import dims
from .logprobs import KEEP_BYTES, token_entropies, token_logprobs
from .sampler import left_pad


def group_logprobs(model, prompts, completions, groups: list[int], num_generations: int, pad_id: int,
                   temperature: float, autocast: bool, checkpointing: bool = False,
                   samples: tuple[int, ...] | None = None, prefix: llama.Prefix | None = None,
                   entropy: bool = False):
    """Log-probs (n, T) of the completions of `groups` and their mask (n, T): the given samples of each group
    (indices in 0..G-1; all G by default), so n = len(groups) * len(samples). With `entropy`, the entropy (n, T) of
    each position's distribution too (no gradient).

    Llama-family models run each prompt once per micro-batch (llama.group_forward), or not at all with a `prefix`
    of these groups (SharedPrompts); others run the full left-padded prompt + completion sequences through the HF
    decoder.
    """
    base, g = (model.get_base_model() if hasattr(model, "get_base_model") else model), num_generations
    samples = samples or tuple(range(g))
    ps = [prompts[i] for i in groups]
    cs = [completions[i * g + j] for i in groups for j in samples]
    rows_per_prompt = len(samples)
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
            hidden = llama.group_forward(base, pids, pvalid, cids, rows_per_prompt, checkpointing, prefix)
        else:
            ids = torch.cat([pids.repeat_interleave(rows_per_prompt, 0), cids], dim=1)
            attn = torch.cat([pvalid.repeat_interleave(rows_per_prompt, 0).long(), cmask.long()], dim=1)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            out = base.get_decoder()(input_ids=ids, attention_mask=attn, position_ids=pos).last_hidden_state
            hidden = out[:, p_len - 1:-1]
        head = base.get_output_embeddings().weight
    dtype = torch.bfloat16 if autocast else head.dtype  # explicit: autocast does not reach a backward pass
    logp = token_logprobs(hidden.to(dtype), head, cids, temperature)  # head: cast inside, fp32 grad
    if entropy:
        return logp, cmask, token_entropies(hidden.detach().to(dtype), head.detach(), temperature)
    return logp, cmask


class SharedPrompts:
    """The prompt of a group that trains in parts (micro-batches of fewer than G rows) run once, not once a part:
    `prefix(part)` runs a new group's prompt pass and hands out its keys and values as leaves; the parts' backward
    passes gather their gradients there, and the pass's own backward runs when the next group starts or at
    `close()`. The gradients are those of a prompt run with each part (tests/engine/test_sampler.py)."""

    def __init__(self, model, prompts, pad_id: int, autocast: bool, checkpointing: bool = False):
        self.model, self.prompts, self.pad_id = model, prompts, pad_id
        self.autocast, self.checkpointing = autocast, checkpointing
        self.groups, self.held = None, None

    @staticmethod
    def fit(model, rows: int, num_generations: int) -> bool:
        """Whether groups train in parts on the llama fast path, where a kept prompt pass saves work."""
        return rows < num_generations and llama.supports(model)  # supports() looks through a peft wrapper

    def prefix(self, groups: tuple[int, ...]) -> llama.Prefix:
        if groups != self.groups:
            self.close()
            pids, pvalid = left_pad([self.prompts[i] for i in groups], self.pad_id)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                ran = llama.prompt_forward(self.model, pids, pvalid, self.checkpointing)
            self.groups, self.held = groups, (ran, ran.leaves())
        return self.held[1]

    def close(self) -> None:
        """The held prompt pass's backward (call it after the last part's)."""
        if self.held is not None and torch.is_grad_enabled():
            self.held[0].backward(self.held[1])
        self.groups, self.held = None, None


def micro_batches(groups: list[int], num_generations: int, rows: int, lengths: list[int] | None = None):
    """Micro-batches of about `rows` sequences as (groups, samples): whole groups when rows >= G, else each
    group in near-equal parts (SharedPrompts runs its prompt once for them), its samples ordered by completion length
    (`lengths`, one per sequence) so that short ones are padded to short ones."""
    g = num_generations
    if rows >= g:
        k = rows // g
        for i in range(0, len(groups), k):
            yield tuple(groups[i:i + k]), tuple(range(g))
        return
    parts = -(-g // max(1, rows))
    bounds = [round(j * g / parts) for j in range(parts + 1)]
    for i in groups:
        order = sorted(range(g), key=lambda j: lengths[i * g + j]) if lengths else list(range(g))
        for lo, hi in itertools.pairwise(bounds):
            yield (i,), tuple(order[lo:hi])


def activation_bytes(cfg, prompt_len: int, completion_len: int, rows: int, groups: int = 1, width: int = 2) -> float:
    """Bytes the training forward (llama.group_forward under bf16 autocast, then token_logprobs) keeps for the
    backward: `rows` completions of `completion_len` tokens from `groups` prompts of `prompt_len` tokens; `width`
    is the bytes of a value the autocast dtype holds (2; 4 for training in fp32).

    Counted from what the code saves, per token and layer: the fp32 residual and its normalised copy at both
    norms (16 H), the bf16 inputs of the projections (4 H), q and k around the rotary embedding (6 q + 4 kv),
    the attention output (2 q), gate, up and their product (6 I); per completion row and layer, the prompt's
    keys and values repeated for the row and the attention probabilities; per completion token, the final norm
    and the lm_head's input (10 H); the lm_head's softmax if it fits in logprobs.KEEP_BYTES; qwen3's and gemma3's
    q/k norms and Gemma's extra norms and GELU (measured on small models of each, tests/engine/test_architectures.py).
    It reads 3-8% above the allocations measured on small models (tests/engine/test_batching.py) and on real shapes
    (bench/dev/activation_bytes.py, removed; at commit 289024d).
    Models off the llama fast path keep more.
    """
    n = dims(cfg)
    h, i, layers = n.hidden, n.ffn, n.layers
    q, kv = n.heads * n.head_dim, n.kv_heads * n.head_dim
    kind = getattr(cfg, "model_type", "")
    b = width
    extra = (4 + b) * (q + kv) if kind in ("qwen3", "gemma3_text") else 0  # q/k norms: their input, fp32 output
    if kind == "gemma3_text":  # the norms after attention and MLP, and GELU's output (SiLU's is recomputed)
        extra += (16 + 2 * b) * h + b * i
    token = layers * (16 * h + 2 * b * h + 3 * b * i + 4 * b * q + 2 * b * kv + extra)
    seq = prompt_len + completion_len
    row = completion_len * (token + (8 + b) * h) + layers * seq * (2 * b * kv + b * n.heads * completion_len)
    prompt = prompt_len * token + layers * b * n.heads * prompt_len**2
    probs = rows * completion_len * cfg.vocab_size * b  # kept only when it fits (logprobs.token_logprobs)
    return rows * row + groups * prompt + (probs if probs <= KEEP_BYTES else 0)


# activation bytes a micro-batch may keep: the 0.5B Qwen trains 4 of its 8 samples at once at 256 tokens, 3 at 320
# (16% faster than one at a time on 2 cores: its prompt runs 2-3 times a group, not 8; at 320 tokens 4 at once peak
# at 8.15 GiB, 3 at 7.6: bench/README.md, issue 49), SmolLM2-135M whole groups. Undone on 2026-11-28 when a demo
# seed collapsed under its rounding; back since the format reward stopped paying for a bare marker (issue 67)
MICRO_BUDGET = 2.5e9


def auto_micro_rows(model, prompt_len: int, completion_len: int, num_generations: int,
                    budget: float = MICRO_BUDGET, width: int = 2) -> int:
    """Sequences per forward/backward so that the activations kept for the backward (`activation_bytes`) fit
    `budget` bytes (and a quarter of the free memory): micro_rows for this model."""
    import psutil

    budget = min(psutil.virtual_memory().available * 0.25, budget)
    return micro_rows(model.config, prompt_len, completion_len, num_generations, budget, width)


def micro_rows(cfg, prompt_len: int, completion_len: int, num_generations: int, budget: float = MICRO_BUDGET,
               width: int = 2) -> int:
    """Whole groups while their activations fit `budget` bytes, else parts of a group (its prompt's pass is kept
    for the parts: SharedPrompts)."""
    g = num_generations

    def held(rows: int, groups: int = 1) -> float:
        return activation_bytes(cfg, prompt_len, completion_len, rows, groups, width)

    if held(g) <= budget:
        k = 1
        while held((k + 1) * g, k + 1) <= budget:
            k += 1
        return g * k
    rows = g - 1
    while rows > 1 and held(rows) > budget:
        rows -= 1
    return rows
