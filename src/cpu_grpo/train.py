"""The GRPO training loop, readable top to bottom: sample, reward, advantage, loss, step, log, save.

How it departs from the paper (Shao et al., 2024) and from TRL's GRPOTrainer:
1. Rollouts come from a bf16 copy of the policy with a hand-written KV-cache decoder (rollout.py),
   refreshed from the fp32 master weights after every optimizer step.
2. The default aggregation is `dapo` (token mean over the batch), as in TRL; `grpo` and `dr_grpo` are there.
3. With beta = 0 and one update per rollout, sequences whose advantage is 0 (groups whose rewards are all
   equal) are left out of the update: their gradient is exactly 0, so skipping them changes nothing but time.
4. Log-probs come from the hidden states and a chunked logsumexp, never a (N, T, V) fp32 log-softmax.
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint, evaluate, llama, rewards, tasks
from .config import TrainConfig, describe, save
from .grpo import group_advantages, grpo_loss, token_logprobs
from .models import load_model, set_threads
from .rollout import Sampler, encode_prompts, eos_ids, left_pad
from .tracking import Tracker, append_jsonl, peak_rss_mb


@dataclass
class StopFlag:
    """Set by SIGINT/SIGTERM: the loop finishes the step at hand, saves a complete checkpoint, and exits."""

    requested: bool = False
    presses: int = 0
    log: object = field(default=print, repr=False)

    def __call__(self, signum, frame):
        self.presses += 1
        if self.presses > 1:
            raise KeyboardInterrupt
        self.requested = True
        self.log("stop requested: finishing this step and saving a checkpoint (Ctrl-C again to abort without saving)")


def bf16_supported() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        return False


def run_dir_for(cfg: TrainConfig, profile: str = "default") -> Path:
    if cfg.output_dir:
        return Path(cfg.output_dir)
    name = cfg.run_name or f"{profile}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path("runs") / name


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
    return token_logprobs(hidden.to(dtype), head.to(dtype), cids, temperature), cmask


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


def score(cfg: TrainConfig, reward_fns, texts: list[str], batch: list[tasks.Example], prompts_text: list[str]):
    """Run every reward function on the completions; returns (total (N,), per-function dict of lists)."""
    g = cfg.num_generations
    columns = {
        "answer": [ex.answer for ex in batch for _ in range(g)],
        "difficulty": [ex.difficulty for ex in batch for _ in range(g)],
        "question": [ex.question for ex in batch for _ in range(g)],
        "prompts": [p for p in prompts_text for _ in range(g)],
    }
    per_fn = {}
    for fn in reward_fns:
        values = fn(completions=texts, **columns)
        per_fn[fn.__name__] = [math.nan if v is None else float(v) for v in values]
    total = torch.zeros(len(texts))
    for w, values in zip(cfg.reward_weights, per_fn.values(), strict=True):
        total += w * torch.tensor(values).nan_to_num(0.0)
    return total, per_fn


def make_optimizer(cfg: TrainConfig, model):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / (cfg.warmup_steps + 1)
        rest = max(1, cfg.steps - cfg.warmup_steps)
        frac = min(1.0, (step - cfg.warmup_steps) / rest)
        return {"constant": 1.0, "linear": 1 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[cfg.lr_scheduler]

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def prepare_model(cfg: TrainConfig, log):
    model, tok = load_model(cfg.model, cfg.trust_remote_code, log=log)
    if cfg.use_lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, tok


def train(cfg: TrainConfig, profile: str = "default", resume: bool = False, log=print) -> Path:
    """Train with GRPO; evaluate before and after on held-out problems; write the report. Returns the run dir."""
    t_start = time.time()
    if resume and not (cfg.output_dir or cfg.run_name):
        raise SystemExit("--resume needs the run to continue: pass its --output-dir or --run-name.")
    run = run_dir_for(cfg, profile)
    ckpt = checkpoint.latest(run) if resume else None
    if resume and ckpt is None:
        raise SystemExit(f"--resume: no complete checkpoint under {run}/checkpoints: start a new run without --resume.")
    if not resume and (run / "metrics.jsonl").exists():
        raise SystemExit(f"{run} already holds a run: pass --resume to continue it, or choose another --output-dir "
                         "or --run-name (nothing was overwritten).")
    run.mkdir(parents=True, exist_ok=True)
    threads = set_threads(cfg.threads or None)
    log(f"run: {run}  (threads {threads})\nconfig:\n{describe(cfg)}")
    busy = os.getloadavg()[0]
    if busy > 0.5:  # OpenMP threads that share their cores with another job run several times slower
        log(f"note: the CPU is already busy (load average {busy:.1f} on {os.cpu_count()} cores): steps will be slower")
    save(cfg, run / "train_config.yaml")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    reward_fns = [rewards.load_reward(spec) for spec in cfg.rewards]
    train_set = tasks.load_task(cfg.task, n=cfg.train_size, seed=cfg.seed, split="train",
                                on_error="skip" if cfg.skip_bad_lines else "raise")
    eval_set = evaluate.held_out(cfg)
    model, tok = prepare_model(cfg, log)
    ref = None
    if cfg.beta > 0:  # a frozen copy of the base model for the KL term (before any resume); beta = 0 keeps none
        ref = Sampler(model, dtype=torch.float32).net
    if ckpt is not None:
        model = evaluate.load_weights(model, ckpt)
    autocast = cfg.bf16 and bf16_supported()
    sampler = Sampler(model, dtype=torch.bfloat16 if autocast else torch.float32)
    stops = eos_ids(tok, model)
    pad = tok.pad_token_id
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    opt, sched = make_optimizer(cfg, model)
    step, data_pos = 0, 0
    if ckpt is not None:
        state = checkpoint.load_state(ckpt)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        checkpoint.restore_rng(state["rng"], gen)
        step, data_pos = state["step"], state["data_pos"]
        log(f"resumed from {ckpt} at step {step}")

    # ---------------------------------------------------------------- evaluate the base model
    if eval_set and not (run / "eval_before.jsonl").exists():
        log(f"evaluating the base model on {len(eval_set)} held-out problems ...")
        evaluate.run_eval(sampler, tok, eval_set, cfg, run / "eval_before.jsonl", stops, log)

    stop = StopFlag(log=log)
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    tracker = Tracker(run, log, cfg.steps)
    g = cfg.num_generations
    try:
        while step < cfg.steps and not stop.requested:
            t0 = time.time()
            # ---------------------------------------------------------------- sample
            batch = [train_set[order[(data_pos + i) % len(order)]] for i in range(cfg.prompts_per_step)]
            prompts = encode_prompts(tok, [ex.question for ex in batch], cfg.instruction)
            completions = sampler.generate(prompts, g, cfg.max_new_tokens, stops, pad, cfg.temperature,
                                           cfg.top_k, cfg.top_p, gen)
            t1 = time.time()
            if stop.requested:  # discard this rollout; the last complete step is what gets saved
                break
            # ---------------------------------------------------------------- reward and advantage
            texts = tok.batch_decode(completions, skip_special_tokens=True)
            total, per_fn = score(cfg, reward_fns, texts, batch, [ex.question for ex in batch])
            adv, adv_stats = group_advantages(total, g, cfg.scale_rewards)
            t2 = time.time()
            # ---------------------------------------------------------------- update
            n = len(completions)
            c_tokens = sum(len(c) for c in completions)
            norm = {"num_seqs": n, "num_tokens": max(1, c_tokens), "max_len": cfg.max_new_tokens}
            skip_zero = cfg.beta == 0 and cfg.num_iterations == 1  # zero advantage, zero gradient: skip
            groups = [i for i in range(len(batch)) if not (skip_zero and bool((adv[i * g:(i + 1) * g] == 0).all()))]
            tokens_per_group = max(len(p) for p in prompts) + g * max(len(c) for c in completions)
            mb = cfg.micro_batch_size // g if cfg.micro_batch_size else auto_micro_groups(model, tokens_per_group)
            mb = max(1, mb)
            fixed = {}  # old and reference log-probs, computed once before the updates
            if cfg.num_iterations > 1 or ref is not None:
                with torch.no_grad():
                    for part in micro_batches(groups, mb):
                        if cfg.num_iterations > 1:
                            fixed[tuple(part), "old"] = group_logprobs(model, prompts, completions, part, g, pad,
                                                                       cfg.temperature, autocast)[0]
                        if ref is not None:
                            fixed[tuple(part), "ref"] = group_logprobs(ref, prompts, completions, part, g, pad,
                                                                       cfg.temperature, autocast)[0]
            sums = {"loss": 0.0, "clip_frac_sum": 0.0, "kl_sum": 0.0}
            grad_norm = torch.tensor(0.0)
            for _ in range(cfg.num_iterations):
                opt.zero_grad(set_to_none=True)
                for part in micro_batches(groups, mb):
                    logp, mask = group_logprobs(model, prompts, completions, part, g, pad, cfg.temperature, autocast,
                                                cfg.gradient_checkpointing)
                    rows = [i * g + j for i in part for j in range(g)]
                    loss, st = grpo_loss(logp, fixed.get((tuple(part), "old"), logp.detach()),
                                         fixed.get((tuple(part), "ref")), adv[rows], mask, norm,
                                         cfg.epsilon, cfg.epsilon_high, cfg.beta, cfg.loss_type)
                    loss.backward()
                    sums["loss"] += loss.item() / cfg.num_iterations
                    for k, v in st.items():
                        sums[k] += v / cfg.num_iterations
                if groups:
                    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm or math.inf)
                    opt.step()
            sched.step()
            sampler.refresh()
            step += 1
            data_pos += cfg.prompts_per_step
            t3 = time.time()
            # ---------------------------------------------------------------- log
            record = {
                "step": step, "loss": sums["loss"], "reward": total.mean().item(),
                **{f"reward/{k}": float(torch.tensor(v).nanmean()) for k, v in per_fn.items()},
                "accuracy": sum(rewards.correctness_reward(texts, [ex.answer for ex in batch for _ in range(g)])) / n,
                "kl": sums["kl_sum"] / norm["num_tokens"] if cfg.beta > 0 else math.nan,
                "clip_frac": sums["clip_frac_sum"] / norm["num_tokens"],
                "completion_len": c_tokens / n,
                "truncated_frac": sum(len(c) >= cfg.max_new_tokens for c in completions) / n,
                **adv_stats, "frac_skipped": 1 - len(groups) / len(batch), "grad_norm": float(grad_norm),
                "lr": sched.get_last_lr()[0], "micro_batch_groups": mb,
                "time_rollout": t1 - t0, "time_scoring": t2 - t1, "time_update": t3 - t2, "step_seconds": t3 - t0,
                "rollout_tok_s": c_tokens / max(t1 - t0, 1e-9),
                "train_tok_s": sum(len(prompts[i]) * g + sum(len(c) for c in completions[i * g:(i + 1) * g])
                                   for i in groups) * cfg.num_iterations / max(t3 - t2, 1e-9),
                "peak_rss_mb": peak_rss_mb(), "data_pos": data_pos,
            }
            tracker.log(record)
            _log_groups(run, step, batch, texts, per_fn, total, adv, g)
            if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
                _save(run, step, model, tok, cfg, opt, sched, gen, data_pos)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)
    last = checkpoint.latest(run)
    if step > 0 and (last is None or not last.name.endswith(f"{step:06d}")):
        _save(run, step, model, tok, cfg, opt, sched, gen, data_pos)
    if stop.requested:
        log(f"stopped at step {step}: complete checkpoint in {checkpoint.latest(run)}; "
            "continue with the same command and --resume")
        return run
    # ---------------------------------------------------------------- evaluate the trained model, report
    if eval_set:
        log(f"evaluating the trained model on the same {len(eval_set)} problems ...")
        evaluate.run_eval(sampler, tok, eval_set, cfg, run / "eval_after.jsonl", stops, log)
    evaluate.write_summary(run, cfg, step, time.time() - t_start, log)
    return run


def _save(run, step, model, tok, cfg, opt, sched, gen, data_pos):
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": checkpoint.rng_state(gen),
             "data_pos": data_pos}
    checkpoint.save(run, step, model, tok, cfg, state, keep=cfg.keep_checkpoints)


def _log_groups(run: Path, step, batch, texts, per_fn, total, adv, g):
    """Every group of the step, for inspection: prompt, G completions, rewards per function, advantages."""
    for i, ex in enumerate(batch):
        sl = slice(i * g, (i + 1) * g)
        append_jsonl(run / "groups.jsonl", {
            "step": step, "group": i, "question": ex.question, "answer": ex.answer, "difficulty": ex.difficulty,
            "completions": texts[sl], "rewards": {k: v[sl] for k, v in per_fn.items()},
            "total": total[sl].tolist(), "advantages": [round(a, 4) for a in adv[sl].tolist()],
            "zero_std": float(total[sl].std()) < 1e-6,
        })
