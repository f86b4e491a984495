"""The sandbox that runs model-written code, tried as the model it trains would try it: every way to forge a pass
or to leave the box scores 0 and touches nothing of the host (real processes, bubblewrap, the real limits), and
every way a program can misbehave ends in a failed run within its limits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cpu_grpo.data import codecheck, generated, sandbox
from cpu_grpo.data.verifiers import check_code_rows, code_reward, code_tests_reward, countdown_reward
from cpu_grpo.errors import RewardError, SandboxError

FAST = sandbox.Limits(seconds=3.0, cpu_seconds=10, memory_mb=256)  # the wall clock ends a busy loop first
TESTS = "check(square(3), 9)\ncheck(square(-2), 4)"
isolated = pytest.mark.skipif(sandbox.isolation().name == "none", reason="no sandbox here: "
                              f"{sandbox.isolation().detail}")


def score(code: str, tests: str = TESTS) -> tuple[float, float]:
    """(code_reward, code_tests_reward) of one completion holding `code`."""
    text = [f"```python\n{code}\n```"]
    return code_reward(text, tests=[tests])[0], code_tests_reward(text, tests=[tests])[0]


@pytest.fixture(autouse=True, scope="module")
def _sandbox_or_limits():
    """Where no sandbox works (a user without bubblewrap), the checker's own tests still run, with limits only."""
    sandbox.require(allow_unisolated=True)


def test_a_right_solution_passes_and_a_wrong_one_does_not():
    assert score("def square(n):\n    return n * n") == (1.0, 1.0)
    assert score("def square(n):\n    return n * 3") == (0.0, 0.5)  # right where n * 3 == n * n
    assert score("def square(n):\n    return float(n * n)") == (0.0, 0.0)  # 9.0 is not 9
    assert sandbox.run_python("print('hi')", FAST).passed
    bad = sandbox.run_python("assert 1 == 2", FAST)
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.output


# ---------------------------------------------------------------------------- a forged pass
FORGERIES = {
    # the old harness's pass token, a default argument of the harness function in __main__, printed with made-up
    # counts before an early exit
    "harness defaults": "import __main__, os\nh = getattr(__main__, '_harness', None)\n"
                        "print('\\n' + str(h and h.__defaults__[0]), 2, 2, flush=True)\nos._exit(0)",
    # the token from the process's initial environment (os.environ.pop does not clear it)
    "/proc/self/environ": "import os\nfor e in open('/proc/self/environ', 'rb').read().split(b'\\0'):\n"
                          "    if b'=' in e and len(e.split(b'=')[1]) == 32:\n"
                          "        print('\\n' + e.split(b'=')[1].decode(), 2, 2, flush=True)\nos._exit(0)",
    # a wrong solution whose stdout rewrites '0 2' into '2 2' at flush
    "stdout rewritten at flush": "import sys\nclass W:\n    def __init__(s, w): s.w, s.buf = w, ''\n"
                                 "    def write(s, t): s.buf += t; return len(t)\n"
                                 "    def flush(s): s.w.write(s.buf.replace(' 0 2', ' 2 2')); s.buf = ''; s.w.flush()\n"
                                 "sys.stdout = W(sys.stdout)\ndef square(n):\n    return 0",
    # a wrong solution that finds the checking code among the interpreter's objects and swaps what it runs
    "gc swaps the checker": "import gc\ndef outer():\n    x = 0\n    def fake(*a, **k):\n        x\n"
                            "        return ['int', 9]\n    return fake\nfake = outer()\n"
                            "for o in gc.get_objects():\n"
                            "    if getattr(o, '__name__', '') in ('check', 'encode') and hasattr(o, '__code__'):\n"
                            "        try: o.__code__ = fake.__code__ if o.__code__.co_freevars else "
                            "(lambda *a, **k: ['int', 9]).__code__\n        except ValueError: pass\n"
                            "def square(n):\n    return 0",
    # the statements to run, cleared from the caller's frame: 0 of 0 passed
    "frames cleared": "import sys\nf = sys._getframe(1).f_locals\n"
                      "for v in (f.get('statements'), (f.get('spec') or {}).get('calls')):\n"
                      "    if v is not None: v.clear()\ndef square(n):\n    return 0",
    # values written where the harness writes its own, with guesses, then an early exit
    "values forged on every descriptor": "import os, json\nfor fd in range(3, 20):\n    for i in range(2):\n"
                                         "        try: os.write(fd, (json.dumps({'i': i, 'value': ['int', 1]})"
                                         " + '\\n').encode())\n        except OSError: pass\nos._exit(0)",
    # an object equal to everything, against plain assert lines
    "always equal": "class Any:\n    def __eq__(self, other): return True\n    def __bool__(self): return True\n"
                    "def square(n):\n    return Any()",
    "an int subclass": "class I(int):\n    def __eq__(self, other): return True\ndef square(n):\n    return I(0)",
    "exit before the calls": "def square(n):\n    return n * n\nimport sys\nsys.exit(0)",
}


@pytest.mark.parametrize("name", FORGERIES)
def test_no_forged_pass(name):
    asserts = "assert square(3) == 9\nassert square(-2) == 4"
    assert score(FORGERIES[name]) == (0.0, 0.0), name
    assert score(FORGERIES[name], asserts) == (0.0, 0.0), name


def test_the_expected_values_never_reach_the_sandbox():
    """What the solution can read (its folder, its arguments, its environment, every process) holds the calls,
    never the values they must give."""
    spy = ("import os, sys\nprint(sys.argv)\nprint(open('/proc/self/environ', 'rb').read())\n"
           "for d in [os.path.dirname(sys.argv[0]) or '.', '.']:\n    for f in os.listdir(d):\n"
           "        p = os.path.join(d, f)\n        print(f, open(p).read() if os.path.isfile(p) else '')\n"
           "def f(x):\n    return x")
    result = sandbox.run_tests(spy, "check(f(1), 987654321)\nassert f(2) == 'secret-want'")
    assert "f(1)" in result.output and "987654321" not in result.output and "secret-want" not in result.output


@pytest.mark.parametrize("tests, why", [
    ("", "no test statement"), ("# nothing here", "no test statement"), ("import math", "no test statement"),
    ("assert square(3) == square(3)", "cannot be checked"), ("for i in range(3):\n    assert square(i) == i * i",
                                                            "cannot be checked"),
    ("check(square(3), 3 * 3)", "cannot be checked"),  # VALUE is not a literal
])
def test_tests_that_cannot_be_checked_are_refused_at_load(tests, why):
    with pytest.raises(codecheck.CodeTestsError, match=why):
        codecheck.parse_tests(tests)
    row = generated.generate_task("code", 1, seed=0)[0]
    bad = type(row)(**{**row.__dict__, "columns": {"tests": tests}, "id": "mine.jsonl:7"})
    with pytest.raises(RewardError, match="row mine.jsonl:7: "):
        check_code_rows([row, bad])


def test_every_form_of_test_is_checked_by_value():
    tests = ("import math\nassert is_even(4)\nassert not is_even(3)\nassert 3 in halves(6)\n"
             "assert halves(4) != [1]\nassert math.isclose(third(1), 0.3333, abs_tol=1e-3)\n"
             "assert halves(0) is None\nassert len(halves(8)) >= 2")
    right = ("def is_even(n):\n    return n % 2 == 0\ndef halves(n):\n    return [n // 2, n // 2] if n else None\n"
             "def third(x):\n    return x / 3")
    assert score(right, tests) == (1.0, 1.0)
    wrong = right.replace("return n % 2 == 0", "return True").replace("return x / 3", "return x / 2")
    assert score(wrong, tests) == (0.0, 5 / 7)


# ---------------------------------------------------------------------------- out of the box
@isolated
def test_no_secrets_of_the_host_can_be_read():
    """Not the system's password hashes, keys, caches, sockets or the project, nor the token in the environment of
    a host process (a trainer started with HF_TOKEN set)."""
    trainer = subprocess.Popen(["sleep", "30"], env={"HF_TOKEN": "hf_sandbox_secret"})
    try:
        spy = ("import os, glob\nfor p in ['/etc/shadow', '/root/.ssh', os.path.expanduser('~/.cache/huggingface'),"
               " '/home', '/run', '/var/run/docker.sock', '/work']:\n    print(p, os.path.exists(p))\n"
               "for p in glob.glob('/proc/*/environ'):\n    try: print(p, open(p, 'rb').read())\n"
               "    except OSError as e: print(p, e)\nprint(os.getuid(), os.getgid())")
        out = sandbox.run_python(spy, FAST).output
    finally:
        trainer.kill()
        trainer.wait()
    assert "hf_sandbox_secret" not in out and "65534 65534" in out
    assert all(f"{p} False" in out for p in ("/etc/shadow", "/root/.ssh", "/home", "/run", "/work")), out


@isolated
def test_nothing_of_the_host_can_be_written(tmp_path):
    """Its checkpoints, its reward file and the packages the trainer imports next stay as they were."""
    import cpu_grpo

    targets = [tmp_path / "reward.py", Path(cpu_grpo.__file__), Path(os.__file__)]
    tmp_path.chmod(0o777)
    targets[0].write_text("def reward(completions, **kw):\n    return [0.0] * len(completions)\n")
    before = [t.read_bytes() for t in targets]
    vandal = "".join(f"try:\n    open({str(t)!r}, 'a').write('pwned = 1')\nexcept OSError as e:\n    print(e)\n"
                     for t in targets) + "def square(n):\n    return n * n"
    assert score(vandal) == (1.0, 1.0)  # it still solves the task: the box holds, not the checker
    assert [t.read_bytes() for t in targets] == before


@isolated
def test_no_way_out_through_sockets_or_namespaces(tmp_path):
    path = tmp_path / "host.sock"
    tmp_path.chmod(0o777)
    listeners = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX), socket.socket()]
    listeners[0].bind(str(path))
    listeners[1].bind(b"\0cpu-grpo-test-abstract")
    listeners[2].bind(("127.0.0.1", 0))
    for s in listeners:
        s.listen()
    port = listeners[2].getsockname()[1]
    tries = (f"import socket, ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"for name, family, where in [('file', socket.AF_UNIX, {str(path)!r}),\n"
             f"        ('abstract', socket.AF_UNIX, b'\\0cpu-grpo-test-abstract'),\n"
             f"        ('tcp', socket.AF_INET, ('127.0.0.1', {port}))]:\n"
             f"    try: socket.socket(family).connect(where); print(name, 'CONNECTED')\n"
             f"    except OSError as e: print(name, 'refused', e.errno)\n"
             f"fd = os.open('/proc/1/ns/net', os.O_RDONLY)\n"
             f"print('setns', libc.setns(fd, 0), ctypes.get_errno())\n"
             f"print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
             f"print('ptrace', libc.ptrace(0, 0, 0, 0), ctypes.get_errno())\n")  # PTRACE_TRACEME: seccomp
    out = sandbox.run_python(tries, FAST).output
    for s in listeners:
        s.close()
    assert "CONNECTED" not in out and out.count("refused") == 3, out
    assert "setns -1 1" in out and "unshare -1 1" in out and "ptrace -1 1" in out, out  # EPERM


def _left_behind(marker: str, wait: float = 60.0) -> list[str]:
    """Processes still running whose command line holds `marker`, once those dying have had `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        left = [a for a in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
                if marker in a and "ps -eo" not in a]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


@isolated
@pytest.mark.parametrize("program, why", [
    ("while True:\n    pass", "a busy loop"),
    ("import time\ntime.sleep(60)", "a sleep"),
    ("import os\nfor _ in range(6):\n    os.fork()\nimport time\ntime.sleep(60)", "forks that sleep"),
    ("import os\nos.setsid()\nimport time\ntime.sleep(60)", "a new session"),
    ("import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '31.4159'])",
     "a forked child in its own session, left behind"),
    pytest.param("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", "a fork bomb",
                 marks=pytest.mark.slow),
])
def test_what_hangs_or_forks_dies_with_the_sandbox(program, why):
    t0 = time.monotonic()
    result = sandbox.run_python(program, FAST)
    assert time.monotonic() - t0 < FAST.seconds + 3, why
    assert not _left_behind("/task/harness.py") and not _left_behind("31.4159"), f"{why}: a process survived"
    assert why.startswith("a forked child") or not result.passed, why


def test_without_a_sandbox_what_a_program_left_behind_dies_with_it(monkeypatch):
    """--allow-unisolated-code: no pid namespace to end; children a program left running in sessions of their own
    are found by their run's mark and killed when its scoring ends."""
    import psutil

    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation("none", "bubblewrap is not installed"))
    program = ("import subprocess\nfor _ in range(3):\n    p = subprocess.Popen(['sleep', '27.1828'], "
               "start_new_session=True)\n    print(p.pid, flush=True)")
    result = sandbox.run_python(program, FAST)
    pids = [int(x) for x in result.output.split()]
    assert result.passed and len(pids) == 3, result.output

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert not any(map(alive, pids)) and not _left_behind("27.1828")


def test_memory_disk_and_output_are_capped():
    result = sandbox.run_python("x = bytearray(10 * 2**30)", FAST)
    assert not result.passed and "MemoryError" in result.output
    result = sandbox.run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", FAST)
    assert not result.passed and len(result.output) <= 2000
    if sandbox.isolation().name != "none":  # processes: nobody's, counted (root's never are: the trainer is root)
        forks = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                 "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
                 "except OSError:\n    print('forks', n, flush=True)")
        said = sandbox.run_python(forks, FAST).output.split()
        assert said[0] == "forks" and int(said[1]) < sandbox.Limits().processes, said
        fill = ("import os, tempfile\nd = tempfile.gettempdir()\nfor i in range(400):\n"
                "    open(os.path.join(d, f'f{i}'), 'wb').write(b'x' * 2**20)")
        result = sandbox.run_python(fill, FAST)
        assert not result.passed and "No space left" in result.output


def test_no_sandbox_means_no_code_reward_unless_the_user_accepts(monkeypatch):
    monkeypatch.setattr(sandbox, "isolation", lambda: sandbox.Isolation("none", "bubblewrap is not installed"))
    with pytest.raises(SandboxError, match="no sandbox works here .bubblewrap is not installed.: install "
                                           "bubblewrap, or .*--allow-unisolated-code"):
        sandbox.require(allow_unisolated=False)
    assert sandbox.require(allow_unisolated=True).startswith("code sandbox: NO isolation")


@pytest.mark.slow
def test_a_run_says_which_sandbox_it_got_or_is_refused(tmp_path):
    """`cpu-grpo eval` of the code example where bubblewrap cannot be found: one sentence, before any model loads."""
    env = {**os.environ, "PATH": str(tmp_path)}
    task = Path(__file__).resolve().parents[2] / "examples" / "code-task" / "tasks.jsonl"
    cmd = [sys.executable, "-m", "cpu_grpo", "eval", "--task", str(task), "--correct-reward", "code",
           "--model", str(tmp_path / "no-model-needed")]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "no sandbox works here (bubblewrap is not installed" in last
    assert "Traceback" not in refused.stderr, refused.stderr


def test_the_code_task_checks_real_solutions():
    rows = generated.generate_task("code", 30, seed=0, split="test")
    assert len({ex.template for ex in rows}) >= 6 and all(not ex.math for ex in rows)
    refs = {"add_k": "def add_k(xs):\n    return [x + {k} for x in xs]"}
    row = next(ex for ex in rows if ex.template == "add_k")
    k = int(row.question.split("with ")[1].split(" added")[0])
    solution = refs["add_k"].format(k=k)
    assert code_reward([f"```python\n{solution}\n```", "```python\ndef add_k(xs):\n    return xs\n```"],
                       tests=[row.columns["tests"]] * 2) == [1.0, 0.0]


def test_no_code_template_fills_the_held_out_set():
    """Templates are drawn in turn: 200 held-out rows (an evaluation's default) with no template over 20% of them, and
    none of them among the training rows."""
    from collections import Counter

    held_out = generated.generate_task("code", 200, seed=0, split="test")
    counts = Counter(ex.template for ex in held_out)
    assert len(held_out) == 200 and max(counts.values()) <= 40 and len(counts) == len(generated.CODE_TEMPLATES), counts
    assert not {ex.question for ex in held_out} & {ex.question for ex in generated.generate_task("code", 1000, seed=0)}


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
