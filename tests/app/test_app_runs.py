"""The web app's run handling on hand-made run directories: no gradio, no browser, no training."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpu_grpo.app import runs, starting, views
from cpu_grpo.app.policy import Policy


def write_metrics(run: Path, times: list[float], tail: str = "") -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": i + 1, "reward": 0.1 * i, "kl": math.nan, "step_seconds": t,
                         "rollout_tok_s": 100.0, "peak_rss_mb": 512.0})
             for i, t in enumerate(times)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_half_written_last_line_is_skipped(tmp_path):
    run = tmp_path / "r"
    write_metrics(run, [2.0, 4.0], tail='{"step": 3, "rew')
    metrics = runs.read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    assert runs.series(metrics, "kl") == []  # NaN (beta = 0) is left out, not plotted
    assert runs.series(metrics, "reward") == [(1, 0.0), (2, 0.1)]
    (run / "groups.jsonl").write_text(json.dumps({"step": 1, "group": 0}) + '\n{"step": 2, "gr')
    assert runs.group_steps(run) == [1] and len(runs.groups_at(run, 1)) == 1
    (run / "status.json").write_text('{"state": "trai')  # half-written: ignored, derived from the files
    assert runs.status(run)["state"] == "stopped" and runs.status(run)["step"] == 2


def test_eta_is_mean_step_time_times_steps_left():
    metrics = [{"step": i + 1, "step_seconds": t} for i, t in enumerate([100.0] + [2.0] * 10)]
    assert runs.eta_seconds(metrics, step=11, total=15) == pytest.approx(4 * 2.0)  # last 10 steps only
    assert runs.eta_seconds(metrics, step=15, total=15) is None
    assert runs.eta_seconds([], step=0, total=15) is None
    assert views.duration(3723) == "1:02:03" and views.duration(65) == "1:05" and views.duration(None) == "-"


def test_stale_lock_is_not_held(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.lock").write_text(json.dumps({"pid": dead_pid(), "started": time.time()}))
    (run / "status.json").write_text(json.dumps({"state": "training", "step": 3, "total_steps": 8,
                                                 "pid": dead_pid()}))
    assert runs.running_pid(run) is None
    assert runs.check_start(run, resume=False) is None
    st = runs.status(run)
    assert st["state"] == "died" and st["step"] == 3 and st["total_steps"] == 8 and st["eta"] is None


def test_busy_directory_is_refused(tmp_path, sleeper):
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.lock").write_text(json.dumps({"pid": sleeper.pid, "started": time.time()}))
    assert runs.running_pid(run) == sleeper.pid
    assert "is busy" in runs.check_start(run, resume=True)
    assert runs.attach(tmp_path) == run
    assert runs.status(run)["state"] == "starting"


def test_existing_run_needs_resume_and_a_checkpoint(tmp_path):
    run = tmp_path / "r"
    write_metrics(run, [1.0])
    assert "tick 'resume'" in runs.check_start(run, resume=False)
    assert "no complete checkpoint" in runs.check_start(run, resume=True)
    (run / "checkpoints" / ".step-000002.tmp").mkdir(parents=True)  # half-saved: does not count
    (run / "checkpoints" / "step-000001").mkdir()
    assert "no complete checkpoint" in runs.check_start(run, resume=True)
    (run / "checkpoints" / "step-000001" / "trainer_state.pt").write_bytes(b"x")
    assert runs.check_start(run, resume=True) is None
    assert runs.checkpoints(run) == [run / "checkpoints" / "step-000001"]


def test_start_says_started_only_for_a_process_that_took_the_run_and_stop_sends_sigterm(tmp_path):
    run = tmp_path / "r"
    takes = [sys.executable, "-c", "import json, os, sys, time; open(sys.argv[1], 'w').write(json.dumps({'pid': "
             "os.getpid()})); time.sleep(60)", str(run / "run.lock")]  # takes the lock, as `cpu-grpo train` does
    pid, message = runs.start(takes, run)
    assert pid and "Started r" in message and runs.rundir.lock_holder(run) == pid
    again, refusal = runs.start(takes, run)
    assert again is None and "is busy" in refusal
    assert "Stop sent" in runs.stop(run)
    deadline = time.time() + 10
    while runs.running_pid(run) and time.time() < deadline:
        time.sleep(0.05)
    assert runs.running_pid(run) is None and not runs.pid_alive(pid)  # reaped, not a zombie
    assert "nothing to stop" in runs.stop(run)
    assert "import json" in (run / "console.log").read_text()
    # a process that has not taken the lock within the wait: not "Started"; the app knows its own child
    slow = tmp_path / "slow"
    pid, message = runs.start([sys.executable, "-c", "import time; time.sleep(60)"], slow, wait=0.3)
    assert pid and "Started" not in message and "has not taken the run after 0 s" in message
    again, refusal = runs.start([sys.executable, "-c", "pass"], slow)
    assert again is None and "is busy" in refusal
    assert "Stop sent" in runs.stop(slow)
    # a process that ends at once: its sentence, from its log
    bad = [sys.executable, "-c", "import sys; print('loading'); sys.exit('cpu-grpo: no model there: check the path')"]
    assert runs.start(bad, tmp_path / "bad") == (None, "the training process ended at once (exit code 1): no model "
                                                       "there: check the path")
    assert not (tmp_path / starting.GUARD).read_text()  # the starts' own lock file, empty


TINY = {"prompts_per_step": 2, "num_generations": 2, "max_new_tokens": 8, "eval_size": 0, "save_every": 0}
OTHER_PAGE = """import json, sys
from pathlib import Path
from cpu_grpo.app import handlers
from cpu_grpo.app.policy import Policy
root, model, names, values = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(json.dumps(handlers.start(Policy(Path(root), (Path(model),)), names, *values)[1]))
"""


def page(model: str, run_name: str, config_file: str = "", **knobs) -> tuple[list[str], list]:
    """The Train tab's knob names and fields: model, profile, config file, run name, resume, LoRA, more fields,
    the knobs."""
    knobs = {**TINY, **knobs}
    return list(knobs), [model, "quick", config_file, run_name, False, False, "--train-size 20 --threads 1",
                         *knobs.values()]


@pytest.mark.slow  # two app processes, a training started
def test_two_pages_starting_one_run_say_started_once(tmp_path, monkeypatch, tiny_model):
    """Two pages (this process and another app process, at once) press Start on one run: exactly one says Started,
    for the process that holds run.lock; the other says why not. A page whose check passed before another process
    took the lock shows its process's sentence, not Started, and touches nothing of the winner's."""
    from cpu_grpo.app import handlers

    root, (names, values) = tmp_path / "runs", page(tiny_model, "r", steps=100000)
    policy, run = Policy(root, (Path(tiny_model),)), root / "r"
    other = subprocess.Popen([sys.executable, "-c", OTHER_PAGE, str(root), tiny_model, json.dumps(names),
                              json.dumps(values)], stdout=subprocess.PIPE, text=True)
    try:
        mine = handlers.start(policy, names, *values)[1]
        theirs = json.loads(other.communicate(timeout=300)[0])
        winner = runs.rundir.lock_holder(run)
        said = sorted([mine, theirs], key=lambda m: "Started" not in m)
        assert winner and said[0].startswith(f"Started r (pid {winner})"), said
        assert "Started" not in said[1] and "r is busy" in said[1], said
        monkeypatch.setattr(runs, "check_start", lambda run, resume: None)  # checked before the winner's lock
        monkeypatch.setattr(runs, "too_many_running", lambda root, max_runs: None)
        resume = [*values[:4], True, *values[5:]]  # the winner has logged steps: only a resume gets to the lock
        late = handlers.start(policy, names, *resume)[1]
        assert late.startswith("⚠️ Not started: the training process ended at once (exit code 2): ") and \
            f"is being trained by process {winner}" in late, late
        status = runs.read_json(run / "status.json")  # the winner's, as the winner writes it
        assert runs.rundir.lock_holder(run) == status["pid"] == winner and status["state"] in runs.LIVE_STATES
    finally:
        for pid in {runs.rundir.lock_holder(run), (runs.read_json(run / "status.json") or {}).get("pid")} - {None}:
            if runs.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)  # a training process this test's pages started


def test_the_process_runs_the_configuration_the_page_checked_not_the_file_again(tmp_path, monkeypatch, tiny_model):
    """The config file is swapped for one with a reward file after the page checked it and before the process
    starts: the process runs the checked configuration (from a private copy, removed once read), never the file."""
    from cpu_grpo.app import handlers

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    root.mkdir()
    (tmp_path / "evil.py").write_text("from pathlib import Path\nPath('EVIL-RAN').write_text('yes')\n"
                                      "def fn(completions, **kw):\n    return [1.0] * len(completions)\n")
    (root / "my.yaml").write_text("steps: 1\n")
    check_start = runs.check_start

    def swapped_after_the_check(run, resume):
        (root / "my.yaml").write_text("steps: 1\nrewards: [evil.py:fn]\nreward_weights: [1]\n")
        return check_start(run, resume)

    monkeypatch.setattr(runs, "check_start", swapped_after_the_check)
    policy, (names, values) = Policy(root, (Path(tiny_model),)), page(tiny_model, "t", "runs/my.yaml")
    command, message, _ = handlers.start(policy, names, *values)
    assert "--config runs/my.yaml" in command and message.startswith("Started t"), message
    run = root / "t"
    deadline = time.time() + 300
    while runs.running_pid(run) and time.time() < deadline:
        time.sleep(0.5)
    assert runs.status(run)["state"] == "finished", runs.console_tail(run)
    assert "evil" in (root / "my.yaml").read_text() and not (tmp_path / "EVIL-RAN").exists()
    saved = runs.saved_config(run)  # what the page checked: the profile's rewards, the file's steps
    assert saved["rewards"] == ["correctness", "correct_format"] and saved["steps"] == 1
    log = (run / "console.log").read_text()
    copy = Path(log.split("--config ", 1)[1].split()[0])
    assert copy.name == "train_config.yaml" and not copy.parent.exists() and "evil" not in log


def test_preview_command_and_config_check():
    knobs = {"steps": "6", "learning_rate": 0.001, "use_lora": True, "task": "", "seed": None,
             "rewards": "my rewards.py:length_reward"}
    cmd = runs.build_command("runs/x", "smollm2-135m", "quick", "", knobs, resume=True, python="py")
    assert cmd[:4] == ["py", "-m", "cpu_grpo.cli", "train"]
    assert runs.preview(cmd) == ("cpu-grpo train --profile quick --output-dir runs/x --model smollm2-135m --steps 6 "
                                 "--learning-rate 0.001 --use-lora true --rewards 'my rewards.py:length_reward' "
                                 "--resume")
    cfg, error = runs.resolve_config("quick", "", {"steps": "6", "num_generations": "4"})
    assert error is None and (cfg.steps, cfg.num_generations, cfg.eval_size) == (6, 4, 40)
    assert "cannot read 'many' as int" in runs.resolve_config("quick", "", {"steps": "many"})[1]
    assert "num_generations must be >= 2" in runs.resolve_config("", "", {"num_generations": 1})[1]
    assert runs.resolve_config("", "", {})[0].use_lora  # no profile: `cpu-grpo train`'s, the default profile
    assert runs.parse_extra("--train-size 50 --top-k '20'") == {"train_size": "50", "top_k": "20"}
    assert runs.parse_extra("--rewards correctness,format") == {"rewards": "correctness,format"}
    for text, words in [("--output-dir /anywhere", "cannot be set from the page"),
                        ("--trust-remote-code true", "never runs a model's own code"),
                        ("--no-such 1", "not a config field")]:
        with pytest.raises(ValueError, match=words):
            runs.parse_extra(text)
    reward_file = runs.parse_extra("--rewards my.py:reward")  # passes here; the page's policy refuses it
    assert "unless the app was started with --allow-code" in Policy(Path("runs")).train_problem("", "", reward_file)
    with pytest.raises(ValueError, match="--field value"):
        runs.parse_extra("--train-size")
    assert set(runs.config_fields()) >= {"steps", "rewards", "model", "output_dir"}


def test_list_runs_newest_first(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    write_metrics(old, [1.0])
    write_metrics(new, [1.0])
    os.utime(old / "metrics.jsonl", (1_000_000, 1_000_000))  # written long before the other
    os.utime(new / "metrics.jsonl", (2_000_000, 2_000_000))
    (tmp_path / "not-a-run").mkdir()
    assert runs.list_runs(tmp_path) == [new, old]
    assert runs.attach(tmp_path) is None
    assert runs.list_runs(tmp_path / "missing") == []


def test_group_view_escapes_and_explains_zero_variance():
    group = {"step": 3, "group": 1, "question": "What is <b>2+2</b>?", "answer": "4", "difficulty": "basic",
             "completions": ["<script>x</script> #### 4", "#### 4"], "rewards": {"correctness": [1.0, 1.0]},
             "total": [1.0, 1.0], "advantages": [0.0, 0.0], "zero_std": True}
    page = views.groups_html([group, {**group, "group": 2, "zero_std": False, "advantages": [0.7, -0.7]}], 3)
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;2+2" in page
    assert page.count(views.ZERO_STD.format(g=2)) == 1
    assert "All 2 rewards are equal, so every advantage is 0" in page
    assert "1 with zero reward variance (50%)" in page and "+0.700" in page and "-0.700" in page


def test_group_view_shows_a_conversation_with_tools_turn_by_turn():
    """A run with tools logs each exchange; the inspector shows it turn by turn: the model's turns, each tool's
    result under it (a failed call in red), not the flat text."""
    turns = [{"role": "assistant", "content": "<tool_call>calc 6*7</tool_call>"},
             {"role": "tool", "name": "calculator", "content": "42"},
             {"role": "assistant", "content": "#### 42"}]
    failed = [turns[0], {"role": "tool", "name": "abacus", "content": "{'error': 'Tool abacus not found.'}"}]
    group = {"step": 1, "group": 0, "question": "6*7?", "answer": "42", "completions": ["flat", "flat"],
             "rewards": {"correctness": [1.0, 0.0]}, "total": [1.0, 0.0], "advantages": [0.7, -0.7],
             "transcripts": [turns, failed]}
    page = views.group_html(group)
    assert "flat" not in page and page.count('class="turn tool"') == 2
    assert "calculator: 42" in page and "#### 42" in page and "&lt;tool_call&gt;calc 6*7" in page
    assert "color:#b91c1c\">&#8627; abacus" in page


def test_forgetting_and_status_text():
    data = {"levels": ["basic", "advanced"],
            "rows": [{"after": "base", "cells": {"basic": {"accuracy": 0.2, "ci95": [0.1, 0.3], "n": 50}}}]}
    table = views.forgetting_markdown(data)
    assert table.splitlines()[0] == "| after | basic | advanced |"
    assert "| base | 20.0% (10.0-30.0) | - |" in table
    st = {"state": "training", "step": 4, "total_steps": 8, "stage": "basic", "stage_index": 0, "num_stages": 3,
          "stage_step": 4, "stage_steps": 5, "eta": 125.0, "rollout_tok_s": 210.4, "train_tok_s": None,
          "peak_rss_mb": 700.2, "pid": 12}
    line = views.status_line("demo", st)
    assert "step 4/8" in line and "stage 1/3 `basic` (step 4/5)" in line and "ETA 2:05" in line
    assert "210 tok/s" in line and "peak RSS 700 MB" in line
    assert "4/5" in views.progress_html(st)


def test_app_help_imports_neither_gradio_nor_torch():
    code = ("import sys; from cpu_grpo.cli import main\n"
            "for argv in (['--help'], ['app', '--help']):\n"
            "    try: main(argv)\n    except SystemExit: pass\n"
            "assert 'gradio' not in sys.modules and 'torch' not in sys.modules, 'heavy import for --help'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--runs-dir" in done.stdout and "127.0.0.1" in done.stdout


def test_eval_table_keeps_headings_and_tables():
    output = ("Loading weights: 100%\n  eval 4/4: accuracy so far 0.250 (0s)\naccuracy (95% CI):\n\n"
              "| level | n | auto |\n|---|---|---|\n| basic | 4 | 25.0% (4.6-69.9) |\n\nthe work (95% CI):\n\n"
              "| level | n | calc steps |\n|---|---|---|\n| basic | 4 | 0.50 |\n")
    table = views.eval_table(output)
    assert table.startswith("accuracy (95% CI):\n\n| level | n | auto |") and "the work (95% CI):" in table
    assert "Loading" not in table and views.eval_table("no table here") == ""


def test_the_page_touches_no_file_outside_its_directories_and_runs_no_code_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root, data = tmp_path / "runs", tmp_path / "data"
    policy = Policy(root)
    assert policy.train_problem("smollm2-135m", "", {"task": "basic", "stages": "basic:10,advanced:5"}) is None
    assert policy.train_problem("HuggingFaceTB/SmolLM2-135M-Instruct", "", {"task": "gsm8k"}) is None
    assert policy.train_problem("runs/x/checkpoints/step-000010", "runs/x/train_config.yaml", {}) is None
    for model, config_file, knobs, words in [
        ("/etc", "", {}, "model: /etc is outside the runs directory"),
        ("smollm2-135m", "/etc/passwd", {}, "config file: /etc/passwd is outside"),
        ("smollm2-135m", "", {"task": "data/x.jsonl"}, "task: data/x.jsonl is outside"),
        ("smollm2-135m", "", {"eval_task": "basic,../secret.jsonl"}, "eval_task: ../secret.jsonl is outside"),
        ("smollm2-135m", "", {"task": "runs/../../x.jsonl"}, "is outside"),
        ("smollm2-135m", "", {"rewards": "correctness,my.py:f"}, "unless the app was started with --allow-code"),
    ]:
        assert words in policy.train_problem(model, config_file, knobs)
    (root / "link").parent.mkdir(parents=True)
    (root / "link").symlink_to("/etc")  # a link inside the runs directory does not open the rest of the disk
    assert "is outside" in policy.model_problem("runs/link")
    allowed = Policy(root, (data,), allow_code=True)
    assert allowed.train_problem("smollm2-135m", "", {"task": "data/x.jsonl", "rewards": "my.py:f"}) is None
    assert "start the app with --data-dir" in policy.task_problem("task", "data/x.jsonl")


def test_the_policy_holds_for_what_a_config_file_or_a_resumed_run_brings(tmp_path, monkeypatch):
    """The page resolves the configuration the run would get (profile, file, fields, a resumed run's saved config)
    and applies the policy to it: a config file under the runs directory is read, not trusted."""
    from cpu_grpo.app import handlers

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    (root / "x").mkdir(parents=True)
    policy, names = Policy(root), ["steps"]

    def command(config_text: str, resume: bool = False, run_name: str = "new"):
        (root / "my.yaml").write_text(config_text)
        return handlers.train_command(policy, names, ["", "quick", "runs/my.yaml", run_name, resume, False, "", ""])

    run, cmd, _, error, cfg = command("steps: 3\n")
    assert error is None and cfg.steps == 3 and Path(cfg.output_dir) == root / "new"
    assert cmd[cmd.index("--config") + 1] == "runs/my.yaml"
    (tmp_path / "evil.py").write_text("def f(completions, **kw):\n    return [0.0] * len(completions)\n")
    for text, words in [
        ("rewards: [correctness, evil.py:f]\nreward_weights: [1, 1]\n", "run their code"),
        ("trust_remote_code: true\n", "never runs a model's own code"),
        ("task: /etc/shadow\n", "task: /etc/shadow is outside"),
        ("eval_task: basic,/etc/passwd\n", "eval_task: /etc/passwd is outside"),
        ("stages: [{name: a, task: /etc/hosts, steps: 2}]\n", "stage a: /etc/hosts is outside"),
        ("task: hf:/etc\n", "does not name a hub dataset"),
        ("task: hf:../secret\n", "does not name a hub dataset"),
        ("model: /etc\n", "model: /etc is outside"),
    ]:
        error = command(text)[3]
        assert error and words in error and "config file runs/my.yaml" in error, (text, error)
    # a run written by `cpu-grpo train` keeps its train_config.yaml: resuming it from the page reads that file
    (root / "x" / "train_config.yaml").write_text("task: basic\nrewards: [evil.py:f]\nreward_weights: [1]\n")
    error = command("steps: 3\n", resume=True, run_name="x")[3]
    assert "the run's saved train_config.yaml" in error and "run their code" in error
    # a run directory that is a link out of the runs directory is neither trained nor evaluated into
    (tmp_path / "elsewhere").mkdir()
    (root / "out").symlink_to(tmp_path / "elsewhere")
    assert "right under" in command("steps: 3\n", run_name="out")[3]
    assert "right under" in next(handlers.evaluate(policy, "out", "smollm2-135m", "basic", 5, 16))[0]
    # hub ids stay allowed, as typed and from a file; local directories named like one do not
    assert command("task: hf:openai/gsm8k\n")[3] is None
    (tmp_path / "openai" / "gsm8k").mkdir(parents=True)
    assert "does not name a hub dataset" in command("task: hf:openai/gsm8k\n")[3]
    assert policy.task_problem("task", "advanced+gsm8k") is None  # joined tasks: each part checked
    assert policy.task_problem("task", "countdown") is None and policy.task_problem("task", "code") is None


def test_the_page_refuses_datasets_builders_that_read_local_files(tmp_path, monkeypatch):
    """`hf:text` with a column map would train on every file under the page's working directory."""
    monkeypatch.chdir(tmp_path)
    policy = Policy(tmp_path / "runs")
    for spec in ("hf:text", "hf:json", "hf:csv:default:train", "hf:imagefolder", "hf:Parquet"):
        problem = policy.task_problem("task", spec)
        assert problem and "is a `datasets` builder, which reads local files" in problem, spec
        assert "is a `datasets` builder" in policy.train_problem("smollm2-135m", "", {"task": spec})
    assert policy.task_problem("task", "hf:openai/gsm8k") is None and policy.task_problem("task", "hf:gsm8k") is None


def test_a_config_file_that_is_an_alias_bomb_is_refused_at_once(tmp_path, monkeypatch):
    """286 bytes that expand to billions of values: refused in one sentence, from the page and the CLI alike."""
    from cpu_grpo.app import handlers

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs"
    root.mkdir()
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + \
        [f"{b}: &{b} [{', '.join(['*' + a] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    (root / "bomb.yaml").write_text("\n".join(levels) + "\n")
    t0 = time.monotonic()
    fields = ["", "quick", "runs/bomb.yaml", "new", False, False, "", ""]
    error = handlers.train_command(Policy(root), ["steps"], fields)[3]
    assert "aliases (*name) expand to over 100,000 values" in error and time.monotonic() - t0 < 5
    cli = subprocess.run([sys.executable, "-m", "cpu_grpo.cli", "plan", "--config", "runs/bomb.yaml"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "expand to over 100,000 values" in cli.stderr and len(cli.stderr) < 400


def test_the_page_starts_at_most_max_runs_at_once(tmp_path):
    takes = [sys.executable, "-c", "import json, os, sys, time; open(sys.argv[1], 'w').write(json.dumps({'pid': "
             "os.getpid()})); time.sleep(60)"]  # takes the lock, as `cpu-grpo train` does
    first, second = tmp_path / "first", tmp_path / "second"
    pid, message = runs.start([*takes, str(first / "run.lock")], first, max_runs=1)
    assert pid and "Started first" in message
    try:
        again, refusal = runs.start([*takes, str(second / "run.lock")], second, max_runs=1)
        assert again is None and "first is training: the page runs at most 1 at once" in refusal
        assert not (second / "console.log").exists()
    finally:
        runs.stop(first)
    deadline = time.time() + 10
    while runs.running_pid(first) and time.time() < deadline:
        time.sleep(0.05)
    pid, message = runs.start([*takes, str(second / "run.lock")], second, max_runs=1)
    assert pid and "Started second" in message
    runs.stop(second)


@pytest.mark.slow
def test_the_page_takes_no_upload_over_its_cap(tmp_path):
    """Gradio's upload route answers whether or not the page has an upload field: over MAX_UPLOAD it refuses."""
    import urllib.error
    import urllib.request

    from cpu_grpo.app import ui

    (tmp_path / "runs").mkdir()
    port = 7860 + os.getpid() % 1000
    import gradio as gr

    ui.launch(tmp_path / "runs", port=port, block=False)
    try:
        body = b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"x.bin\"\r\n\r\n" + \
            b"x" * (2 << 20) + b"\r\n--b--\r\n"
        request = urllib.request.Request(f"http://127.0.0.1:{port}/gradio_api/upload", data=body, method="POST",
                                         headers={"Content-Type": "multipart/form-data; boundary=b"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 413
    finally:
        gr.close_all()
