"""The memory allocator a training process runs with.

glibc's malloc keeps much of what a training step frees, so a run's memory grows step after step (the demo: 3.4 GB
after step 1, 6.2 GB after step 12, as shipped before 2026-11-25); jemalloc with its default decay hands it back and
stays at the step's working set (3.8 GB flat from step 4), at the same speed (bench/README.md, the allocator). An
allocator is chosen when a process starts, so `cpu-grpo train` starts itself again once, with jemalloc preloaded,
where the system has it (Debian and Ubuntu: `apt-get install libjemalloc2`). Without it, glibc is told to keep
freed memory for reuse instead of returning every large block (`keep_freed_memory`).
"""

import ctypes
import ctypes.util
import glob
import os
import resource
import sys
from pathlib import Path

from ..errors import UserError

INSTALL = "apt-get install libjemalloc2 (Debian, Ubuntu) or dnf install jemalloc (Fedora)"
_RESTARTED = "CPU_GRPO_ALLOCATOR_RESTARTED"  # set on the restart, so that a preload that fails cannot loop
_PLACES = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def find_jemalloc() -> str | None:
    """The path of the system's libjemalloc, or None."""
    for place in (os.path.join(sys.prefix, "lib"), *_PLACES):
        found = sorted(glob.glob(os.path.join(place, "libjemalloc.so*")))
        if found:
            return found[-1]
    return None


def loaded() -> str:
    """The allocator this process runs with: "jemalloc" where it is mapped, else "glibc"."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    return "jemalloc" if "libjemalloc" in maps else "glibc"


def restart_with(choice: str, argv: list[str]) -> None:
    """Start this `python -m cpu_grpo <argv>` process again with jemalloc preloaded, if `choice` wants it and the
    system has it; return where nothing is to be done. The process keeps its pid, environment, files and
    directory."""
    if choice == "glibc" or loaded() == "jemalloc" or os.environ.get(_RESTARTED) or sys.platform != "linux":
        return
    path = find_jemalloc()
    if path is None:
        if choice == "jemalloc":
            raise UserError(f"allocator: jemalloc, but this machine has no libjemalloc: {INSTALL}, or use "
                            "allocator: auto.")
        return
    env = dict(os.environ, LD_PRELOAD=" ".join(filter(None, [path, os.environ.get("LD_PRELOAD")])), **{_RESTARTED: "1"})
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "cpu_grpo", *argv], env)


def setup(choice: str) -> str:
    """Make the most of the allocator this process runs with, and name it."""
    now = loaded()
    if now == "glibc":
        if choice == "jemalloc":
            preload = find_jemalloc() or "libjemalloc.so.2"
            raise UserError("allocator: jemalloc, but this process was not started with it: run `cpu-grpo train`, "
                            f"which restarts itself with it, or start Python with LD_PRELOAD={preload}.")
        keep_freed_memory()
    return now


def keep_freed_memory() -> bool:
    """Have glibc serve large tensors from its heap and keep what is freed, instead of one mmap per tensor.

    By default every block over 32 MB is a fresh mmap returned to the system when freed, so each (chunk,
    vocabulary) logits tensor and each full-size gradient of a training pass pays page faults that zero its
    memory again: ~10% of the training pass for SmolLM2-135M here. Returns False where there is no glibc.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30) and libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """Resident memory of this process now, in MB: what it keeps between steps (the peak adds each phase's own)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20
