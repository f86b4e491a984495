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
    share: float = 0.0  # run_tests: the share of the test statements that passed


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
         "del r\n")


def run_python(program: str, limits: Limits = Limits(), harness: str = "runpy.run_path('main.py', run_name='__main__')",
               files: dict | None = None, env: dict | None = None) -> Result:
    """Run `program` (main.py) as a Python script under `limits`, through `harness` (Python run after the limits are
    set), with `files` beside it; passed when it exits with status 0."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="cpu-grpo-sandbox-") as tmp:
        Path(tmp, "main.py").write_text(program)
        for name, text in (files or {}).items():
            Path(tmp, name).write_text(text)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONHASHSEED": "0", "LANG": "C.UTF-8", **(env or {})}
        with open(Path(tmp, "out.txt"), "wb") as out:
            boot = _BOOT.format(mem=limits.memory_mb * 2**20, cpu=limits.cpu_seconds, fsize=limits.file_mb * 2**20,
                                files=limits.open_files) + harness
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


# runs a solution, then each statement of its tests in its namespace, and prints a pass token known only to this
# harness with how many statements passed: a program that exits early (sys.exit(0), os._exit) prints no token, so it
# passes nothing; tests.py is parsed and removed before the solution runs and the token is taken out of the
# environment. `check(got, want)` compares values of the same exact types, element by element, so an object whose
# __eq__ always says True does not pass; it is put back before every statement and the builtins it uses are bound
# before the solution runs, so a solution that defines its own `check` or replaces `type` passes nothing either. A
# program that searches the interpreter's frames for the token could still forge it: a known limit.
_TESTS = ("import ast, os\n"
          "def _harness(token=os.environ.pop('CPU_GRPO_PASS'), type=type, len=len, zip=zip, all=all, list=list,\n"
          "             tuple=tuple, dict=dict, Exception=Exception, print=print, exec=exec, compile=compile):\n"
          "    def same(a, b):\n"
          "        if type(a) is not type(b):\n"
          "            return False\n"
          "        if type(a) in (list, tuple):\n"
          "            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))\n"
          "        if type(a) is dict:\n"
          "            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)\n"
          "        return a == b\n"
          "    def check(got, want):\n"
          "        if not same(got, want):\n"
          "            raise AssertionError(f'got {got!r}, want {want!r}')\n"
          "    statements = [ast.Module([s], []) for s in ast.parse(open('tests.py').read()).body]\n"
          "    os.remove('tests.py')\n"
          "    ns = {'__name__': '__main__'}\n"
          "    exec(compile(open('main.py').read(), 'solution.py', 'exec'), ns)\n"
          "    passed = 0\n"
          "    for statement in statements:\n"
          "        ns['check'] = check\n"
          "        try:\n"
          "            exec(compile(statement, 'tests.py', 'exec'), ns)\n"
          "            passed += 1\n"
          "        except Exception:\n"
          "            pass\n"
          "    print('\\n' + token, passed, len(statements), flush=True)\n"
          "_harness()\n")


def run_tests(solution: str, tests: str, limits: Limits = Limits()) -> Result:
    """Run `solution`, then each statement of `tests` (assert lines, or `check(got, want)` for exact comparisons)
    in its namespace; passed when every statement passed, and `share` the share that did (0 when the solution
    failed, or exited before the harness could report)."""
    import secrets

    token = secrets.token_hex(16)
    result = run_python(solution, limits, harness=_TESTS, files={"tests.py": tests}, env={"CPU_GRPO_PASS": token})
    last = result.output.rstrip().rsplit("\n", 1)[-1].split()
    ran = result.passed and len(last) == 3 and last[0] == token
    done, total = (int(last[1]), int(last[2])) if ran else (0, 1)
    passed = ran and done == total
    return Result(passed, result.status if passed or not result.passed else "failed", result.seconds,
                  result.output.replace(token, "<pass>"), done / total if total else float(passed))


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the program's process group (what it forked without leaving the group) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_many(pairs: list[tuple[str, str]], limits: Limits = Limits(), workers: int | None = None) -> list[Result]:
    """run_tests on each (solution, tests), a few at a time (one per core), in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers or max(1, min(4, os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda pair: run_tests(*pair, limits), pairs))
