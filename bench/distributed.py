"""Data parallel on torch.distributed: what it costs here, and a projection past one machine.

    .venv/bin/python bench/distributed.py compare [--steps 6]   # 1 process x 2 threads vs 2 processes x 1 thread
    .venv/bin/python bench/distributed.py allreduce              # gradient all-reduce over loopback, 2 ranks (gloo)
    .venv/bin/python bench/distributed.py project STEP_JSON      # steps/s for 2-16 machines at 1/10/25 Gbit/s

`compare` trains the same workload twice with `cpu-grpo train` (SmolLM2-135M, full fine-tuning, 8 prompts x 8
samples, 96 tokens, the demo's settings, eval off) and reads the runs' metrics.jsonl: seconds per step, rollout,
update, and time in collectives (`time_comm`: transfers and waiting for the slower rank). Run it alone.
`allreduce` times the one all-reduce of a step (a flat fp32 buffer of every trainable parameter, as
World.sum_grads sends it) for SmolLM2-135M full, Qwen2.5-0.5B LoRA r=16 (every linear) and Qwen2.5-0.5B full.
`project` combines them: a step on N machines takes compute / N + ring all-reduce(N, bandwidth) (a model, with
the assumptions printed beside the table; not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOAD = ["--profile", "demo", "--model", "smollm2-135m", "--prompts-per-step", "8", "--num-generations", "8",
            "--max-new-tokens", "96", "--eval-size", "0", "--save-every", "0", "--task", "basic", "--seed", "0"]
MODELS = {  # trainable parameters, from each model's config (counted in `params`)
    "SmolLM2-135M full": ("smollm2-135m", False),
    "Qwen2.5-0.5B LoRA r=16": ("qwen2.5-coder-0.5b", True),
    "Qwen2.5-0.5B full": ("qwen2.5-coder-0.5b", False),
}


def compare(steps: int) -> None:
    rows = []
    for label, extra in (("1 process x 2 threads", []), ("2 processes x 1 thread", ["--nproc", "2"])):
        out = Path(tempfile.mkdtemp(prefix="dist-bench-"))
        t0 = time.time()
        subprocess.run([sys.executable, "-m", "cpu_grpo", "train", *WORKLOAD, "--steps", str(steps), "--output-dir",
                        str(out / "run"), *extra], check=True, stdout=subprocess.DEVNULL)
        wall = time.time() - t0
        metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()][1:]
        mean = {k: statistics.mean(m.get(k, 0.0) for m in metrics)
                for k in ("step_seconds", "time_rollout", "time_update", "time_comm", "frac_skipped", "peak_rss_mb")}
        rows.append((label, mean, wall))
    print(f"| setup | s/step (steps 2-{steps}) | rollout | update | in collectives | groups skipped | peak RSS "
          "(rank 0) | wall |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, m, wall in rows:
        print(f"| {label} | {m['step_seconds']:.1f} | {m['time_rollout']:.1f} | {m['time_update']:.1f} | "
              f"{m['time_comm']:.2f} | {m['frac_skipped']:.2f} | {m['peak_rss_mb'] / 1024:.2f} GB | {wall:.0f} s |")


def params(alias: str, lora: bool) -> int:
    """Trainable parameters, from the model's config alone (no weights loaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from cpu_grpo.engine.models import resolve_model

    c = AutoConfig.from_pretrained(resolve_model(alias, log=lambda *a: None))
    if not lora:
        with torch.device("meta"):
            return sum(p.numel() for p in AutoModelForCausalLM.from_config(c).parameters())
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    h, q, kv, f = c.hidden_size, c.num_attention_heads * d, c.num_key_value_heads * d, c.intermediate_size
    shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]  # (in, out) of every linear of a layer
    return c.num_hidden_layers * sum(16 * (i + o) for i, o in shapes)


def _allreduce_rank(rank: int, numel: int, reps: int, init: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    flat = torch.ones(numel)
    times = []
    for _ in range(reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times[1:]))
    dist.destroy_process_group()


def allreduce(reps: int) -> dict:
    import torch.multiprocessing as mp

    result = {}
    print("| trainable parameters | fp32 MB | all-reduce over loopback, 2 ranks (median of "
          f"{reps}) | effective GB/s |\n|---|---:|---:|---:|")
    for label, (alias, lora) in MODELS.items():
        n = params(alias, lora)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "times.json")
            mp.start_processes(_allreduce_rank, args=(n, reps, f"file://{tmp}/init", out), nprocs=2,
                               start_method="spawn")
            t = statistics.median(json.loads(Path(out).read_text()))
        result[label] = {"params": n, "seconds": t}
        print(f"| {label}: {n / 1e6:.1f} M | {4 * n / 2**20:.0f} | {t:.3f} s | {4 * n / t / 1e9:.2f} |")
    return result


SEGMENT = 1 << 20  # gloo's ring all-reduce moves at most 1 MiB a message, two in flight (gloo/allreduce.h)


def ring_seconds(numel: int, hosts: int, gbit: float, latency_s: float = 50e-6) -> float:
    """gloo's ring all-reduce of `numel` fp32 values over N hosts: each host sends 2 (N-1)/N x the buffer, in
    segments of at most 1 MiB (at least two a host), two in flight, each sent once its receiver says it is ready. A
    segment takes its time on the wire and a one-way latency for that notice; with three hosts or more, the two in
    flight hide half the wire time (the notices travel on another connection than the data); with two, the notices
    queue behind the data on the one connection, and nothing is hidden. Fitted to, and checked on, the all-reduce
    across simulated hosts at 5 and 20 ms (bench/README.md); the model before charged 2 (N-1) latencies in all,
    which is 3x short at 20 ms."""
    total = 4 * numel
    segments = -(-max(-(-total // SEGMENT), 2 * hosts) // hosts) * hosts
    wire = total / segments / (gbit * 1e9 / 8)
    each = latency_s + wire if hosts == 2 else max(wire, latency_s + wire / 2)
    return 2 * (hosts - 1) / hosts * segments * each


def project(step: dict, latency_s: float = 50e-6) -> None:
    """step: {label: {"params": n, "compute_seconds": s}}; prints steps/min for N machines and bandwidths."""
    print("| workload | one machine s/step | N | 1 Gbit/s | 10 Gbit/s | 25 Gbit/s |\n|---|---:|---:|---:|---:|---:|")
    for label, w in step.items():
        for n in (2, 4, 8, 16):
            cells = []
            for gbit in (1, 10, 25):
                comm = ring_seconds(w["params"], n, gbit, latency_s)
                total = w["compute_seconds"] / n + comm
                cells.append(f"{total:.1f} s ({w['compute_seconds'] / total:.1f}x, comm {comm / total:.0%})")
            print(f"| {label} | {w['compute_seconds']:.1f} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["compare", "allreduce", "project"])
    ap.add_argument("step_json", nargs="?", help="project: {label: {params, compute_seconds}}")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--latency-ms", type=float, default=0.05, help="project: one-way latency between machines")
    a = ap.parse_args()
    if a.what == "compare":
        compare(a.steps)
    elif a.what == "allreduce":
        allreduce(a.reps)
    else:
        project(json.loads(Path(a.step_json).read_text()), a.latency_ms / 1000)
