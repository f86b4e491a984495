"""How the page's Start makes sure that "Started" names a process that took the run (runs.start uses these).

- The starts of every app serving one runs directory go one at a time (`.starting.lock` there): a second page
  checks the run's `run.lock` only after the first page's process has taken it, or ended.
- The process gets the configuration the page checked, as a private file (a directory only this user can read,
  removed once the process has read it), never the path the page read: a file changed after the check would be
  read again unchecked.
- After the launch the page waits until the process holds `run.lock` (it reads its configuration first) or has
  ended; one that ended (refused by a lock another process took meanwhile, a run it may not resume) is its one
  sentence.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .. import rundir

WAIT = 120.0  # seconds a Start waits for its process to take the run's lock (imports, the config, then the lock)
GUARD = ".starting.lock"  # in the runs directory: one Start at a time, across app processes


@contextlib.contextmanager
def one_at_a_time(root: Path, wait: float):
    """Hold the runs directory's start lock (flock: released when its holder ends, however it ends); yield False
    when another app's Start has held it for more than `wait` seconds."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / GUARD, "a") as f:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.1)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def private_copy(cfg) -> Path:
    """The configuration the page checked, written to a new directory only this user can read."""
    from ..config import save

    path = Path(tempfile.mkdtemp(prefix="cpu-grpo-start-")) / "train_config.yaml"
    save(cfg, path)
    return path


def taken(proc: subprocess.Popen, run: Path, wait: float) -> str:
    """'lock' once `proc` holds the run's lock, 'ended' once it has exited, 'waiting' after `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        if rundir.lock_holder(run) == proc.pid:
            return "lock"
        if proc.poll() is not None:
            return "ended"
        if time.monotonic() >= deadline:
            return "waiting"
        time.sleep(0.1)


def forget(copy: Path | None, proc: subprocess.Popen, run: Path, outcome: str) -> None:
    """Remove the private copy once the process has read it (it holds the lock, or it ended); while it has not
    yet, a thread removes it then."""
    if copy is None:
        return
    if outcome != "waiting":
        shutil.rmtree(copy.parent, ignore_errors=True)
        return

    def later():
        taken(proc, run, float("inf"))
        shutil.rmtree(copy.parent, ignore_errors=True)

    threading.Thread(target=later, daemon=True).start()


def last_words(log: Path, offset: int, code: int) -> str:
    """Why a process that ended at once ended: its `cpu-grpo: ...` sentence in the log written from `offset`, else
    the log's last line, else its exit code."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            lines = [ln.strip() for ln in f.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        lines = []
    said = [ln.removeprefix("cpu-grpo: ") for ln in lines if ln.startswith("cpu-grpo: ")]
    why = said[-1] if said else lines[-1] if lines else "it wrote nothing"
    return f"the training process ended at once (exit code {code}): {why}"
