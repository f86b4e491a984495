"""Run code a model wrote, never in the trainer's process: each program runs in a new Python process (isolated mode,
no site packages) in a temporary directory that is removed afterwards, in its own process group, under limits of
wall-clock time, CPU time, memory, file size and open files, with no network and its own process namespace where
`unshare` allows it (root, or user namespaces), so that a fork, a hang, a 10 GB allocation or a connection attempt
ends in a failed test, never in a stalled or starved trainer. What it prints goes to files capped in size.

TRL runs code rewards in e2b or morph cloud sandboxes; verl and open-r1 in a local process with a timeout. Here it
is the local process, with the operating system's limits on top."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    seconds: float = 5.0  # wall clock, then the whole process group is killed
    cpu_seconds: int = 5
    memory_mb: int = 512  # address space
    file_mb: int = 8  # any file it writes, its output included
    open_files: int = 64


@dataclass(frozen=True)
class Result:
    passed: bool  # exited with status 0 within its limits
    status: str  # "passed" | "failed" | "timeout" | "killed"
    seconds: float
    output: str  # the end of what it printed (stdout and stderr), for reading a failure


@functools.cache
def isolation() -> tuple[str, ...]:
    """The `unshare` prefix that gives a program no network and its own process namespace (its forks die with
    it), the first of those that works here; () where none does (then the limits and the process group remain)."""
    tool = shutil.which("unshare")
    for flags in (("--net", "--pid", "--fork", "--kill-child"),
                  ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")):
        if tool and subprocess.run([tool, *flags, "true"], capture_output=True, timeout=10).returncode == 0:
            return (tool, *flags)
    return ()


# sets the limits in the new interpreter, then runs the program as __main__ (no preexec_fn: the trainer has threads)
_BOOT = ("import resource as r, runpy\n"
         "for k, v in ((r.RLIMIT_AS, {mem}), (r.RLIMIT_CPU, {cpu}), (r.RLIMIT_FSIZE, {fsize}),"
         " (r.RLIMIT_NOFILE, {files}), (r.RLIMIT_CORE, 0)):\n"
         "    r.setrlimit(k, (v, v))\n"
         "runpy.run_path('main.py', run_name='__main__')\n")


def run_python(program: str, limits: Limits = Limits()) -> Result:
    """Run `program` as a Python script under `limits`; passed when it exits with status 0."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cpu-grpo-sandbox-") as tmp:
        Path(tmp, "main.py").write_text(program)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "LANG": "C.UTF-8"}
        with open(Path(tmp, "out.txt"), "wb") as out:
            boot = _BOOT.format(mem=limits.memory_mb * 2**20, cpu=limits.cpu_seconds, fsize=limits.file_mb * 2**20,
                                files=limits.open_files)
            proc = subprocess.Popen([*isolation(), sys.executable, "-I", "-S", "-c", boot], cwd=tmp, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(timeout=limits.seconds)
                status = "passed" if code == 0 else "killed" if code < 0 or code == 137 else "failed"
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                _kill_group(proc)
        output = Path(tmp, "out.txt").read_bytes()[-2000:].decode(errors="replace")
    return Result(status == "passed", status, time.monotonic() - t0, output)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the program's process group (what it forked without leaving the group) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_many(programs: list[str], limits: Limits = Limits(), workers: int | None = None) -> list[Result]:
    """run_python on each program, a few at a time (one per core), in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda p: run_python(p, limits), programs))
