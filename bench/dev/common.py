"""What the dev scripts share: the timer and the 30 layers of SmolLM2-135M MLP weight shapes (weight-streaming
scripts), and the RSS line (memory scripts)."""

import resource
import time

import psutil
import torch

torch.set_num_threads(2)
MLP_SHAPES = [(3072, 576), (576, 1536)] * 30  # fused gate/up and down_proj of each layer


def bench(f, n=10):
    """Seconds per call of f: 3 calls to warm up, then the mean of n."""
    for _ in range(3):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def rss(tag):
    """Print the process's RSS now and its peak so far."""
    now = psutil.Process().memory_info().rss / 2**20
    print(f"{tag}: rss {now:.0f} MB, peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)
