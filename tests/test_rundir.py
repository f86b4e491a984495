"""Run files: stage file names, log truncation on resume, gzipped records, the code version."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cpu_grpo import rundir
from cpu_grpo.rundir import cut_jsonl, read_jsonl, stage_eval_path


def test_stage_files_of_file_tasks_stay_in_the_run(tmp_path):
    for name in ("data/good.jsonl", "hf:openai/gsm8k:test", "../../etc/x"):
        path = stage_eval_path(tmp_path, 0, name)
        assert path.parent == tmp_path / "evals" and "/" not in path.name


def test_a_file_tasks_stage_evaluation_is_named_once_with_jsonl(tmp_path):
    """`after-1-units.jsonl.jsonl` became `after-1-units.jsonl`; a run written before keeps its file."""
    assert stage_eval_path(tmp_path, 0, "units.jsonl").name == "after-1-units.jsonl"
    assert stage_eval_path(tmp_path, 1, "data/q.csv.gz").name == "after-2-data-q.jsonl"
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "after-1-units.jsonl.jsonl").write_text("{}\n")
    assert stage_eval_path(tmp_path, 0, "units.jsonl").name == "after-1-units.jsonl.jsonl"


def test_cut_jsonl_drops_later_steps_and_a_half_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    assert cut_jsonl(path, 2) == 1
    assert [r["step"] for r in read_jsonl(path)] == [1, 2] and path.read_text().endswith("\n")
    assert cut_jsonl(tmp_path / "missing.jsonl", 2) == 0


def test_read_jsonl_reads_gzip_and_names_a_damaged_one(tmp_path):
    import gzip

    from cpu_grpo.errors import RunDirError

    data = gzip.compress(b"".join(json.dumps({"id": i}).encode() + b"\n" for i in range(200)))
    whole, cut = tmp_path / "eval_after.jsonl.gz", tmp_path / "cut.jsonl.gz"
    whole.write_bytes(data)
    cut.write_bytes(data[:len(data) // 2])
    assert [r["id"] for r in read_jsonl(whole)] == list(range(200))
    with pytest.raises(RunDirError, match="cut.jsonl.gz is a damaged gzip file"):
        read_jsonl(cut)


def test_code_version_names_a_commit_or_the_version():
    from cpu_grpo import __version__

    v = rundir.code_version()
    head = subprocess.run(["git", "-C", str(Path(rundir.__file__).parent), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode:  # not a git checkout (an installed wheel): the package's version
        assert v == __version__
    else:  # this checkout's commit, "-dirty" exactly when the package has uncommitted changes
        dirty = subprocess.run(["git", "-C", str(Path(rundir.__file__).parent), "status", "--porcelain",
                                "--untracked-files=no", "."], capture_output=True, text=True).stdout.strip()
        assert v == head.stdout.strip() + ("-dirty" if dirty else "")


RACER = """
import sys, time
from pathlib import Path
from cpu_grpo.rundir import RunLock, RunLocked
run, go = Path(sys.argv[1]), float(sys.argv[2])
while time.time() < go:
    pass
try:
    with RunLock(run):
        print("took it", flush=True)
        time.sleep(3)
except RunLocked:
    print("refused", flush=True)
"""


def test_starts_at_the_same_instant_take_the_run_lock_once(tmp_path):
    """Eight processes ask for one run's lock at the same instant: one takes it, seven are refused (a check, then a
    write, let several through)."""
    import sys
    import time

    go = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(go)], stdout=subprocess.PIPE, text=True)
             for _ in range(8)]
    said = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert sorted(said) == ["refused"] * 7 + ["took it"], said
    assert not (tmp_path / "run.lock").exists()  # removed by its holder at the end
