"""Start-up (issue 3): `cpu-grpo --help`, and from the command to the first rollout with a cached model.

    .venv/bin/python bench/startup.py            # default model (smollm2-135m), converted once beforehand

The first rollout starts when the training loop calls the sampler for step 1: the time from launching
`cpu-grpo demo --steps 1 --eval-size 0` to then is the wall time until its first metrics line is written minus
that step's own seconds (step_seconds runs from the rollout's start). Median of `--reps` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "cpu_grpo.cli"]


def help_seconds() -> float:
    t = time.perf_counter()
    subprocess.run([*CLI, "--help"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def first_rollout_seconds(model: str) -> float:
    out = Path(tempfile.mkdtemp(prefix="startup_"))
    try:
        t = time.time()
        proc = subprocess.Popen([*CLI, "demo", "--model", model, "--steps", "1", "--eval-size", "0",
                                 "--output-dir", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = next(out.rglob("metrics.jsonl"), None)
        while proc.poll() is None and not (metrics and metrics.stat().st_size):
            time.sleep(0.05)
            metrics = metrics or next(out.rglob("metrics.jsonl"), None)
        written = time.time()
        proc.wait()
        row = json.loads(metrics.read_text().splitlines()[0])
        return written - t - row["step_seconds"]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    helps = [help_seconds() for _ in range(args.reps + 1)][1:]
    firsts = [first_rollout_seconds(args.model) for _ in range(args.reps)]
    print("| measure | median s | runs |")
    print("|---|---:|---|")
    print(f"| `cpu-grpo --help` | {statistics.median(helps):.2f} | {', '.join(f'{h:.2f}' for h in helps)} |")
    print(f"| command to first rollout ({args.model}, cached) | {statistics.median(firsts):.1f} | "
          f"{', '.join(f'{f:.1f}' for f in firsts)} |")


if __name__ == "__main__":
    main()
