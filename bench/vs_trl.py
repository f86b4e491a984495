"""GRPO on CPU: TRL's GRPOTrainer against ours on the same workload, in one invocation; prints one markdown table.

    .venv-bench/bin/python bench/vs_trl.py                      # TRL "fast" setup vs ours (bench/requirements.txt)
    .venv-bench/bin/python bench/vs_trl.py --trl-setup both --out vs_trl.json
    .venv-bench/bin/python bench/vs_trl.py --workload demo      # the demo's shape: 8 x 8 x 96, temperature 0.7
    .venv-bench/bin/python bench/vs_trl.py --workload lora      # the default profile's model with LoRA (peft)
    .venv-bench/bin/python bench/vs_trl.py --steps 2 --prompts 2 --generations 2 --max-new-tokens 16   # smoke run

Each trainer runs in its own subprocess, so its peak RSS is its own; the child prints its numbers as JSON on its
last stdout line. How the two are made to do the same work:
1. The same model directory (`resolve_model`), fp32 master weights, full fine-tuning (with `--lora`, the
   workload `lora`: LoRA r 16, alpha 32, no dropout, on every linear layer, as peft's LoraConfig in both; each
   trainer loads the base as it does by default), AdamW at a constant learning rate, gradient clipping at 1.0,
   beta 0 (no reference model), loss_type "dapo", group-std advantages, rewards correctness + 0.2 * format (a
   completion cut at the limit scored like any other, as TRL does: `score_truncated`), the workload's temperature
   with top-k and top-p off.
2. The same prompts in every step: TRL gets the problems in the order our loop visits them (train.py's seeded
   randperm) with shuffle_dataset=False; the children report the questions of each step and the output says whether
   they matched.
3. One generation batch per optimizer step in TRL (steps_per_generation=1, no gradient accumulation), as in ours.
Step time runs from a step's start to the end of its optimizer step (TRL: a TrainerCallback's on_step_begin and
on_step_end; ours: step_seconds in metrics.jsonl). The first `--warmup` steps are left out of every number. Peak RSS
is ru_maxrss at the end of the last step: it leaves out our final checkpoint save, which TRL is told not to do.
Run it on an otherwise idle machine: with another job on the cores the threads of both trainers wait on each other
and the timings say nothing (the script prints the load average it started with).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REWARD_WEIGHTS = [1.0, 0.2]  # correctness_reward, format_reward
SETUPS = {  # --trl-setup: what each TRL setup changes from the shared config
    "fast": {"bf16": True, "gradient_checkpointing": False},
    "default": {"bf16": False, "gradient_checkpointing": True},
}
WORKLOADS = {  # --workload: model, prompts, samples, new tokens, temperature, steps (warm-up included), learning rate
    "default": dict(model="smollm2-135m", prompts=4, generations=8, max_new_tokens=128, temperature=1.0, steps=4,
                    learning_rate=1e-6),
    # like `cpu-grpo demo`: a learning rate that learns, so groups whose rewards are all equal occur as in training
    # (ours skips them in the update, TRL runs them)
    "demo": dict(model="smollm2-135m", prompts=8, generations=8, max_new_tokens=96, temperature=0.7, steps=11,
                 learning_rate=2e-5),
    # the default profile's model and method: Qwen2.5-Coder-0.5B with LoRA at its learning rate (issue 49)
    "lora": dict(model="qwen2.5-coder-0.5b", lora=True, prompts=4, generations=8, max_new_tokens=128,
                 temperature=1.0, steps=3, learning_rate=1e-4),
}
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
SETUP_TEXT = {"fast": "fast: bf16 autocast, no grad ckpt", "default": "default: fp32, grad ckpt",
              "ours": "bf16 rollouts + autocast, no grad ckpt",
              "ours-merged": "bf16 rollouts (LoRA merged into a bf16 copy) + autocast, no grad ckpt"}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def log(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def problems_in_our_order(train_size: int):
    """The training problems in the order train.py visits them: a randperm seeded with the run's seed (0)."""
    import torch

    from cpu_grpo.data import tasks

    problems = tasks.generate("basic", train_size, seed=0)
    order = torch.randperm(len(problems), generator=torch.Generator().manual_seed(0)).tolist()
    return [problems[i] for i in order]


# ---------------------------------------------------------------------------------------------------------------
# child: TRL


def trl_config_kwargs(args, out_dir: str) -> dict:
    """Every GRPOConfig field we set; the names are checked against the installed TRL before use."""
    b, g = args.prompts, args.generations
    return {
        "output_dir": out_dir, "use_cpu": True, "seed": 0, "max_steps": args.steps,
        # batch: B prompts x G samples per optimizer step, one generation batch per step
        "per_device_train_batch_size": b * g, "gradient_accumulation_steps": 1, "num_generations": g,
        "steps_per_generation": 1, "shuffle_dataset": False, "dataloader_num_workers": 0,
        # sampling
        "max_completion_length": args.max_new_tokens, "temperature": args.temperature, "top_k": 0, "top_p": 1.0,
        # GRPO loss
        "beta": 0.0, "loss_type": "dapo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": 0.2,
        "num_iterations": 1, "mask_truncated_completions": False, "reward_weights": REWARD_WEIGHTS,
        # optimisation, as ours: AdamW, constant lr, no weight decay, clip 1.0
        "learning_rate": args.learning_rate, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "weight_decay": 0.0, "max_grad_norm": 1.0,
        # precision and memory: the --trl-setup
        **SETUPS[args.setup],
        # no logging backends, no checkpoints, one log record per step
        "report_to": [], "save_strategy": "no", "logging_steps": 1, "log_completions": False, "disable_tqdm": True,
    }


def run_trl(args) -> dict:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from cpu_grpo.config import TrainConfig
    from cpu_grpo.data import rewards
    from cpu_grpo.engine.threads import set_threads

    threads = set_threads(args.threads or None)
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        kwargs = trl_config_kwargs(args, tmp)
        missing = sorted(set(kwargs) - known)
        if missing:
            raise SystemExit(f"GRPOConfig of trl {trl.__version__} has no field(s) {', '.join(missing)}: install "
                             "the version in bench/requirements.txt (trl==1.16.0) or update trl_config_kwargs.")
        config = GRPOConfig(**kwargs)
        instruction = TrainConfig().instruction
        rows = problems_in_our_order(args.train_size)
        dataset = Dataset.from_list([
            {"prompt": [{"role": "user", "content": ex.question + "\n" + instruction}], "answer": ex.answer,
             "question": ex.question} for ex in rows])
        questions: list[list[str]] = []
        correctness = _recording(rewards.correctness_reward, questions)
        timer = _step_timer()
        peft = {}
        if args.lora:
            from peft import LoraConfig

            peft = {"peft_config": LoraConfig(**LORA)}
        trainer = GRPOTrainer(model=args.model, reward_funcs=[correctness, rewards.format_reward], args=config,
                              train_dataset=dataset, callbacks=[timer], **peft)
        trainer.train()
        logs = [r for r in timer.logs if "completions/mean_length" in r]
        resolved = {k: _plain(getattr(config, k)) for k in kwargs if k != "output_dir"}
        derived = ("generation_batch_size", "steps_per_generation", "optim", "bf16", "activation_checkpointing",
                   "activation_checkpointing_kwargs", "adam_beta1", "adam_beta2", "adam_epsilon")
        return {
            "trainer": "trl", "setup": args.setup, "trl_version": trl.__version__,
            "transformers_version": transformers.__version__, "torch_version": torch.__version__, "threads": threads,
            "step_seconds": timer.seconds, "peak_rss_mb_steps": timer.rss[-1] if timer.rss else None,
            "completion_len": [r["completions/mean_length"] for r in logs],
            "completions_per_step": args.prompts * args.generations,
            "reward": [r.get("reward") for r in logs], "questions": questions,
            "frac_zero_std": [r.get("frac_reward_zero_std") for r in logs],
            "frac_skipped": [0.0 for _ in logs],  # TRL runs forward and backward on every group
            "config_set": resolved, "config_derived": {k: _plain(getattr(config, k, None)) for k in derived},
            "model_dtype": str(next(trainer.model.parameters()).dtype), "model_checkpointing": timer.checkpointing,
            "trl_default_bf16": _trl_default_bf16(GRPOConfig),
        }


def _recording(fn, questions: list):
    """`fn` that also records the questions of each call (one call per step); TRL logs it under fn's name."""

    @functools.wraps(fn)
    def reward(completions, **kw):
        questions.append(sorted(set(kw["question"])))
        return fn(completions, **kw)

    return reward


def _plain(value):
    return value if isinstance(value, (bool, int, float, str, list, dict, type(None))) else str(value)


def _trl_default_bf16(config_cls) -> str:
    field = next(f for f in dataclasses.fields(config_cls) if f.name == "bf16")
    return f"bf16 default {field.default!r} (TRL's __post_init__ turns None into `not fp16`, i.e. True)"


def _step_timer():
    """A TrainerCallback: wall time of each optimizer step (on_step_begin .. on_step_end), ru_maxrss after it,
    every log record (on_log), and whether the model trains with activation checkpointing (on_train_begin)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []
            self.rss: list[float] = []
            self.logs: list[dict] = []
            self._t0 = 0.0
            self.checkpointing = None  # whether the model really recomputes activations while training

        def on_train_begin(self, args, state, control, model=None, **kw):
            self.checkpointing = getattr(model, "is_activation_checkpointing", None)

        def on_step_begin(self, args, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self._t0)
            self.rss.append(rss_mb())

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    return StepTimer()


# ---------------------------------------------------------------------------------------------------------------
# child: ours


def run_ours(args) -> dict:
    import torch

    from cpu_grpo.config import TrainConfig
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train.loop import train

    with tempfile.TemporaryDirectory(prefix="vs_trl_ours_") as tmp:
        cfg = TrainConfig(model=args.model, task="basic", train_size=args.train_size, eval_size=0, steps=args.steps,
                          prompts_per_step=args.prompts, num_generations=args.generations,
                          max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=0, top_p=1.0,
                          learning_rate=args.learning_rate, beta=0.0, loss_type="dapo", scale_rewards="group",
                          rewards=["correctness", "format"], reward_weights=REWARD_WEIGHTS, score_truncated=True,
                          save_every=0, output_dir=str(Path(tmp) / "run"), seed=0, threads=args.threads,
                          use_lora=bool(args.lora), lora_r=LORA["r"], lora_alpha=LORA["lora_alpha"],
                          lora_rollout=args.lora_rollout)
        run = train(cfg, log=log)
        rows = read_jsonl(run / "metrics.jsonl")
        by_step: dict[int, set] = {}
        for g in read_jsonl(run / "groups.jsonl"):
            by_step.setdefault(g["step"], set()).add(g["question"])
    return {
        "trainer": "ours", "setup": "ours-merged" if args.lora and args.lora_rollout == "merged" else "ours",
        "torch_version": torch.__version__, "threads": torch.get_num_threads(),
        "step_seconds": [r["step_seconds"] for r in rows], "peak_rss_mb_steps": rows[-1]["peak_rss_mb"],
        "completion_len": [r["completion_len"] for r in rows], "completions_per_step": args.prompts * args.generations,
        "reward": [r["reward"] for r in rows], "questions": [sorted(by_step[s]) for s in sorted(by_step)],
        "frac_zero_std": [r["frac_zero_std"] for r in rows], "frac_skipped": [r["frac_skipped"] for r in rows],
        "rollout_tok_s": [r["rollout_tok_s"] for r in rows], "train_tok_s": [r["train_tok_s"] for r in rows],
        "config_set": cfg.to_dict(),
    }


def child_main(args) -> None:
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON line
        result = run_trl(args) if args.child == "trl" else run_ours(args)
    result["peak_rss_mb_exit"] = rss_mb()
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------------------------------------------------------
# parent: run the children, summarise, print


def run_child(args, which: str, setup: str) -> dict | None:
    cmd = [sys.executable, __file__, "--child", which, "--setup", setup, "--model", args.model,
           "--prompts", str(args.prompts), "--generations", str(args.generations),
           "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature),
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--learning-rate", str(args.learning_rate), "--train-size", str(args.train_size),
           "--threads", str(args.threads), "--lora-rollout", args.lora_rollout, *(["--lora"] if args.lora else [])]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    log(f"\n==== {which} ({setup}) ====")
    t0 = time.time()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        log(f"{which} ({setup}) failed with exit code {done.returncode}: its output is above.")
        return None
    result = json.loads(lines[-1])
    result["wall_seconds"] = time.time() - t0
    return result


def summarise(r: dict, warmup: int) -> dict:
    """Numbers of the measured steps (after the warm-up): median s/step, completion tok/s, means."""
    secs = r["step_seconds"][warmup:]
    lens = r["completion_len"][warmup:]
    tokens = [x * r["completions_per_step"] for x in lens]
    return {
        "trainer": r["trainer"], "setup": r["setup"], "measured_steps": len(secs),
        "s_per_step": statistics.median(secs), "completion_tok_s": sum(tokens) / sum(secs),
        "peak_rss_mb": r["peak_rss_mb_steps"], "completion_len": statistics.fmean(lens),
        "reward": statistics.fmean(x for x in r["reward"][warmup:] if x is not None),
        "frac_zero_std": _mean(r.get("frac_zero_std", [])[warmup:]),
        "frac_skipped": _mean(r.get("frac_skipped", [])[warmup:]),
    }


def _mean(values: list) -> float:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else float("nan")


def table(rows: list[dict], trl_version: str) -> str:
    out = ["| trainer | setup | s/step (median) | completion tok/s | peak RSS MB | mean completion length "
           "| reward mean | groups all-equal | groups skipped |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in rows:
        name = "cpu_grpo (ours)" if s["trainer"] == "ours" else f"TRL {trl_version}"
        out.append(f"| {name} | {SETUP_TEXT[s['setup']]} | {s['s_per_step']:.2f} | {s['completion_tok_s']:.1f} | "
                   f"{s['peak_rss_mb']:.0f} | {s['completion_len']:.1f} | {s['reward']:.3f} | "
                   f"{s['frac_zero_std']:.0%} | {s['frac_skipped']:.0%} |")
    return "\n".join(out)


def print_trl_config(r: dict) -> None:
    print(f"TRL {r['trl_version']} (transformers {r['transformers_version']}, torch {r['torch_version']}, "
          f"{r['threads']} threads); GRPOConfig fields set for setup '{r['setup']}', all checked to exist in "
          "GRPOConfig (value after GRPOConfig.__post_init__):")
    for k, v in r["config_set"].items():
        print(f"  {k} = {v!r}")
    print("  derived by TRL: " + ", ".join(f"{k}={v!r}" for k, v in r["config_derived"].items()))
    print(f"  policy weights {r['model_dtype']}, activation checkpointing on the model during training: "
          f"{r['model_checkpointing']}; note: {r['trl_default_bf16']}")


def same_prompts(results: list[dict]) -> bool:
    return all(r["questions"] == results[0]["questions"] for r in results[1:])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="alias, local HF directory or hub id (resolve_model); default: the workload's")
    p.add_argument("--lora", action="store_true", default=None, help="LoRA (r 16) instead of full fine-tuning")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="default",
                   help="the shape of the steps; the options below change it")
    p.add_argument("--prompts", type=int, help="prompts per step (B)")
    p.add_argument("--generations", type=int, help="samples per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, help="completion length limit")
    p.add_argument("--temperature", type=float, help="sampling temperature")
    p.add_argument("--steps", type=int, help="optimizer steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=1, help="first steps left out of the numbers")
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--train-size", type=int, default=0, help="basic problems generated (seed 0; 0: steps x prompts, "
                                                              "at least 64)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in both children (0: one per physical core)")
    p.add_argument("--trl-setup", choices=["fast", "default", "both"], default="fast",
                   help="fast: bf16, no gradient checkpointing; default: fp32, gradient checkpointing")
    p.add_argument("--lora-rollout", choices=["unmerged", "merged"], default="unmerged",
                   help="ours, with --lora: how rollouts apply the adapters (the config field lora_rollout)")
    p.add_argument("--out", help="also write the raw numbers to this JSON file")
    p.add_argument("--child", choices=["trl", "ours"], help=argparse.SUPPRESS)
    p.add_argument("--setup", default="fast", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for k, v in WORKLOADS[args.workload].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.lora = bool(args.lora)
    args.train_size = args.train_size or max(64, args.steps * args.prompts)
    if args.steps <= args.warmup or args.warmup < 0:
        p.error(f"--steps ({args.steps}) must be larger than --warmup ({args.warmup}): some steps must be measured")
    if args.lora_rollout == "merged" and not args.lora:
        p.error("--lora-rollout merged merges LoRA adapters: add --lora (or --workload lora)")
    if args.prompts < 1 or args.generations < 2:
        p.error("--prompts must be >= 1 and --generations >= 2 (GRPO compares samples within a group)")
    if args.steps * args.prompts > args.train_size:
        p.error(f"--train-size must be at least --steps x --prompts ({args.steps * args.prompts}): no prompt repeats")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return 0
    import importlib.util

    from cpu_grpo.engine.models import ModelError, resolve_model

    if importlib.util.find_spec("trl") is None:
        raise SystemExit(f"trl is not installed for {sys.executable}: run this with the bench venv, made as "
                         "bench/requirements.txt says (.venv-bench/bin/python bench/vs_trl.py).")
    try:
        args.model = resolve_model(args.model, log=log)
    except ModelError as e:
        raise SystemExit(str(e)) from None
    load = os.getloadavg()[0]
    setups = ["fast", "default"] if args.trl_setup == "both" else [args.trl_setup]
    results = [run_child(args, "trl", s) for s in setups] + [run_child(args, "ours", "ours")]
    ok = [r for r in results if r is not None]
    rows = [summarise(r, args.warmup) for r in ok]
    trl_runs = [r for r in ok if r["trainer"] == "trl"]
    trl_version = trl_runs[0]["trl_version"] if trl_runs else "?"
    print(f"\nGRPO on CPU, workload {args.workload}: {args.prompts} prompts x {args.generations} samples, <= "
          f"{args.max_new_tokens} new tokens, temperature {args.temperature}, lr {args.learning_rate}, {args.steps} "
          f"steps ({args.warmup} warm-up left out), model {args.model}{' with LoRA r 16' if args.lora else ''}")
    print(f"load average (1 min) before the runs: {load:.2f} on {os.cpu_count()} CPUs"
          + ("  WARNING: something else is using the CPU, the timings are not comparable" if load > 0.5 else ""))
    print()
    for r in trl_runs:
        print_trl_config(r)
        print()
    print(table(rows, trl_version))
    if len(ok) > 1:
        print(f"\nsame prompts in every step for all trainers: {'yes' if same_prompts(ok) else 'NO'}")
    ours = next((s for s in rows if s["trainer"] == "ours"), None)
    for s in rows:
        if ours and s["trainer"] == "trl":
            print(f"ours vs TRL {s['setup']}: {s['s_per_step'] / ours['s_per_step']:.2f}x steps/s, "
                  f"{ours['completion_tok_s'] / s['completion_tok_s']:.2f}x completion tok/s, "
                  f"{ours['peak_rss_mb'] / s['peak_rss_mb']:.2f}x peak RSS")
    ref = next((s for s in rows if s["trainer"] == "trl" and s["setup"] == "fast"), None)
    ref = ref or next((s for s in rows if s["trainer"] == "trl"), None)
    speed = ref["s_per_step"] / ours["s_per_step"] if ours and ref else float("nan")
    memory = ours["peak_rss_mb"] / ref["peak_rss_mb"] if ours and ref else float("nan")
    if args.out:
        raw = {"args": vars(args), "load_average_before": load, "results": ok, "summary": rows,
               "speedup_vs_trl": speed, "memory_vs_trl": memory}
        Path(args.out).write_text(json.dumps(raw, indent=1))
    if ref and ref["setup"] != "fast":
        print(f"(the last line compares with TRL {ref['setup']}: the fast setup was not run)")
    print(f"speedup_vs_trl: {speed:.2f} memory_vs_trl: {memory:.2f}")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
