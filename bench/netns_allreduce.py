"""The gradient all-reduce across simulated hosts (bench/netns.sh), against the projection of bench/distributed.py.

    sudo .venv/bin/python bench/netns_allreduce.py sweep --out results.jsonl   # every link x hosts below
    .venv/bin/python bench/netns_allreduce.py table results.jsonl              # measured vs projected
    bench/netns.sh --hosts 2 --rate 1gbit -- bench/netns_allreduce.py rank     # one setup (what sweep runs)

`rank` runs on each host under torchrun: one flat fp32 buffer per workload, as World.sum_grads sends it, summed
with gloo; one untimed all-reduce, then --reps timed ones (each after a barrier; a repeat's time is the slowest
rank's). It also counts the bytes the host's link sent (tx_bytes of its veth). Rank 0 appends one JSON line per
workload to --out. The workloads' sizes are the trainable parameters the trainer sums, from the models' configs:
SmolLM2-135M trained in full (the demo's model) and Qwen2.5-Coder-0.5B with LoRA r=16 on every linear (the
default profile's). The hosts share this machine's CPU: the time is that of the transfers only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from distributed import ring_seconds  # the projection's model (bench/distributed.py)

LINKS = ["1gbit", "10gbit", "1gbit+5ms", "1gbit+20ms"]  # rate[+one-way delay]
HOSTS = [2, 3, 4]
LATENCY_S = 50e-6  # the projection's one-way latency of a LAN (bench/distributed.py project)


def workloads() -> dict[str, int]:
    """Trainable parameters of the two workloads, from the models' config.json values (as machine.planner.Shapes
    counts them; written out here so that the hosts need not import the package)."""
    # hidden, ffn, layers, heads, kv heads, head dim, vocab
    smol, qwen = (576, 1536, 30, 9, 3, 64, 49152), (896, 4864, 24, 14, 2, 64, 151936)

    def linears(h, f, _, heads, kv, d, __):  # (in, out) of every linear of a layer
        return [(h, heads * d), (h, kv * d), (h, kv * d), (heads * d, h), (h, f), (h, f), (f, h)]

    h, f, layers, _, _, _, vocab = smol
    full = layers * (sum(i * o for i, o in linears(*smol)) + 2 * h) + vocab * h + h  # 2 norms a layer; tied
    lora = qwen[2] * sum(16 * (i + o) for i, o in linears(*qwen))  # r=16 on every linear
    return {"SmolLM2-135M full": full, "Qwen2.5-0.5B LoRA r=16": lora}


def rank(reps: int, out: str, label: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    me, n = dist.get_rank(), dist.get_world_size()
    tx = Path(f"/sys/class/net/{os.environ.get('GLOO_SOCKET_IFNAME', 'lo')}/statistics/tx_bytes")
    for name, numel in workloads().items():
        flat = torch.ones(numel)
        dist.all_reduce(flat)  # connections and buffers set up
        times, sent0 = [], int(tx.read_text())
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - t0)
        sent = (int(tx.read_text()) - sent0) / reps  # barriers add a few hundred bytes
        rows = [None] * n
        dist.all_gather_object(rows, (times, sent))
        if me == 0:
            slowest = [max(r[0][i] for r in rows) for i in range(reps)]
            line = dict(link=label, hosts=n, workload=name, params=numel, bytes=4 * numel, seconds=slowest,
                        median=statistics.median(slowest), sent_per_host=statistics.mean(r[1] for r in rows))
            with open(out, "a") as f:
                f.write(json.dumps(line) + "\n")
            print(json.dumps(line), flush=True)
        del flat
    dist.destroy_process_group()


def sweep(out: str, reps: int, links: list[str], hosts_list: list[int]) -> None:
    netns = Path(__file__).with_name("netns.sh")
    for link in links:
        rate, _, delay = link.partition("+")
        for hosts in hosts_list:
            label = rate + (f" +{delay}" if delay else "")
            cmd = [str(netns), "--hosts", str(hosts), "--rate", rate, "--threads", "1", "--timeout", "600"]
            cmd += ["--delay", delay] if delay else []
            cmd += ["--", __file__, "rank", "--reps", str(reps), "--out", out, "--label", label]
            print("+", " ".join(cmd), flush=True)
            if subprocess.run(cmd).returncode != 0:
                print(f"netns_allreduce: {label} x {hosts} hosts failed", file=sys.stderr)


# seconds a step on one machine (docs/distributed.md, measured on the 2-core build machine): the demo's SmolLM2-135M
# full training, 8 prompts x 8 x 96 tokens; the default profile's Qwen LoRA, 4 x 8 x 256 (run default-4-16-20-seed0)
STEP = {"SmolLM2-135M full": 33.7, "Qwen2.5-0.5B LoRA r=16": 140.0}


def table(path: str, gbit: dict[str, float]) -> None:
    """Measured against projected: the all-reduce, and its share of a step whose compute divides over the hosts."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    print("| link | hosts | workload | fp32 MB | sent per host MB | all-reduce s, measured (median; min-max) | "
          "projected s | measured / projected | share of a step, measured (projected) |\n"
          "|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rate, _, delay = r["link"].partition(" +")
        latency = float(delay.removesuffix("ms")) / 1000 if delay else LATENCY_S
        n, p, m = r["hosts"], ring_seconds(r["params"], r["hosts"], gbit[rate], latency), r["median"]
        compute = STEP[r["workload"]] / n
        print(f"| {r['link']} | {n} | {r['workload']} | {r['bytes'] / 1e6:.0f} | {r['sent_per_host'] / 1e6:.0f} | "
              f"{m:.3f} ({min(r['seconds']):.3f}-{max(r['seconds']):.3f}) | {p:.3f} | {m / p:.2f} | "
              f"{m / (compute + m):.1%} ({p / (compute + p):.1%}) |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["rank", "sweep", "table"])
    ap.add_argument("path", nargs="?", help="table: the JSON lines that sweep wrote")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="netns_allreduce.jsonl")
    ap.add_argument("--label", default="", help="rank: the link, as the table names it")
    ap.add_argument("--links", nargs="+", default=LINKS, help="sweep: rate[+one-way delay] (default: %(default)s)")
    ap.add_argument("--hosts", nargs="+", type=int, default=HOSTS, help="sweep: host counts")
    a = ap.parse_args()
    if a.what == "rank":
        rank(a.reps, a.out, a.label)
    elif a.what == "sweep":
        sweep(os.path.abspath(a.out), a.reps, a.links, a.hosts)
    else:
        table(a.path, {"1gbit": 1.0, "10gbit": 10.0})
