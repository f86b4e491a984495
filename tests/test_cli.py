"""The command line: fast --help, one-sentence errors, config overrides reach the run."""

from __future__ import annotations

import subprocess
import sys

from cpu_grpo.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "cpu_grpo.cli", *args], capture_output=True, text=True)


def test_help_does_not_import_torch():
    code = "import sys; from cpu_grpo.cli import main\ntry: main(['--help'])\nexcept SystemExit: pass\n" \
           "assert 'torch' not in sys.modules, 'torch imported for --help'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "train" in done.stdout and "eval" in done.stdout


def test_train_help_lists_config_fields():
    out = run_cli("train", "--help").stdout
    assert "--learning-rate" in out and "--num-generations" in out and "--profile" in out


def test_a_bool_field_alone_means_true(monkeypatch):
    import cpu_grpo.cli as cli

    seen = []
    monkeypatch.setattr(cli, "cmd_train", lambda args: seen.append(cli.config_from(args)[0]) or 0)
    for argv in (["train", "--skip-bad-lines", "--use-lora"], ["train", "--skip-bad-lines", "true", "--use-lora", "1"]):
        main(argv + ["--bf16", "false"])
    main(["train", "--bf16"])
    assert all(c.skip_bad_lines and c.use_lora and c.bf16 == "false" for c in seen[:2]) and len(seen) == 3
    assert seen[2].bf16 == "true"


def test_bad_config_is_one_sentence(capsys):
    assert main(["train", "--num-generations", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpu-grpo: num_generations must be >= 2") and err.count("\n") == 1


def test_bad_value_and_unknown_profile(capsys):
    assert main(["train", "--steps", "many"]) == 2
    assert "cannot read 'many' as int" in capsys.readouterr().err
    assert main(["train", "--profile", "fast"]) == 2
    assert "unknown profile 'fast'" in capsys.readouterr().err


def test_bad_data_path_is_one_sentence(tiny_model, tmp_path, capsys):
    code = main(["train", "--model", tiny_model, "--task", str(tmp_path / "nope.jsonl"), "--output-dir",
                 str(tmp_path / "run")])
    assert code == 2
    assert "not found" in capsys.readouterr().err


def test_malformed_jsonl_names_file_and_line(tiny_model, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "1+1?", "answer": "1 + 1 = 2\\n#### 2"}\n{"question": "oops"\n')
    assert main(["train", "--model", tiny_model, "--task", str(data), "--output-dir", str(tmp_path / "r")]) == 2
    assert f"{data}:2:" in capsys.readouterr().err
    assert not (tmp_path / "r" / "eval_before.jsonl").exists()  # reported before the base evaluation


def test_eval_command_on_a_checkpoint_dir(tiny_model, capsys):
    assert main(["eval", "--model", tiny_model, "--n", "4", "--max-new-tokens", "8"]) == 0
    assert "| basic | 4 |" in capsys.readouterr().out


def test_a_question_longer_than_the_context_is_one_sentence(tiny_model, tmp_path, capsys):
    """A valid but huge question (the tiny model's context is 1024 tokens) stops before any allocation for it."""
    import json

    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"question": "How many apples? " * 2000, "answer": "#### 2"}) + "\n")
    assert main(["eval", "--model", tiny_model, "--task", str(data), "--max-new-tokens", "8"]) == 2
    err = capsys.readouterr().err
    assert "tokens plus 8 new tokens exceeds the model's context of 1024" in err and "Traceback" not in err


def test_every_user_error_is_one_class():
    """The command line and the page catch UserError by type: every error a user can fix derives from it."""
    from cpu_grpo import config
    from cpu_grpo.data import rewards, tasks
    from cpu_grpo.engine import models
    from cpu_grpo.engine import sampler as sampler_mod
    from cpu_grpo.errors import RunDirError, UserError
    from cpu_grpo.eval import compare, metrics
    from cpu_grpo.train import runstate

    for cls in (config.ConfigError, tasks.TaskError, rewards.RewardError, models.ModelError, metrics.MetricError,
                compare.RunError, runstate.TrainingError, sampler_mod.PromptTooLong, RunDirError):
        assert issubclass(cls, UserError), cls


def test_a_start_refused_by_the_lock_touches_nothing_of_the_winners(tmp_path, capsys):
    """A second `cpu-grpo train` on a run directory whose run.lock a live process holds is refused in one sentence,
    and leaves that run's status.json, lock and files as they were (it wrote its lock error into the winner's
    status.json)."""
    import json
    import time

    run = tmp_path / "run"
    run.mkdir()
    winner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run / "run.lock").write_text(json.dumps({"pid": winner.pid, "started": time.time()}))
        (run / "status.json").write_text(json.dumps({"state": "evaluating", "pid": winner.pid, "stage": "base"}))
        (run / "train_config.yaml").write_text("steps: 3\n")
        before = {p.name: p.read_bytes() for p in run.iterdir()}
        for extra in ([], ["--resume"]):
            code = main(["train", "--profile", "demo", "--output-dir", str(run), "--eval-size", "0", *extra])
            err = capsys.readouterr().err
            assert code == 2 and err == (f"cpu-grpo: {run} is being trained by process {winner.pid}: wait for it to "
                                         "finish, stop it, or choose another --output-dir.\n")
            assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    finally:
        winner.kill()
        winner.wait()
