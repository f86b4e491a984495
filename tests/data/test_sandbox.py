"""The sandbox that runs model-written code: every way a program can misbehave ends in a failed run within its
limits, with the trainer's process untouched (real processes, the real limits)."""

from __future__ import annotations

import os
import time

import pytest

from cpu_grpo.data import generated, sandbox
from cpu_grpo.data.verifiers import code_reward, code_tests_reward, countdown_reward

FAST = sandbox.Limits(seconds=3.0, cpu_seconds=10, memory_mb=256)  # the wall clock ends a busy loop first


def test_a_plain_program_passes_and_a_failing_one_does_not():
    assert sandbox.run_python("print('hi')", FAST).passed
    bad = sandbox.run_python("assert 1 == 2", FAST)
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.output


@pytest.mark.parametrize("program, why", [
    ("while True:\n    pass", "a busy loop"),
    ("import time\ntime.sleep(60)", "a sleep"),
    ("import os\nfor _ in range(6):\n    os.fork()\nimport time\ntime.sleep(60)", "forks that sleep"),
    ("import os\nos.setsid()\nimport time\ntime.sleep(60)", "a new session"),
])
def test_what_hangs_is_killed_at_its_wall_clock_limit(program, why):
    t0 = time.monotonic()
    result = sandbox.run_python(program, FAST)
    assert not result.passed and result.status in ("timeout", "killed"), why
    assert time.monotonic() - t0 < FAST.seconds + 3, why
    time.sleep(0.2)
    assert "cpu-grpo-sandbox" not in os.popen("ps -eo args").read(), f"{why}: a process survived"


def test_ten_gigabytes_is_refused_and_output_is_capped():
    result = sandbox.run_python("x = bytearray(10 * 2**30)", FAST)
    assert not result.passed and "MemoryError" in result.output
    result = sandbox.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", FAST)
    assert not result.passed and len(result.output) <= 2000


def test_no_network_and_no_files_outside_its_directory():
    if not sandbox.isolation():
        pytest.skip("unshare is not permitted here: the sandbox runs without its own network namespace")
    net = sandbox.run_python("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)", FAST)
    assert not net.passed and ("unreachable" in net.output or "refused" in net.output or "Errno" in net.output)
    here = sandbox.run_python("import os\nprint(os.getcwd())\nprint(sorted(os.environ))", FAST)
    assert "cpu-grpo-sandbox-" in here.output and "HF_HOME" not in here.output


def test_the_code_task_checks_real_solutions():
    rows = generated.generate_task("code", 30, seed=0, split="test")
    assert len({ex.template for ex in rows}) >= 6 and all(not ex.math for ex in rows)
    refs = {"add_k": "def add_k(xs):\n    return [x + {k} for x in xs]"}
    row = next(ex for ex in rows if ex.template == "add_k")
    k = int(row.question.split("with ")[1].split(" added")[0])
    solution = refs["add_k"].format(k=k)
    assert code_reward([f"```python\n{solution}\n```", "```python\ndef add_k(xs):\n    return xs\n```"],
                       tests=[row.columns["tests"]] * 2) == [1.0, 0.0]


def test_the_code_tasks_tests_tell_a_solution_from_a_guess():
    """Every row's five tests: no expected output more than twice (a constant passes at most 2) and at most one
    output equal to its input (returning the input passes at most 1), the partial credit a guess can collect."""
    import ast

    for ex in generated.generate_task("code", 400, seed=0, split="train"):
        calls = [ast.parse(line).body[0].value for line in ex.columns["tests"].splitlines()]
        args = [ast.literal_eval(c.args[0].args[0]) for c in calls]
        outs = [ast.literal_eval(c.args[1]) for c in calls]
        assert len(calls) == 5 and max([repr(o) for o in outs].count(repr(o)) for o in outs) <= 2, ex.columns["tests"]
        assert sum(repr(o) == repr(a) for o, a in zip(outs, args, strict=True)) <= 1, ex.columns["tests"]
    guesses = {"def clamp(xs):\n    return xs": "clamp", "def sequence(n):\n    return 0": "sequence"}
    for guess, name in guesses.items():
        row = next(ex for ex in generated.generate_task("code", 400, seed=0, split="test") if ex.template == name)
        assert code_tests_reward([f"```python\n{guess}\n```"], tests=[row.columns["tests"]]) <= [0.4]


def test_countdown_rows_are_solvable_by_their_reference():
    rows = generated.generate_task("countdown", 50, seed=1, split="train")
    assert {ex.difficulty for ex in rows} == {"countdown-3", "countdown-4"}
    got = countdown_reward([f"<answer>{ex.answer}</answer>" for ex in rows], nums=[ex.columns["nums"] for ex in rows],
                           target=[ex.columns["target"] for ex in rows])
    assert got == [1.0] * 50
    assert generated.generate_task("countdown", 5, seed=1) == generated.generate_task("countdown", 5, seed=1)
    test_ids = {ex.question for ex in generated.generate_task("countdown", 200, seed=1, split="test")}
    assert not test_ids & {ex.question for ex in generated.generate_task("countdown", 500, seed=1)}
