"""Seed scale (issue 3): GRPO steps on a 0.5B Qwen2-architecture model, 4 prompts x 4 samples x 256 new tokens.

    .venv/bin/python bench/seed_scale.py --model "$(../shared/models/fetch.sh qwen-0.5b)"
    .venv/bin/python bench/seed_scale.py --model DIR_OR_GGUF --setups lora full --steps 3

Each setup runs the training loop (`train()`) in its own process, so its peak RSS is its own: `lora` (adapters
r=16 on every linear layer, the frozen base in bf16) and `full` (every weight, fp32 masters and AdamW state).
Every completion runs to the full 256 tokens (end-of-sequence tokens are not stops here: the worst case for time
and memory, and what "4 x 4 x 256" means), and the reward is a seeded pseudo-random number per completion, scored
although every completion is cut at the limit (`score_truncated`; a run's default scores a cut completion 0, which
made every group all-equal and skipped, and the update 0 s), so no group is skipped for zero variance and every
step runs a full update. The first step is left out of the s/step
median. Prints one markdown table. Run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path


def varied_reward(completions, **kwargs) -> list[float]:
    """A pseudo-random reward in [0, 1) from each completion's text: variance in every group."""
    return [(zlib.crc32(str(c).encode()) % 1000) / 1000 for c in completions]


def child(args) -> dict:
    from cpu_grpo.config import TrainConfig
    from cpu_grpo.rundir import read_jsonl
    from cpu_grpo.train import runstate
    from cpu_grpo.train.loop import train

    runstate.stop_ids = lambda tok, model: []  # no stop token: every completion has max_new_tokens
    with tempfile.TemporaryDirectory(prefix="seed_scale_") as tmp:
        cfg = TrainConfig(model=args.model, task="basic", train_size=64, eval_size=0, steps=args.steps,
                          prompts_per_step=4, num_generations=4, max_new_tokens=256, learning_rate=1e-6,
                          rewards=[f"{Path(__file__).resolve()}:varied_reward"], reward_weights=[1.0],
                          use_lora=args.child == "lora", save_every=0, score_truncated=True,
                          output_dir=str(Path(tmp) / "run"), seed=0)
        rows = read_jsonl(train(cfg, log=lambda *a: print(*a, file=sys.stderr)) / "metrics.jsonl")
    return {"setup": args.child, "rows": [{k: r[k] for k in ("step_seconds", "time_rollout", "time_update",
                                                               "completion_len", "rollout_tok_s", "peak_rss_mb")}
                                          for r in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a .gguf file or HF directory of a 0.5B Qwen2-architecture model")
    ap.add_argument("--setups", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--child", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with contextlib.redirect_stdout(sys.stderr):
            result = child(args)
        print(json.dumps(result))
        return
    from cpu_grpo.engine.models import resolve_model

    model = resolve_model(args.model, log=lambda *a: print(*a, file=sys.stderr))  # convert once, before the children
    print("| setup | s/step (median) | rollout s | update s | completion tokens | completion tok/s | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for setup in args.setups:
        done = subprocess.run([sys.executable, __file__, "--child", setup, "--model", model, "--steps",
                               str(args.steps)], stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            print(f"| {setup} | failed (exit code {done.returncode}) | | | | | |")
            continue
        rows = json.loads(done.stdout.splitlines()[-1])["rows"][1:] or json.loads(done.stdout.splitlines()[-1])["rows"]
        med = statistics.median
        print(f"| {setup} | {med(r['step_seconds'] for r in rows):.1f} | {med(r['time_rollout'] for r in rows):.1f} | "
              f"{med(r['time_update'] for r in rows):.1f} | {med(16 * r['completion_len'] for r in rows):.0f} | "
              f"{med(r['rollout_tok_s'] for r in rows):.0f} | {max(r['peak_rss_mb'] for r in rows):.0f} |", flush=True)


if __name__ == "__main__":
    main()
