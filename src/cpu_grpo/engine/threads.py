"""How many threads PyTorch runs: one per physical core that other work leaves free."""

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


def set_threads(n: int | None = None, ranks_here: int = 1, log=None) -> int:
    """Use one thread per physical core (hyper-threads slow matmuls down), shared out among the `ranks_here`
    processes of a data-parallel run on this machine, and, for a single process, only the cores other work leaves
    free: OpenMP threads that share a core with another busy process wait on each other (three 2-thread jobs on 2
    cores ran a demo step 15x slower, not 3x). `log` hears the choice when it is fewer than the cores. Returns the
    count."""
    import psutil
    import torch

    physical = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    cores = max(1, physical // max(1, ranks_here))
    if n is None and ranks_here == 1:
        taken = busy_cores() * physical / (psutil.cpu_count() or physical)  # in physical cores
        n = max(1, min(cores, round(cores - taken)))
        if n < cores and log is not None:
            log(f"note: other work keeps {taken:.1f} of {cores} cores busy: {n} thread{'s' if n > 1 else ''} (a "
                "thread per free core; --threads N to choose)")
    n = n or cores
    torch.set_num_threads(n)
    return n
