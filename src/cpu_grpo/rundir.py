"""A run directory's files: paths, JSON lines (appended, read back, cut at a resumed step), status.json and the
run lock, and the code version a run records. Everything that reads or writes a run directory goes through here."""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import zlib
from pathlib import Path

from .errors import RunDirError


def code_version() -> str:
    """The git commit of this source tree ("-dirty" when the package has uncommitted changes), else the installed
    package's version (read from its metadata: this module sits below the package root)."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        __version__ = version("cpu-grpo")
    except PackageNotFoundError:
        __version__ = "unknown"

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(Path(__file__).parent), *args], capture_output=True, text=True,
                              timeout=10)

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        if head.returncode != 0:
            return __version__
        dirty = git("status", "--porcelain", "--untracked-files=no", ".").stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return __version__


_DATA_SUFFIX = re.compile(r"\.(jsonl|json|csv|parquet)(\.gz)?$")


def stage_eval_path(run: Path, index: int, name: str) -> Path:
    """evals/after-K-<stage>.jsonl; a stage named after a file task ("data/x.jsonl", "hf:org/name") gets a
    file name without path separators or its data suffix ("after-1-data-x.jsonl", "after-1-hf-org-name.jsonl"). A
    run evaluated before that rule keeps its file ("after-1-data-x.jsonl.jsonl").

    >>> stage_eval_path(Path("run"), 0, "data/units.jsonl").name
    'after-1-data-units.jsonl'
    """
    evals = Path(run) / "evals"
    new = evals / f"after-{index + 1}-{file_safe(_DATA_SUFFIX.sub('', name))}.jsonl"
    old = evals / f"after-{index + 1}-{file_safe(name)}.jsonl"
    return old if old.exists() and not new.exists() else new


def file_safe(name: str) -> str:
    """`name` with every run of characters other than letters, digits, '.', '_' and '-' turned into one '-'.

    >>> file_safe("../data/good.jsonl"), file_safe("hf:openai/gsm8k:test")
    ('..-data-good.jsonl', 'hf-openai-gsm8k-test')
    """
    return re.sub(r"[^\w.-]+", "-", name).strip("-") or "stage"


def append_jsonl(path: Path, record: dict) -> None:
    with _naming(path), open(path, "a") as f:
        f.write(json.dumps(record, default=_jsonable) + "\n")


@contextlib.contextmanager
def _naming(path: Path):
    """An OSError while writing `path` names it (Python's does not once the file is open): on a full disk,
    train.py's sentence says which file."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from e


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    return str(x)


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSONL file, gzipped or not (results/ cards keep evaluations as .jsonl.gz); a half-written last
    line (a run still writing) is skipped, not an error, and so is any line that is not JSON. A damaged gzip file
    (cut short in a copy) is an error that names it: its records would be missing without a word."""
    out = []
    if not Path(path).exists():
        return out
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip's magic
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:  # cut short; a bad CRC or header
            raise RunDirError(f"{path} is a damaged gzip file ({e}): restore it (a card's file: git checkout -- "
                              f"{path}) or delete it") from None
    for line in raw.decode(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def read_json(path: Path) -> dict | None:
    """A JSON object from a file, or None when it is missing, half-written or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cut_jsonl(path: Path, last_step: int) -> int:
    """Drop the records of steps after `last_step` (logged after the checkpoint a run resumes from, so they
    would be logged again) and a half-written last line; returns how many records were dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    records = read_jsonl(path)
    kept = [r for r in records if r.get("step", 0) <= last_step]
    text = path.read_text()
    if len(kept) < len(records) or text and not text.endswith("\n"):  # or a line cut off by a kill
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, default=_jsonable) + "\n" for r in kept))
        tmp.replace(path)
    return len(records) - len(kept)


# ---------------------------------------------------------------------------- run status and lock (for watchers)
def write_status(run_dir: Path, **fields) -> None:
    """Merge `fields` into run_dir/status.json, atomically (a web page may read it at any moment)."""
    import os
    import time

    path = Path(run_dir) / "status.json"
    status = read_json(path) or {}
    status.update(fields, pid=os.getpid(), updated=time.time())
    tmp = path.with_suffix(".json.tmp")
    with _naming(path):
        tmp.write_text(json.dumps(status, default=_jsonable))
    os.replace(tmp, path)


def pid_alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie (a killed run leaves a stale lock behind)."""
    import os

    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def lock_holder(run_dir: Path) -> int | None:
    """The pid of the live process training in run_dir, or None (no lock, or a stale one)."""
    try:
        pid = int(json.loads((Path(run_dir) / "run.lock").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if pid_alive(pid) else None


class RunLocked(RunDirError):
    """Another live process trains in the run directory: a start refused so touches nothing of that run's."""


class RunLock:
    """run_dir/run.lock holds the training pid: one training process per run directory. The check and the write are
    one step (an flock on the file, held while the process lives), so two starts at the same instant cannot both
    pass; a file naming another live process refuses a start too."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "run.lock"
        self.fd = None

    def __enter__(self):
        import fcntl
        import os
        import time

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                self._refuse(lock_holder(self.path.parent))
            if self.path.exists() and os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                break
            os.close(fd)  # the file was replaced while we waited for it (its holder ended): take the new one
        holder = lock_holder(self.path.parent)
        if holder is not None and holder != os.getpid():
            os.close(fd)
            self._refuse(holder)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "started": time.time()}).encode())
        except OSError:  # a full disk: said by the caller; no lock is left behind
            self.path.unlink(missing_ok=True)
            os.close(fd)
            raise
        self.fd = fd
        return self

    def _refuse(self, holder: int | None):
        raise RunLocked(f"{self.path.parent} is being trained by process {holder or '(another)'}: wait for it to "
                        "finish, stop it, or choose another --output-dir.")

    def __exit__(self, *exc):
        import os

        self.path.unlink(missing_ok=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        return False
