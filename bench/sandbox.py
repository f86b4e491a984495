"""The code sandbox's cost: milliseconds per completion, and its share of a GRPO step on the code task.

    .venv/bin/python bench/sandbox.py                 # 64 completions, then 2 steps of the demo model on `code`

`--src DIR` measures another checkout's package (its src/ folder), for a before/after in one run.

Part 1 runs 64 solutions of the generated code task (half right, half wrong) through `code_reward`, one worker and
the default pool, and prints ms per completion. Part 2 trains the demo model (SmolLM2-135M) 2 steps on the code task
with the `code` reward (4 prompts x 8 samples, 128 tokens) and prints each step's scoring seconds (the sandbox, for
this reward) against its step seconds, from metrics.jsonl. Run it alone on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def per_completion(n: int = 64) -> list[str]:
    from cpu_grpo.data import generated, sandbox

    rows = generated.generate_task("code", n, seed=0, split="train")
    right = {"add_k": "def add_k(xs):\n    return [x + {k} for x in xs]"}
    pairs = []
    for i, ex in enumerate(rows):
        solution = "def f(*a):\n    return None"
        if i % 2 == 0 and ex.template in right:
            k = ex.question.split("with ")[1].split(" added")[0]
            solution = right[ex.template].format(k=k)
        pairs.append((solution, ex.columns["tests"]))
    iso = sandbox.isolation()
    lines = [iso.line() if hasattr(iso, "line") else f"isolation: {' '.join(iso) or 'none (no unshare here)'}"]
    for workers in (1, None):
        t = time.perf_counter()
        results = sandbox.run_many(pairs, workers=workers)
        ms = 1000 * (time.perf_counter() - t) / n
        lines.append(f"{n} completions, workers {workers or 'default'}: {ms:.1f} ms each "
                     f"({sum(r.passed for r in results)} passed)")
    return lines


def step_share(steps: int) -> list[str]:
    from cpu_grpo import config
    from cpu_grpo.train.loop import train

    out = Path(tempfile.mkdtemp(prefix="bench_sandbox_")) / "run"
    cfg = config.build("demo", None, dict(task="code", rewards=["code"], reward_weights=[1.0], steps=steps,
                                          prompts_per_step=4, num_generations=8, max_new_tokens=128, eval_size=0,
                                          output_dir=str(out)))
    train(cfg, log=lambda *a: None)
    lines = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        lines.append(f"step {m['step']}: scoring {m['time_scoring']:.2f} s of {m['step_seconds']:.1f} s "
                     f"({100 * m['time_scoring'] / m['step_seconds']:.1f}%), reward {m['reward']:.2f}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2, help="training steps of part 2 (0: part 1 only)")
    p.add_argument("--src", default=None, help="import cpu_grpo from this src/ folder (another checkout)")
    args = p.parse_args()
    if args.src:
        sys.path.insert(0, args.src)
    print(f"load average {os.getloadavg()[0]:.2f} at start, {time.strftime('%Y-%m-%d %H:%M')}")
    print("\n".join(per_completion()))
    if args.steps:
        print("\n".join(step_share(args.steps)))


if __name__ == "__main__":
    main()
