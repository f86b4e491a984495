"""Batched sampling for GRPO: G completions for each of B prompts, fast on a CPU.

How it departs from `transformers.generate`:
1. A bf16 copy of the policy does the sampling; `refresh()` copies the fp32 master weights into it after
   each optimizer step (one cast, ~0.1 s for 135M parameters). LoRA on a bf16 base needs no copy: the policy's
   own frozen base samples, with the adapters applied apart (unmerged); elsewhere LoRA deltas are merged into
   the copy, which shares the weights that have no adapter.
2. For Llama-family decoders (llama, qwen2, mistral, qwen3, gemma3_text, smollm3, phi3: engine/arch.py) a
   short hand-written forward runs over a preallocated KV cache, with q/k/v and gate/up fused, so a decode step
   costs a few large matmuls, not hundreds of small Python calls.
3. Each prompt is prefilled once; its keys/values stay in one copy that the G rows of its group share.
4. Finished rows are dropped from the batch, so long stragglers do not carry dead rows.
5. Randomness comes from an explicit `torch.Generator`: a rollout can be replayed from its seed.
6. A multi-turn rollout (tools, environments: engine/agent.py) is one call: a row whose turn ends in a stop token
   gets its tool results fed to it, a token a step beside the rows still writing, into its own KV cache, and
   writes on; no conversation is prefilled again and no row waits for another's turn (a `Conversation`).
Other architectures fall back to `model.generate` on the bf16 copy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import UserError
from .conversation import Conversation, Turns, in_rounds
from .decode import PrefixCache, decode_step
from .llama import cached_forward, supports
from .projections import Proj, fuse_projections, fused_names, pack, plain_layer, sampling_projections
from .sampling import penalised, sample_token, sample_work, seen_words


@dataclass(frozen=True)
class Sampling:
    """How completions are drawn: the length limit, the tokens that end one, the padding id, and the temperature
    (0: greedy), top-k (0: off), top-p (1.0: off), min-p (0: off) and repetition penalty (1.0: off) of sampling."""

    max_new_tokens: int
    stops: tuple[int, ...]
    pad_id: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    progress: Callable[[int, int], None] | None = field(default=None, compare=False)  # (token, of at most) a step
    logprobs: bool = False  # generate also returns each token's log-prob under the sampler (at the temperature)


def _plain_name(name: str) -> str:
    """Map a peft parameter name to the plain model's name."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


class PromptTooLong(UserError):
    """A prompt that does not fit the model's context with the completion; the message says what to do."""


class Sampler:
    """Samples from a policy: from a copy of it in `dtype`, refreshed after each update, or, for LoRA on a frozen
    base already in `dtype` (the usual bf16 case), from the policy's own base with the adapters applied unmerged
    (no copy at all: 1.26 GB less for a 0.5B model). `copy=True` always makes a copy (a frozen reference, or LoRA
    merged into it: `lora_rollout: merged`, faster to sample from)."""

    def __init__(self, model, dtype: torch.dtype = torch.bfloat16, fast: bool = True, copy: bool = False,
                 int8: bool = False):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.policy = model
        self.dtype = dtype
        self.int8 = int8  # the layers' matmuls in int8 (projections.quantize); the output layer stays in `dtype`
        self.quantized: dict = {}  # a frozen base's int8 weights, made once
        self.unmerged = not copy and fast and supports(base) and _unmerged_lora(model, dtype)
        self.fused_names: set[str] = set()  # the copy's weights that are views into fused buffers
        if self.unmerged:
            self.net, self.fast = base, True
            self.fused = fuse_projections(base)  # the base's frozen q/k/v and gate/up become views into these
        else:
            self.net = _empty_copy(base, dtype)
            for p in self.net.parameters():
                p.requires_grad_(False)
            self.fast = fast and supports(self.net)
            self.fused = fuse_projections(self.net) if self.fast else None
            self.fused_names = fused_names(self.net) if self.fast else set()
        self.projs = self.head = None
        self.released: dict | None = None
        self.refresh()

    def release(self) -> None:
        """Free what only sampling uses until the next refresh() (which the training loop calls after each update):
        the weights packed for oneDNN (projections.pack: a bf16 copy of every matmul weight, repacked in ~0.3 s for the
        0.5B Qwen) and the copy's weights (270 MB for SmolLM2-135M; sampling unmerged there is no copy). The
        update does not use them, and its activations can have the memory."""
        self.projs = self.head = None
        if self.released is None and not self.unmerged:
            self.released = {id(p): p.shape for p in self.net.parameters()}
            for p in self.net.parameters():
                p.data = torch.empty(0, dtype=p.dtype)
            self.fused = None

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the current policy weights (LoRA deltas merged) into the rollout copy, or, sampling unmerged,
        take the adapters' current weights.

        A frozen policy weight that is already in the copy's dtype and has no LoRA delta (with LoRA on a bf16
        base: the embeddings, the output layer, the norms) is shared, not copied: for a 0.5B Qwen2 with its own
        output layer, 545 MB less. Weights inside a fused q/k/v or gate/up buffer are always copied.
        """
        if self.unmerged:  # only the adapters, cast and stacked for sampling
            self.projs = sampling_projections(self.net, self.fused, functools.partial(_lora_term, dtype=self.dtype),
                                              self.quantized if self.int8 else None)
            self.head = _output_layer(self.net)
            return
        deltas = _lora_deltas(self.policy)
        theirs = {_plain_name(name): p for name, p in self.policy.named_parameters(remove_duplicate=False)}
        # every name of a shared tensor (tied embeddings): the copy may or may not share it as the policy does
        names = {name for name, _ in self.net.named_parameters(remove_duplicate=False)}
        missing = names - set(theirs)
        if missing:
            raise ValueError(f"the rollout copy has weights the policy lacks: {sorted(missing)[:3]}")
        shared = {name for name, p in theirs.items()
                  if name in names and name not in deltas and name not in self.fused_names
                  and not p.requires_grad and p.dtype == self.dtype}
        if self.released is not None:  # fused buffers first (new parameters), then the rest: nothing allocated twice
            self.fused = fuse_projections(self.net, self.released) if self.fast else None
            for name, p in self.net.named_parameters(remove_duplicate=False):
                if p.numel() == 0 and name not in shared:  # the same (empty) parameter object as at release
                    p.data = torch.empty(self.released[id(p)], dtype=p.dtype)
            self.released = None
        mine = dict(self.net.named_parameters(remove_duplicate=False))
        for name, p in theirs.items():
            if name in shared:
                mine[name].data = p.data
            elif name in mine:
                mine[name].copy_(p + deltas[name]() if name in deltas else p)
        if self.fast:  # a copy's weights changed: quantized again
            self.projs = sampling_projections(self.net, self.fused, int8={} if self.int8 else None)
            self.head = _output_layer(self.net)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], num_generations: int, sampling: Sampling,
                 generator: torch.Generator | None = None, conversation: Conversation | None = None) -> list[list[int]]:
        """Return B*G completions (token ids, a stop token included when reached), group-major: row i*G+j; with a
        `conversation`, each row's whole conversation after its prompt, within `sampling.max_new_tokens`. With
        `sampling.logprobs` (the fast path only), (completions, log-probs): each token's log-prob under this
        sampler's weights at the temperature, without top-k/p or penalty (what the trainer computes; NaN for a
        token given by the conversation), for the update's importance sampling correction."""
        if not prompts:
            return ([], []) if sampling.logprobs else []
        context = getattr(self.net.config, "max_position_embeddings", None)
        longest, limit = max(len(p) for p in prompts), sampling.max_new_tokens
        if context and longest + limit > context:
            raise PromptTooLong(f"a prompt of {longest} tokens plus {limit} new tokens exceeds the model's "
                                f"context of {context}: shorten or drop that question, or lower the token limit")
        if self.released is not None or (self.fast and self.projs is None):
            self.refresh()
        if not self.fast:
            if sampling.logprobs:
                raise ValueError("the sampler's log-probs are kept on its fast path only")

            def once(ps, k, limit):
                return _hf_generate(self.net, ps, k, dataclasses.replace(sampling, max_new_tokens=limit), generator)

            if conversation is None:
                return once(prompts, num_generations, limit)
            return in_rounds(once, prompts, num_generations, limit, sampling.stops, conversation)
        return _fast_generate(self.net, self.projs, self.head, prompts, num_generations, sampling, generator,
                              conversation)


def _output_layer(net):
    """The output layer as sampling runs it: packed for oneDNN where it runs (projections.pack), else as it is."""
    head = net.lm_head
    packed = pack(head.weight) if isinstance(head, torch.nn.Linear) else None  # not under a LoRA wrapper
    return head if packed is None else Proj(head.weight, head.bias, packed=packed)


def _empty_copy(base, dtype: torch.dtype):
    """The plain architecture of `base` (no LoRA wrappers) with uninitialised weights in `dtype`, buffers copied.

    Built on the meta device, so the copy never holds a full-precision duplicate of the model (a deepcopy
    then a cast would, for a moment: 540 MB more peak memory for 135M parameters). refresh() fills it.
    """
    try:
        with torch.device("meta"):
            net = type(base)(base.config)
    except Exception:  # an architecture that cannot be built from its config alone
        net = _unwrap_lora(copy.deepcopy(base))
        return net.to(dtype).eval()
    net = net.to(dtype).to_empty(device="cpu").eval()
    theirs = dict(base.named_buffers())
    with torch.no_grad():
        for name, buf in net.named_buffers():
            buf.copy_(theirs[name])
    if getattr(base, "generation_config", None) is not None:
        net.generation_config = copy.deepcopy(base.generation_config)
    return net


def _unwrap_lora(net):
    """Replace every LoRA layer in a deep copy of a peft base model by its plain base layer."""
    for name, module in list(net.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            parent_name, _, child = name.rpartition(".")
            parent = net.get_submodule(parent_name) if parent_name else net
            setattr(parent, child, module.base_layer)
    return net


def _unmerged_lora(model, dtype: torch.dtype) -> bool:
    """A peft LoRA policy whose adapters can be applied apart from its base: one active plain adapter (no DoRA)
    on each adapted layer, all of them linear, and every base weight frozen and already in `dtype`."""
    if not hasattr(model, "get_base_model"):
        return False
    base = model.get_base_model()
    adapted = [m for m in base.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    for m in adapted:
        names = [a for a in m.active_adapters if a in m.lora_A]
        if len(names) != 1 or m.use_dora.get(names[0], False) or not isinstance(m.base_layer, torch.nn.Linear):
            return False
    return bool(adapted) and all(p.dtype == dtype and not p.requires_grad
                                 for name, p in base.named_parameters() if "lora_" not in name)


def _lora_term(modules, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
    """The LoRA term of projections stacked as one (q/k/v, gate/up): (a, bt) with a their A matrices stacked
    (sum r, in) and bt their B matrices times scaling, transposed and block-diagonal (sum r, sum out); None
    without adapters."""
    outs = [plain_layer(m).out_features for m in modules]
    parts = []
    for k, m in enumerate(modules):
        if hasattr(m, "lora_A"):
            (name,) = [a for a in m.active_adapters if a in m.lora_A]
            parts.append((k, m.lora_A[name].weight, m.lora_B[name].weight * m.scaling[name]))
    if not parts:
        return None
    a = torch.cat([pa for _, pa, _ in parts]).to(dtype)
    bt = torch.zeros(a.shape[0], sum(outs), dtype=dtype)
    row = 0
    for k, pa, pb in parts:
        col = sum(outs[:k])
        bt[row:row + pa.shape[0], col:col + outs[k]] = pb.t()
        row += pa.shape[0]
    return a, bt


def _lora_deltas(model) -> dict:
    """Weight name -> a function computing its LoRA delta: one full-size delta exists at a time (all of them at
    once would be the size of the model in fp32)."""
    out = {}
    if not hasattr(model, "get_base_model"):
        return out
    for name, module in model.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "active_adapters"):
            out[_plain_name(name) + ".weight"] = functools.partial(_delta, module)
    return out


def _delta(module) -> Tensor:
    return sum(module.get_delta_weight(a) for a in module.active_adapters if a in module.lora_A)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> ids (B, P) padded on the left, and a bool mask (B, P) of the real tokens."""
    p_len = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), p_len), pad_id, dtype=torch.long)
    valid = torch.zeros(len(seqs), p_len, dtype=torch.bool)
    for r, s in enumerate(seqs):
        ids[r, p_len - len(s):] = torch.tensor(s)
        valid[r, p_len - len(s):] = True
    return ids, valid


# ---------------------------------------------------------------------------------------------------------
# fast path: llama.cached_forward over a preallocated KV cache


# prompt tokens a prefill call takes at once: its matmuls are large already, and an evaluation batch of 200
# prompts in one call would hold ~0.9 GB of MLP activations (the 0.5B Qwen2, 100-token prompts)
PREFILL_TOKENS = 4096


def _fast_generate(net, projs, head, prompts, num_generations: int, sampling: Sampling, generator,
                   conversation: Conversation | None = None):
    cfg, s, max_new_tokens = net.config, sampling, sampling.max_new_tokens
    b, g = len(prompts), num_generations
    ids, valid = left_pad(prompts, s.pad_id)
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    hkv, p_len = cfg.num_key_value_heads, ids.shape[1]
    prompt_cache = [(torch.zeros(b, hkv, head_dim, p_len, dtype=net.dtype),  # keys transposed
                     torch.zeros(b, hkv, p_len, head_dim, dtype=net.dtype)) for _ in range(cfg.num_hidden_layers)]
    step = max(1, PREFILL_TOKENS // p_len)
    parts = [slice(i, i + step) for i in range(0, b, step)]  # a few prompts a call; one prefill per prompt
    last = torch.cat([cached_forward(net, projs, ids[r], pos[r], [(k[r], v[r]) for k, v in prompt_cache], 0, valid[r])
                      for r in parts])  # (B, H)
    cache = PrefixCache(prompt_cache, valid, g, max_new_tokens)
    next_pos = pos[:, -1].repeat_interleave(g, 0) + 1  # (N,)
    logits = head(last).repeat_interleave(g, 0)  # (N, V)
    out: list[list[int]] = [[] for _ in range(b * g)]
    eos = torch.tensor(list(s.stops))
    done = torch.zeros(b * g, dtype=torch.bool)  # per live batch row
    work = sample_work(b * g, logits.shape[-1]) if s.temperature > 0 else None  # greedy draws need none
    seen = seen_words(prompts, g, logits.shape[-1]) if s.repetition_penalty != 1.0 else None
    turns = Turns(conversation) if conversation is not None else None
    lps: list[list[float]] | None = [[] for _ in range(b * g)] if s.logprobs else None
    for step in range(max_new_tokens):
        raw = logits
        if seen is not None:
            logits = penalised(logits, seen, s.repetition_penalty)
        tok = sample_token(logits, s.temperature, s.top_k, s.top_p, generator, work, s.min_p)
        given = turns.give(cache.rows, tok) if turns is not None else None
        lp = _token_logprobs(raw, tok, s.temperature, given).tolist() if lps is not None else None
        if seen is not None:
            seen[torch.arange(len(tok)), tok] = True
        for i, (r, t, d) in enumerate(zip(cache.rows.tolist(), tok.tolist(), done.tolist(), strict=True)):
            if not d:
                out[r].append(t)
                if lps is not None:
                    lps[r].append(lp[i])
        ended = torch.isin(tok, eos)
        done = done | (ended if turns is None else turns.ended(cache.rows, ended & ~given & ~done, out))
        if s.progress is not None:
            s.progress(step + 1, max_new_tokens)
        if step == max_new_tokens - 1 or bool(done.all()):
            if s.progress is not None and hasattr(s.progress, "end"):
                s.progress.end()
            break
        if int(done.sum()) >= max(1, len(done) // 8):  # drop finished rows from the batch and the cache
            keep = (~done).nonzero().squeeze(-1)
            cache.keep(keep)
            tok, next_pos, done = tok[keep], next_pos[keep], done[keep]
            seen = seen[keep] if seen is not None else None
        last = decode_step(net, projs, cache, tok, next_pos, step)
        next_pos = next_pos + 1
        logits = head(last)
    return out if lps is None else (out, lps)


def _token_logprobs(logits: Tensor, tok: Tensor, temperature: float, given: Tensor | None) -> Tensor:
    """log softmax(logits / T) at each row's token (n,), fp32; NaN where the token was given, not sampled."""
    z = logits.float() / (temperature if temperature > 0 else 1.0)
    lp = z.gather(-1, tok[:, None]).squeeze(-1) - torch.logsumexp(z, -1)
    return lp if given is None else lp.masked_fill(given, math.nan)


# ---------------------------------------------------------------------------------------------------------
# fallback: transformers.generate on the rollout copy


def _hf_generate(net, prompts, num_generations: int, sampling: Sampling, generator):
    s = sampling
    ids, mask = left_pad(prompts, s.pad_id)
    p_len, mask = ids.shape[1], mask.long()
    if generator is not None:  # generate() draws from the global RNG: seed it from ours
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
    random = dict(do_sample=True, temperature=s.temperature, top_k=s.top_k or None, top_p=s.top_p,
                  min_p=s.min_p or None, repetition_penalty=s.repetition_penalty)
    seqs = net.generate(input_ids=ids.repeat_interleave(num_generations, 0),
                        attention_mask=mask.repeat_interleave(num_generations, 0), max_new_tokens=s.max_new_tokens,
                        eos_token_id=list(s.stops), pad_token_id=s.pad_id,
                        **(random if s.temperature > 0 else dict(do_sample=False)))
    out = []
    for row in seqs[:, p_len:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in s.stops), len(row))
        out.append(row[:cut])
    return out


def stop_ids(tokenizer, model) -> tuple[int, ...]:
    """The tokens that end a completion: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids.update(extra if isinstance(extra, list) else [extra])
    return tuple(sorted(i for i in ids if i is not None))
