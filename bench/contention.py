"""A run beside other work: step time alone, then beside one and two competing jobs, with the threads chosen in
each way (WAYS: spinning, one per core; a thread per free core; cpu-grpo's own choice; a passive wait, one per
core), against the fair share (k other busy jobs on the cores: k + 1 times the time alone).

    .venv/bin/python bench/contention.py            # `--profile quick`, 3 steps, 48 tokens; each case a new process
    .venv/bin/python bench/contention.py --jobs 0 1 2 --ways before free now     # every way, alone too

A competing job is another 2-thread PyTorch process multiplying matrices without end (as another training would);
started 3 s before the run, killed after it. Each case reports the median step time of steps 2-3 (step 1 warms up).
Run it alone on the machine: the point is what the run does beside the jobs this script starts, nothing else.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = ("import torch\ntorch.set_num_threads(2)\na = torch.randn(768, 768)\n"
       "while True:\n    a = torch.tanh(a @ a)\n")


# an empty OMP_WAIT_POLICY is OpenMP's default and keeps cpu-grpo from choosing the passive wait itself
WAYS = {"before": (2, {"OMP_WAIT_POLICY": ""}), "free": (None, {"OMP_WAIT_POLICY": ""}), "now": (None, {}),
        "passive": (2, {"OMP_WAIT_POLICY": "PASSIVE"})}
NAMES = {"before": "2, one per core, spinning (before 2026-12-03)",
         "free": "a thread per free core (2026-12-03)",
         "now": "cpu-grpo's choice (now: waiting passively on a busy machine)",
         "passive": "2, waiting passively (OMP_WAIT_POLICY=PASSIVE)"}


def step_seconds(threads: int | None, jobs: int, env_extra: dict | None = None) -> float:
    """The median seconds of steps 2.. of a short quick-profile run beside `jobs` competing processes."""
    others = [subprocess.Popen([sys.executable, "-c", JOB]) for _ in range(jobs)]
    try:
        time.sleep(3 if jobs else 0)
        out = Path(tempfile.mkdtemp(prefix="bench_contention_")) / "run"
        cmd = [sys.executable, "-m", "cpu_grpo", "train", "--profile", "quick", "--steps", "3", "--eval-size", "0",
               "--max-new-tokens", "48", "--seed", "0", "--output-dir", str(out)]
        cmd += ["--threads", str(threads)] if threads else []
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (env_extra or {})
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        for line in done.stdout.splitlines():
            if "other work keeps" in line or line.startswith("run:"):
                print(f"    {line.strip()[-110:]}", flush=True)
        steps = [json.loads(line)["step_seconds"] for line in (out / "metrics.jsonl").read_text().splitlines()]
        return statistics.median(steps[1:])
    finally:
        for p in others:
            p.kill()
            p.wait()


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="numbers of competing jobs")
    ap.add_argument("--ways", nargs="+", default=["before", "free", "now"], choices=list(WAYS),
                    help="how threads are set")
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at start", flush=True)
    alone = step_seconds(None, 0)
    print(f"alone: {alone:.1f} s a step", flush=True)
    rows = ["| competing jobs | fair share | threads | seconds a step | x alone | x fair share |",
            "|---:|---:|---|---:|---:|---:|", f"| 0 | 1.0x | a thread per free core | {alone:.1f} | 1.00 | 1.00 |"]
    for jobs in args.jobs:
        for way in args.ways:
            (threads, env), name = WAYS[way], NAMES[way]
            seconds = step_seconds(threads, jobs, env)
            print(f"{jobs} job(s), threads {name}: {seconds:.1f} s a step", flush=True)
            rows.append(f"| {jobs} | {jobs + 1:.1f}x | {name} | {seconds:.1f} | {seconds / alone:.2f} | "
                        f"{seconds / alone / (jobs + 1):.2f} |")
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
