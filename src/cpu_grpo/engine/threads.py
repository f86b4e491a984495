"""How many threads PyTorch runs, and how they wait: one per physical core; on a machine other work keeps busy,
OpenMP threads that sleep while they wait (OMP_WAIT_POLICY=PASSIVE, chosen before torch loads), else one per core
that other work leaves free."""

from __future__ import annotations

import os


def busy_cores(seconds: float = 0.2) -> float:
    """How many cores other processes keep busy now: the machine's CPU time over `seconds`, less this process's."""
    import time

    import psutil

    me = psutil.Process()
    before = me.cpu_times()
    psutil.cpu_percent(None)
    time.sleep(seconds)
    everyone = psutil.cpu_percent(None) / 100 * (psutil.cpu_count() or 1)
    after = me.cpu_times()
    mine = (after.user + after.system - before.user - before.system) / seconds
    return max(0.0, everyone - mine)


PASSIVE = "PASSIVE"


def waits_passively() -> bool:
    """Whether PyTorch's OpenMP threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE, set by the user or by
    wait_passively_when_busy)."""
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == PASSIVE


def wait_passively_when_busy() -> bool:
    """Before torch loads (OpenMP reads its environment once): when other work keeps a core busy, let PyTorch's
    OpenMP threads sleep while they wait instead of spinning, so that a thread per core takes the fair share of a
    busy machine (bench/contention.py, 2026-12-04: beside two 2-thread jobs 1.01x the fair share, against 1.26x with
    a thread per free core, 4.9x spinning). A policy the user set is kept. Returns whether threads wait passively."""
    import sys

    if "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules and busy_cores() >= 0.5:
        os.environ["OMP_WAIT_POLICY"] = PASSIVE
    return waits_passively()


def set_threads(n: int | None = None, ranks_here: int = 1, log=None) -> int:
    """Use one thread per physical core (hyper-threads slow matmuls down), shared out among the `ranks_here`
    processes of a data-parallel run on this machine, and, for a single process, only the cores other work leaves
    free: OpenMP threads that spin on a core another busy process shares wait on each other (three 2-thread jobs on 2
    cores ran a demo step 15x slower, not 3x). Threads that wait passively (OMP_WAIT_POLICY=PASSIVE:
    wait_passively_when_busy) keep a thread per core. `log` hears the choice when other work is there. Returns the
    count."""
    import psutil
    import torch

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    cores = max(1, physical // max(1, ranks_here))
    if n is None and ranks_here == 1:
        taken = busy_cores() * physical / (psutil.cpu_count() or physical)  # in physical cores
        passive = waits_passively()
        n = cores if passive else max(1, min(cores, round(cores - taken)))
        if passive and taken >= 0.5 and log is not None:
            log(f"note: other work keeps {taken:.1f} of {cores} cores busy: {n} thread{'s' if n > 1 else ''} that "
                "sleep while they wait (OMP_WAIT_POLICY=PASSIVE; --threads N to choose)")
        elif n < cores and log is not None:
            log(f"note: other work keeps {taken:.1f} of {cores} cores busy: {n} thread{'s' if n > 1 else ''} (a "
                "thread per free core; --threads N to choose)")
    n = n or cores
    torch.set_num_threads(n)
    return n
