"""Runs for the web app: find them, start and stop them, read what they write. No gradio here.

A run is a directory under the runs root. While its training process lives it holds `run.lock`
({"pid", "started"}) and keeps `status.json`, `metrics.jsonl` and `groups.jsonl` up to date. The page
never trains: it starts `cpu-grpo train` as a separate process and only reads these files, so a reload
or a closed tab loses nothing. Every reader here takes a missing or half-written file in its stride.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import rundir
from ..config import load_file
from ..errors import ConfigError
from ..rundir import read_json, read_jsonl
from ..train import checkpoint
from . import starting

MARKERS = ("metrics.jsonl", "status.json", "run.lock", "train_config.yaml", "console.log")
LIVE_STATES = ("starting", "evaluating", "training")
_children: dict[str, subprocess.Popen] = {}  # runs this app started, by resolved path: their exit gets reaped
_start_lock = threading.Lock()  # check, launch, wait for the lock: one step, also for two tabs pressing Start at once
CHECKED = "{the configuration the page checked}"  # in a start's command: its private copy (starting.private_copy)


# ---------------------------------------------------------------------------------------------------------
# processes


def pid_alive(pid: int | None) -> bool:
    """rundir.pid_alive, reaping the processes this app started (their exit would leave zombies)."""
    for child in _children.values():
        if child.pid == pid:
            return child.poll() is None
    return rundir.pid_alive(pid)


def running_pid(run: Path) -> int | None:
    """pid of the training process working in `run`, or None.

    run.lock counts only while its pid lives; status.json's pid while its state is live; then a process
    this app started there and whose lock is not written yet.
    """
    run = Path(run)
    holder = rundir.lock_holder(run)
    if holder is not None:
        return holder
    status = read_json(run / "status.json") or {}
    if status.get("state") in LIVE_STATES and pid_alive(status.get("pid")):
        return status["pid"]
    child = _children.get(str(run.resolve()))
    if child is not None and child.poll() is None:
        return child.pid
    return None


# ---------------------------------------------------------------------------------------------------------
# finding runs


def list_runs(root: Path) -> list[Path]:
    """Run directories directly under root, the most recently written first."""
    root = Path(root)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and any((p / m).exists() for m in MARKERS)]
    return sorted(runs, key=_last_write, reverse=True)


def _last_write(run: Path) -> float:
    times = [(run / m).stat().st_mtime for m in MARKERS if (run / m).exists()]
    return max(times, default=0.0)


def attach(root: Path) -> Path | None:
    """The newest run that is training now (what a reloaded page shows), else None."""
    return next((r for r in list_runs(root) if running_pid(r)), None)


def checkpoints(run: Path) -> list[Path]:
    """Complete checkpoints of a run (they hold trainer_state.pt), newest first."""
    return checkpoint.complete(Path(run) / "checkpoints")[::-1]


def base_model(run: Path) -> str:
    """The model a run started from, from its saved config ('' when unknown)."""
    return str(saved_config(run).get("model", ""))


def saved_config(run: Path) -> dict:
    path = Path(run) / "train_config.yaml"
    if not path.exists():
        return {}
    try:
        return load_file(path)  # its limits hold for a file dropped into the runs directory too
    except ConfigError:
        return {}


# ---------------------------------------------------------------------------------------------------------
# reading a run


def read_metrics(run: Path) -> list[dict]:
    return [m for m in read_jsonl(Path(run) / "metrics.jsonl") if isinstance(m.get("step"), int)]


def group_steps(run: Path) -> list[int]:
    return sorted({g["step"] for g in read_jsonl(Path(run) / "groups.jsonl") if isinstance(g.get("step"), int)})


def groups_at(run: Path, step: int) -> list[dict]:
    return [g for g in read_jsonl(Path(run) / "groups.jsonl") if g.get("step") == step]


def series(metrics: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) pairs of one metric; missing and NaN values (KL when beta is 0) left out."""
    out = []
    for m in metrics:
        v = m.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            out.append((m["step"], float(v)))
    return out


def eta_seconds(metrics: list[dict], step: int, total: int | None, window: int = 10) -> float | None:
    """Time left: the mean step time of the last `window` steps times the steps left (None if unknown)."""
    times = [v for _, v in series(metrics[-window:], "step_seconds")]
    if not times or not total or step >= total:
        return None
    return sum(times) / len(times) * (total - step)


def status(run: Path) -> dict:
    """What the page says about a run: status.json where present, completed from the other files."""
    run = Path(run)
    st = read_json(run / "status.json") or {}
    metrics = read_metrics(run)
    last = metrics[-1] if metrics else {}
    pid = running_pid(run)
    state = st.get("state")
    if pid and state not in LIVE_STATES:
        state = "training" if metrics else "starting"
    elif not pid and state in LIVE_STATES:
        state = "died"  # killed without a chance to say so (kill -9, out of memory)
    elif state is None:
        state = "finished" if (run / "summary.json").exists() else ("stopped" if metrics else "new")
    step = max(int(st.get("step") or 0), int(last.get("step") or 0))
    total = st.get("total_steps") or saved_config(run).get("steps")
    return {
        "state": state, "pid": pid, "step": step, "total_steps": total,
        "stage": st.get("stage", last.get("stage")), "stage_index": st.get("stage_index", last.get("stage_index")),
        "num_stages": st.get("num_stages"), "stage_step": last.get("stage_step"),
        "stage_steps": last.get("stage_steps"), "eta": eta_seconds(metrics, step, total) if pid else None,
        "rollout_tok_s": last.get("rollout_tok_s"), "train_tok_s": last.get("train_tok_s"),
        "peak_rss_mb": last.get("peak_rss_mb"),
    }


def console_tail(run: Path, lines: int = 40) -> str:
    path = Path(run) / "console.log"
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64_000))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------------------
# starting and stopping


def config_fields() -> list[str]:
    """Names of the TrainConfig fields (every one is a --field-name flag of `cpu-grpo train`)."""
    from dataclasses import fields

    from ..config import TrainConfig

    return [f.name for f in fields(TrainConfig)]


def flag_text(value) -> str:
    """A knob's value as the command line takes it ('' for unset)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def build_command(output_dir: Path | str, model: str = "", profile: str = "", config_file: str = "",
                  knobs: dict | None = None, resume: bool = False, python: str = sys.executable) -> list[str]:
    """The `cpu-grpo train` command line of a run; knobs left empty keep the profile's or file's value."""
    cmd = [python, "-m", "cpu_grpo.cli", "train"]
    if profile:
        cmd += ["--profile", profile]
    if config_file:
        cmd += ["--config", config_file]
    cmd += ["--output-dir", str(output_dir)]
    if model:
        cmd += ["--model", model.strip()]
    for name, value in (knobs or {}).items():
        text = flag_text(value)
        if text:
            cmd += [f"--{name.replace('_', '-')}", text]
    if resume:
        cmd.append("--resume")
    return cmd


def preview(cmd: list[str]) -> str:
    """The command as a person types it: `cpu-grpo train ...`."""
    if cmd[1:3] == ["-m", "cpu_grpo.cli"]:
        cmd = ["cpu-grpo", *cmd[3:]]
    return shlex.join(cmd)


# fields the page never passes from "more fields": it names the run directory itself, and runs no code from files
NOT_FROM_PAGE = {
    "output_dir": "the page puts every run in its runs directory: use the run name field",
    "run_name": "use the run name field",
    "trust_remote_code": "the page never runs a model's own code: start that run with `cpu-grpo train`",
}


def parse_extra(text: str) -> dict:
    """'--train-size 50 --top-k 20' -> {'train_size': '50', 'top_k': '20'}; raises ValueError with the fix.

    Only config fields pass, and not those in NOT_FROM_PAGE; rewards, like every field, then go through
    policy.Policy (reward files only with --allow-code)."""
    from ..config import TrainConfig

    words = shlex.split(text or "")
    known = set(TrainConfig.__dataclass_fields__)
    out = {}
    for i in range(0, len(words), 2):
        flag = words[i]
        if not flag.startswith("--") or i + 1 >= len(words):
            raise ValueError(f"more fields: expected '--field value' pairs, got {flag!r}.")
        name = flag[2:].replace("-", "_")
        if name not in known:
            raise ValueError(f"more fields: {flag} is not a config field; see `cpu-grpo train --help`.")
        if name in NOT_FROM_PAGE:
            raise ValueError(f"more fields: {flag} cannot be set from the page: {NOT_FROM_PAGE[name]}.")
        out[name] = words[i + 1]
    return out


def resolve_config(profile: str, config_file: str, overrides: dict, resume: bool = False):
    """(the config the run would get, None) as `cpu-grpo train` resolves it (its default profile, a resumed run's
    saved config), or (None, the one-sentence reason it does not build)."""
    from ..config import ConfigError, resolve

    values = {k: flag_text(v) for k, v in overrides.items() if flag_text(v)}
    try:
        return resolve(profile or "default", config_file or None, values, resume)[0], None
    except ConfigError as e:
        return None, str(e)


def plan_text(cfg) -> str:
    """The planner's forecast of the run (what `cpu-grpo plan` prints), or why there is none."""
    from ..machine.planner import Machine, Shapes, forecast

    try:
        shapes = Shapes.of_model(cfg.model)
    except Exception as e:  # a forecast is a convenience: the config check already said what is wrong
        return f"(no forecast: {type(e).__name__}: {str(e)[:160]})"
    machine = Machine.measure(0.4)
    return forecast(cfg, shapes, machine, cfg.model)


def check_start(run: Path, resume: bool) -> str | None:
    """None if a run may start in `run`, else why not (one run at a time per directory, never overwrite)."""
    run = Path(run)
    pid = running_pid(run)
    if pid:
        return (f"{run.name} is busy: a training process (pid {pid}) is running there. Stop it first, or "
                "choose another run name.")
    has_run = (run / "metrics.jsonl").exists()
    if has_run and not resume:
        return f"{run.name} already holds a run: tick 'resume' to continue it, or choose another run name."
    if resume and not checkpoints(run):
        return f"{run.name} has no complete checkpoint to resume from: untick 'resume' or pick another run."
    return None


def too_many_running(root: Path, max_runs: int) -> str | None:
    """Why no run may start now: `max_runs` already training in the runs directory (0: no cap), else None."""
    busy = [r.name for r in list_runs(root) if running_pid(r)]
    if max_runs and len(busy) >= max_runs:
        return (f"{', '.join(busy)} {'is' if len(busy) == 1 else 'are'} training: the page runs at most {max_runs} "
                "at once (runs on the same cores slow each other far more than their share; `cpu-grpo app "
                "--max-runs N` to change it): stop one, or wait for it to end.")
    return None


def child_env() -> dict:
    """The environment of a process the page starts: ours (HF_HUB_OFFLINE, CPU_GRPO_CACHE...), unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def start(cmd: list[str], run: Path, resume: bool = False, env: dict | None = None, config=None,
          wait: float = starting.WAIT, max_runs: int = 0) -> tuple[int | None, str]:
    """Launch a training process in its own session, output appended to run/console.log, and wait (at most `wait`
    seconds) until it holds the run's lock or has ended: "Started" only for a process that took the run.

    `config`, the configuration the page checked, reaches the process as a private file in place of CHECKED in
    `cmd`. Returns (pid, message); pid is None when the start was refused, by the page or by the process itself.
    """
    run = Path(run)
    with _start_lock, starting.one_at_a_time(run.parent, wait + 30) as ours:
        refusal = (check_start(run, resume) or too_many_running(run.parent, max_runs)) if ours else (
            "another page is starting a run in this runs directory right now: try again in a minute.")
        if refusal:
            return None, refusal
        run.mkdir(parents=True, exist_ok=True)
        copy = starting.private_copy(config) if config is not None else None
        cmd = [str(copy) if word == CHECKED and copy else word for word in cmd]
        with open(run / "console.log", "a") as log:
            log.write(f"\n$ {preview(cmd)}   # {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            if copy:
                log.write("# --config: the configuration the page checked (a private copy, removed once read)\n")
            log.flush()
            offset = log.tell()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**child_env(), **(env or {})})
        _children[str(run.resolve())] = proc
        outcome = starting.taken(proc, run, wait)
        starting.forget(copy, proc, run, outcome)
        if outcome == "ended" and proc.returncode:
            _children.pop(str(run.resolve()), None)  # reaped: nothing of this run's is ours
    if outcome == "lock":
        return proc.pid, f"Started {run.name} (pid {proc.pid}): follow it in the Watch tab."
    if outcome == "waiting":
        return proc.pid, (f"{run.name}: its training process (pid {proc.pid}) has not taken the run after "
                          f"{wait:.0f} s (a busy machine?): the Watch tab says whether it starts.")
    if proc.returncode == 0:
        return proc.pid, f"{run.name} ran and has already finished (pid {proc.pid}): see the Watch tab."
    return None, starting.last_words(run / "console.log", offset, proc.returncode)


def stop(run: Path) -> str:
    """Ask the run's training process to stop: it finishes the step, saves a complete checkpoint, exits."""
    run = Path(run)
    pid = running_pid(run)
    if not pid:
        return f"No training process is running in {run.name}: nothing to stop."
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"The training process of {run.name} has just ended: nothing to stop."
    return (f"Stop sent to {run.name} (pid {pid}): it finishes the step at hand, saves a complete checkpoint "
            "and exits.")


def eval_command(model: str, task: str, n: int, max_new_tokens: int, output: Path,
                 python: str = sys.executable) -> list[str]:
    return [python, "-m", "cpu_grpo.cli", "eval", "--model", model, "--task", task, "--n", str(int(n)),
            "--max-new-tokens", str(int(max_new_tokens)), "--output", str(output)]


def eval_output(run: Path, model: str, task: str, n: int) -> Path:
    """Where an evaluation launched from the page writes its records: run/evals/<model>-<task>-n<N>.jsonl."""
    slug = "-".join(part for part in (Path(model).name, Path(task).stem, f"n{int(n)}") if part)
    return Path(run) / "evals" / f"{slug.replace(':', '_')}.jsonl"
