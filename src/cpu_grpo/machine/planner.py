"""`cpu-grpo plan`: seconds per step, peak memory and wall time of a run, predicted before it starts.

From the model's shapes (its config.json alone, no weights), the run's config and this machine's measured speed
(bf16 and fp32 matmuls and a memory copy, about a second in all). Two forecasts: at most (every completion at the
token limit, every batch dynamic sampling may draw, every group trained) and likely (completions, and groups whose
answers differ, as in the default profile's runs: `TYPICAL`); `--completion-len` for an assumption of your own.
What a step costs:

- rollout: one prefill of each prompt, then one decode step per new token; a decode step reads every weight
  once (bytes / bandwidth) or multiplies them by the live rows (2 * params * rows FLOPs), whichever is slower,
  plus a fixed cost per layer (Python and small kernels) and a cost per layer that grows with the tokens
  already in the cache (attention, masks);
- update: forward and backward of every sequence (6 * params * tokens FLOPs; 4 with LoRA, which computes no
  weight gradient for the frozen base), prompts run once per group, plus the optimizer's pass over the
  trainable weights;
- memory: weights (fp32 masters, gradients and AdamW state for full training; a bf16 base and small adapters
  with LoRA), the sampler's bf16 copy, its weights packed for oneDNN and its KV cache (a rollout's or an
  evaluation batch's, and a prefill call's activations), the activations the backward keeps (batching.py) with
  a chunk of bf16 logits, and the process.
A run computes in fp32 where its `bf16` setting says so (auto: where fp32 matmuls beat bf16 ones by
machine.doctor.FP32_MARGIN): then its update at the fp32 peak (its own efficiency), its decoding at bf16's (one
measurement: no faster), with every bf16 value above twice the bytes.
The decode constants (`EFFICIENCY`) are fitted by least squares to the 8 configurations measured on 2026-11-24
(bench/planner.py's FIT set) and checked on others (its CHECK and FRESH sets): every row within 20% for seconds
a step and 12% for peak memory (bench/README.md, 2026-11-24).
A long run's memory grows past what its first steps use (a default-profile run of 2026-11-24: 4.4 -> 8.0 GB over
2 hours against 4.1 predicted): the forecast is the working set, not that growth.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace

from ..config import TrainConfig
from ..config.stages import eval_limits, plan
from ..eval.evaluate import equal_batches

# fractions of the measured peak that each phase reaches, and fixed costs (bench/planner.py's FIT set)
EFFICIENCY = {
    "decode_flops": 0.48,  # decode matmuls are small (rows x hidden): half the square-matmul peak
    "decode_bytes": 0.6,  # weights read once a step: most of the copy bandwidth
    "layer_overhead_s": 5.6e-4,  # per layer and decode step: Python, norms, small kernels
    "context_s": 8.1e-6,  # per layer, decode step and token in the cache: attention over it, its masks
    "train_flops": 0.45,  # forward and backward under bf16 autocast
    # in fp32: the default profile's update ran 1.40-1.44x bf16's tok/s where fp32's peak read 1.97x bf16's (two
    # passes, one machine, 2026-11-28, bench/README.md); its decoding no faster than bf16's (85-88 against 85-89)
    "train_flops_fp32": 0.32,
    "process_gb": 0.9,  # torch, transformers and the tokenizer, before any weight
}
PROMPT_TOKENS = 80  # a chat-formatted question with the instruction, typical of the built-in tasks
# the likely forecast's assumptions, from the default profile's runs at seeds 0-2 (results/default-seed*, 57 steps):
TYPICAL = {
    "fill": 0.65,  # completion tokens over the limit: 0.59, 0.60, 0.69 (greedy evaluations too)
    "varying": 0.5,  # of a batch's groups, those whose correctness varies (dynamic sampling trains them): 4.1 of 8
}


@dataclass
class Machine:
    bf16_gflops: float
    bandwidth_gbs: float
    fp32_gflops: float = 0.0  # 0: not measured (bf16 assumed)
    bf16_kernels: bool = True  # oneDNN's bf16 kernels (engine.models.bf16_supported)

    def fp32(self, cfg: TrainConfig) -> bool:
        """Whether a run of `cfg` samples and trains in fp32 here: doctor.bf16_wanted's rule on this probe."""
        from .doctor import fp32_pays

        return cfg.bf16 == "false" or not self.bf16_kernels or \
            cfg.bf16 == "auto" and fp32_pays(self.bf16_gflops, self.fp32_gflops)

    def gflops(self, cfg: TrainConfig) -> float:
        """The matmul peak of the dtype a run of `cfg` computes in here."""
        return self.fp32_gflops if self.fp32(cfg) else self.bf16_gflops

    @classmethod
    def measure(cls, seconds: float = 1.0) -> Machine:
        import torch

        from .doctor import matmul_gflops

        x = torch.empty(64 * 2**20, dtype=torch.uint8)  # 64 MB, beyond the caches
        y = torch.empty_like(x)
        best, end = float("inf"), time.perf_counter() + seconds / 2
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            y.copy_(x)
            best = min(best, time.perf_counter() - t0)
        from ..engine.models import bf16_supported

        return cls(matmul_gflops(torch.bfloat16, seconds / 4), 2 * x.numel() / best / 1e9,  # read + write
                   matmul_gflops(torch.float32, seconds / 4), bf16_supported())


@dataclass
class Shapes:
    """What the cost model needs of a model: parameter counts and the sizes of its layers."""

    params: int  # every weight, embeddings included
    matmul_params: int  # weights a token multiplies by: every linear, and the lm_head (tied or not)
    lora_params: int  # adapters of rank 16 on every linear
    layers: int
    hidden: int
    vocab: int
    config: object
    fast: bool = True  # on the engine's fast path (engine/arch.py); else the generic path's measured slowdown applies

    @classmethod
    def of_model(cls, spec: str) -> Shapes:
        """The shapes of a model given as `--model` takes it, from its config.json: an alias's shipped with the
        package where it is not fetched yet (said on stderr: the first run fetches it), else the model's own
        (resolved like a run would: a hub id's config is downloaded)."""
        from transformers import AutoConfig

        from ..engine.configs import fetched, shipped_config
        from ..engine.models import ALIASES, resolve_model

        def say(*words) -> None:
            print("plan:", *words, file=sys.stderr, flush=True)

        if spec in ALIASES and not fetched(spec) and (config := shipped_config(spec)) is not None:
            say(f"{spec} is not on this machine yet: planned from its config; the first run fetches it (once)")
            return cls.of(config)
        return cls.of(AutoConfig.from_pretrained(resolve_model(spec, log=say)))

    @classmethod
    def of(cls, config, lora_r: int = 16) -> Shapes:
        from ..engine.arch import dims, supports_config

        c = config.get_text_config() if hasattr(config, "get_text_config") else config  # Gemma 3's multimodal one
        n = dims(c)
        h, d, q, kv, f = n.hidden, n.head_dim, n.heads * n.head_dim, n.kv_heads * n.head_dim, n.ffn
        linears = [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]  # (in, out) per layer
        per_layer = sum(i * o for i, o in linears)
        embed = c.vocab_size * h
        tied = getattr(c, "tie_word_embeddings", False)
        kind = getattr(c, "model_type", "")
        # RMSNorm weights a layer: two, four in Gemma 3 (after attention and the MLP too), and q/k norms of a head
        norms = (4 if kind.startswith("gemma3") else 2) * h + (2 * d if kind in ("qwen3", "gemma3_text") else 0)
        biases = q + 2 * kv if getattr(c, "attention_bias", False) or kind == "qwen2" else 0  # q/k/v biases
        return cls(params=c.num_hidden_layers * (per_layer + norms + biases) + embed * (1 if tied else 2) + h,
                   matmul_params=c.num_hidden_layers * per_layer + embed,
                   lora_params=c.num_hidden_layers * sum(lora_r * (i + o) for i, o in linears),
                   layers=c.num_hidden_layers, hidden=h, vocab=c.vocab_size, config=c, fast=supports_config(config))


@dataclass
class Prediction:
    rollout_s: float
    update_s: float
    peak_gb: float
    steps: int
    eval_s: float
    fast: bool = True  # the model is on the engine's fast path

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.update_s

    @property
    def wall_s(self) -> float:
        return self.steps * self.step_s + self.eval_s


def predict(cfg: TrainConfig, shapes: Shapes, machine: Machine, completion_len: int | None = None,
            prompt_len: int = PROMPT_TOKENS, likely: bool = False) -> Prediction:
    """Seconds per step (rollout, update; the mean over the stages, each at its own completion limit and prompts a
    step unless `completion_len` is given), peak RSS (at the limit) and the whole run's wall time for `cfg` on
    `machine`: at most, or `likely` (TYPICAL)."""
    fill = TYPICAL["fill"] if likely else 1.0
    stages = [(s.steps, s.max_new_tokens, replace(cfg, prompts_per_step=s.prompts_per_step)) for s in plan(cfg)]
    steps = max(1, sum(n for n, _, _ in stages))
    phases = [(n, step_seconds(c, shapes, machine, completion_len or round(fill * t), *sampled_and_trained(c, likely),
                               prompt_len)) for n, t, c in stages]
    rollout, update = (sum(n * times[i] for n, times in phases) / steps for i in (0, 1))
    peak = max(peak_gb(c, shapes, completion_len or t, prompt_len, machine.fp32(cfg)) for _, t, c in stages)
    return Prediction(rollout, update, peak, cfg.total_steps, eval_seconds(cfg, shapes, machine, prompt_len, fill),
                      shapes.fast)


def sampled_and_trained(cfg: TrainConfig, likely: bool = False) -> tuple[list[int], float]:
    """The prompts of each rollout batch of a step and the groups its update trains: every batch dynamic sampling
    may draw and every group it keeps (the default profile drew two batches in 21 of 24 steps: results/LOG.md,
    2026-11-25), or `likely`, with TYPICAL's share of groups whose answers differ (dynamic sampling trains those
    alone, and draws again while it has fewer than prompts_per_step)."""
    n = cfg.prompts_per_step
    if not cfg.dynamic_sampling:
        return [n], n
    if not likely:
        return [n] * cfg.dynamic_sampling, n
    batches, found = [n], n * TYPICAL["varying"]
    while len(batches) < cfg.dynamic_sampling and found < n:
        batches.append(n if cfg.dynamic_sampling_refill == "batch" else math.ceil(n - found))
        found += batches[-1] * TYPICAL["varying"]
    return batches, min(n, found)


def step_seconds(cfg: TrainConfig, shapes: Shapes, machine: Machine, t: int, batches: list[int], groups: float,
                 prompt_len: int = PROMPT_TOKENS) -> tuple[float, float]:
    """A step's rollout and update seconds with every completion at `t` tokens: rollout batches of `batches`
    prompts (sampled_and_trained), `groups` groups trained."""
    e = EFFICIENCY
    g = cfg.num_generations
    flops, bw = machine.gflops(cfg) * 1e9, machine.bandwidth_gbs * 1e9
    train = e["train_flops_fp32"] if machine.fp32(cfg) else e["train_flops"]
    rollout = sum(_decode_seconds(cfg, shapes, machine, k, k * g, t, prompt_len) for k in batches)
    tokens = groups * ((cfg.train_samples or g) * t + prompt_len)  # PODS trains train_samples of each group
    per_token = 4 if cfg.use_lora else 6
    trainable = shapes.lora_params if cfg.use_lora else shapes.params
    update = per_token * shapes.matmul_params * tokens * cfg.num_iterations / (flops * train) \
        + 16 * trainable / bw  # AdamW reads and writes weights, gradients and two moments (fp32)
    if not shapes.fast:  # the generic transformers forward, slower by what bench/architectures.py measured
        from ..engine.arch import GENERIC_SLOWDOWN

        update *= GENERIC_SLOWDOWN["update"]
    return rollout, update


def peak_gb(cfg: TrainConfig, shapes: Shapes, completion_len: int, prompt_len: int = PROMPT_TOKENS,
            fp32: bool = False) -> float:
    """Peak RSS: the process, the weights and optimizer state, and the larger of the two phases' working memory;
    `fp32`: sampling and training in fp32 (Machine.fp32), whose values take twice the bytes."""
    from ..engine.arch import dims
    from ..engine.batching import activation_bytes, micro_rows
    from ..engine.sampler import PREFILL_TOKENS

    p, c, b = shapes.params, shapes.config, 4 if fp32 else 2
    if cfg.use_lora:
        weights = b * p + 16 * shapes.lora_params  # the base (the sampler's too); fp32 adapters, grads, AdamW
        if cfg.lora_rollout == "merged":  # the sampler's copy of the adapted weights (it shares the rest)
            weights += b * (shapes.matmul_params - shapes.vocab * shapes.hidden)
    else:
        weights = 16 * p + b * p  # fp32 masters, gradients, AdamW moments; the sampler's copy
    if cfg.beta > 0:
        weights += 4 * p  # the frozen reference
    rows = cfg.prompts_per_step * cfg.num_generations
    size = dims(c)
    kv_token = 2 * b * size.layers * size.kv_heads * size.head_dim  # keys and values of one token

    def prefill(prompts: int) -> int:  # a prefill call's MLP activations: gate and up, the activation, the product
        return b * 4 * size.ffn * min(PREFILL_TOKENS, prompts * prompt_len)

    # a rollout's KV cache and prefill; an evaluation batch's, and its logits
    sampling = kv_token * (rows * completion_len + cfg.prompts_per_step * prompt_len) + prefill(cfg.prompts_per_step)
    for limit, _, n in eval_batches(cfg):
        sampling = max(sampling, kv_token * n * (prompt_len + limit) + prefill(n) + 4 * shapes.vocab * n)
    if not fp32:  # bf16 sampling multiplies by a oneDNN-packed copy of every matmul weight (projections.pack)
        sampling += 2 * shapes.matmul_params
    micro = min(rows, cfg.micro_batch_size or micro_rows(c, prompt_len, completion_len, cfg.num_generations,
                                                         width=b))
    activations = activation_bytes(c, prompt_len, completion_len, micro, max(1, micro // cfg.num_generations), width=b)
    # a chunk of logits (at most 1024 positions, at most the micro-batch's), scaled by the temperature, softmax
    logits = b * shapes.vocab * min(1024, micro * completion_len) * 3
    return (EFFICIENCY["process_gb"] * 2**30 + weights + max(sampling, activations + logits)) / 2**30


def eval_batches(cfg: TrainConfig) -> list[tuple[int, int, int]]:
    """(completion limit, batches, rows a batch) of a run's evaluation: the held-out sets of one limit share equal
    batches (evaluate.equal_batches); none without held-out sets."""
    if cfg.eval_size == 0:
        return []
    return [(limit, *equal_batches(cfg.eval_size * sets)) for limit, sets in Counter(eval_limits(cfg).values()).items()]


def eval_seconds(cfg: TrainConfig, shapes: Shapes, machine: Machine, prompt_len: int = PROMPT_TOKENS,
                 fill: float = 1.0) -> float:
    """The greedy evaluations (eval_batches), every completion at `fill` of its limit (1: an upper bound)."""
    evaluations = 1 + (len(plan(cfg)) if cfg.eval_every_stage else 1)
    total = sum(batches * _decode_seconds(cfg, shapes, machine, rows, rows, round(fill * limit), prompt_len)
                for limit, batches, rows in eval_batches(cfg))
    return evaluations * total


def _decode_seconds(cfg: TrainConfig, shapes: Shapes, machine: Machine, prompts: int, rows: int, t: int,
                    prompt_len: int) -> float:
    """Prefill `prompts` prompts, then decode `rows` rows to `t` tokens each (none ends early)."""
    e = EFFICIENCY
    # decoding in fp32 measured no faster than in bf16 (EFFICIENCY): bf16's peak where the CPU has the kernels
    flops = (machine.bf16_gflops if machine.bf16_kernels else machine.fp32_gflops or machine.bf16_gflops) * 1e9
    bw, width = machine.bandwidth_gbs * 1e9, 4 if machine.fp32(cfg) else 2
    prefill = 2 * shapes.matmul_params * prompt_len * prompts / (flops * e["train_flops"])
    weights = max(width * shapes.matmul_params / (bw * e["decode_bytes"]),  # the weights read once a step
                  2 * shapes.matmul_params * rows / (flops * e["decode_flops"]))
    cache = shapes.layers * e["context_s"] * t * (prompt_len + t / 2)  # the cache holds prompt + t/2 on average
    seconds = prefill + t * (weights + shapes.layers * e["layer_overhead_s"]) + cache
    if shapes.fast:
        return seconds
    from ..engine.arch import GENERIC_SLOWDOWN  # model.generate: slower by what bench/architectures.py measured

    return seconds * GENERIC_SLOWDOWN["rollout"]


def forecast(cfg: TrainConfig, shapes: Shapes, machine: Machine, model: str, completion_len: int | None = None) -> str:
    """The plan as `cpu-grpo plan` and a run's start print it: likely and at most, or at `completion_len`."""
    if completion_len:
        return render(cfg, machine, model, predict(cfg, shapes, machine, completion_len), None, completion_len)
    return render(cfg, machine, model, predict(cfg, shapes, machine), predict(cfg, shapes, machine, likely=True))


INT8_LINE = ("int8 (rollout_quantization): forecast as bf16; measured 1.13x bf16's rollout speed on a 2-core AMD "
             "EPYC with VNNI (docs/engine.md)")
BF16_LINE = "bf16 (int8 rollouts measured 1.13x here, short of paying for their correction: docs/engine.md)"


def render(cfg: TrainConfig, machine: Machine, model: str, most: Prediction, likely: Prediction | None,
           completion_len: int | None = None) -> str:
    from ..engine.arch import GENERIC_SLOWDOWN

    stages = plan(cfg)
    own = ", ".join(f"{s.name} {s.max_new_tokens}" for s in stages if s.max_new_tokens != cfg.max_new_tokens)
    prompts = ", ".join(f"{s.name} {s.prompts_per_step}" for s in stages if s.prompts_per_step != cfg.prompts_per_step)
    first = likely or most

    def bound(value: str) -> str:
        return f"; at most {value}" if likely else ""

    return "\n".join([
        f"plan for {model}: {cfg.prompts_per_step} prompts{f' ({prompts})' if prompts else ''} x "
        f"{cfg.num_generations} samples x "
        f"{cfg.max_new_tokens} tokens{f' ({own})' if own else ''}, "
        f"{'LoRA' if cfg.use_lora else 'full training'}, {most.steps} steps "
        f"(this machine: bf16 {machine.bf16_gflops:.0f} GFLOP/s, fp32 {machine.fp32_gflops:.0f}, memory "
        f"{machine.bandwidth_gbs:.0f} GB/s{'; in fp32 here' if machine.fp32(cfg) else ''})",
        f"  a step      {first.step_s:.0f} s (rollout {first.rollout_s:.0f} s, update {first.update_s:.0f} s)"
        f"{bound(f'{most.step_s:.0f} s')}",
        f"  evaluation  {first.eval_s / 60:.0f} min{bound(f'{most.eval_s / 60:.0f} min')}",
        f"  the run     {first.wall_s / 60:.0f} min ({first.wall_s / 3600:.1f} h)"
        f"{bound(f'{most.wall_s / 3600:.1f} h')}",
        f"  peak memory {most.peak_gb:.1f} GB",
        f"  rollouts    {INT8_LINE if cfg.rollout_quantization == 'int8' else BF16_LINE}",
        (f"  (completions of {completion_len} tokens)" if completion_len else
         f"  (likely: completions at {TYPICAL['fill']:.0%} of the limit"
         + (f", {TYPICAL['varying']:.0%} of the groups with answers that differ" if cfg.dynamic_sampling else "")
         + ", as in the default profile's runs; at most: every completion at the limit"
         + (f", {cfg.dynamic_sampling} rollout batches a step" if cfg.dynamic_sampling > 1 else "") + ")"),
        *([f"  (off the fast path: the generic path's measured slowdown included, "
           f"{GENERIC_SLOWDOWN['rollout']:.1f}x in rollouts, {GENERIC_SLOWDOWN['update']:.1f}x in updates)"]
          if not most.fast else []),
    ])


def fit_budget(cfg: TrainConfig, shapes: Shapes, machine: Machine, seconds: float | None,
               memory_gb: float | None) -> list[tuple[dict, Prediction]]:
    """Settings that fit a wall-time and/or memory budget: the candidates nearest the config first."""
    import itertools

    from ..config.stages import under_your_fields

    out = []
    for b, g, t, lora in itertools.product((2, 4, 8, 16), (4, 8, 16), (96, 128, 256, 512), (False, True)):
        changes = {"prompts_per_step": b, "num_generations": g, "max_new_tokens": t, "use_lora": lora}
        # as the flags it suggests would run: given, they win over a profile stage's own values
        trial = TrainConfig(**{**cfg.to_dict(), **changes, "stages": under_your_fields(cfg.stages, changes)})
        p = predict(trial, shapes, machine)
        if (seconds is None or p.wall_s <= seconds) and (memory_gb is None or p.peak_gb <= memory_gb):
            distance = sum(abs(getattr(trial, k) - getattr(cfg, k)) / max(1, getattr(cfg, k))
                           for k in ("prompts_per_step", "num_generations", "max_new_tokens")) + \
                (trial.use_lora != cfg.use_lora)
            out.append((distance, changes, p))
    return [(c, p) for _, c, p in sorted(out, key=lambda x: x[0])]
