import sys

import pytest

from cpu_grpo.data import scoring
from cpu_grpo.data.answers import answers_match, completion_text, extract_answer, parse_number
from cpu_grpo.data.rewards import (
    BUILTIN_REWARDS,
    correctness_reward,
    format_reward,
    load_reward,
    strict_correctness_reward,
)
from cpu_grpo.errors import RewardError

# ---------------------------------------------------------------------------- text and numbers


def test_completion_text():
    assert completion_text("abc") == "abc"
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 5"}]
    assert completion_text(conversation) == "#### 5"
    parts = [{"type": "text", "text": "a"}, {"text": "b"}]
    assert completion_text([{"role": "assistant", "content": parts}]) == "ab"
    assert completion_text([]) == ""
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    with pytest.raises(RewardError):
        completion_text(5)


@pytest.mark.parametrize(
    "s, expected",
    [
        ("1,234", 1234.0),
        ("$18", 18.0),
        ("3.50", 3.5),
        ("-5", -5.0),
        ("18.", 18.0),
        ("1/2", 0.5),
        ("50%", 50.0),
        ("-$5", -5.0),
        ("$-5", -5.0),
        (" 7 ", 7.0),
        ("+3", 3.0),
        (".5", 0.5),
        ("-3/4", -0.75),
        ("18.00", 18.0),
        ("1,234.5,", 1234.5),
        ("ten", None),
        ("", None),
        (".", None),
        ("1/0", None),
        ("inf", None),
        ("nan", None),
        ("1.2.3", None),
        ("3 apples", None),
    ],
)
def test_parse_number(s, expected):
    assert parse_number(s) == expected


@pytest.mark.parametrize(
    "text, auto, strict, flexible",
    [
        # GSM8K style: everything finds it.
        ("3 + 4 = 7 apples.\n#### 7", "7", "7", "7"),
        # Last "####" wins; trailing '.' and ',' are stripped.
        ("#### 3\nno wait\n#### 1,234.", "1,234", "1,234", "1,234"),
        # lm-eval strict needs exactly "#### " then digits; auto reads "$" and markdown.
        ("#### $1,234.50", "$1,234.50", None, "$1,234.50"),
        ("#### **18**", "18", None, "18"),
        ("####\n18 dollars", "18", None, "18"),
        # \boxed beats the last number; nested braces and \frac are handled.
        ("so \\boxed{18} and then 5", "18", None, "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "1/2", None, "2"),
        ("\\boxed{-\\dfrac{3}{4}}", "-3/4", None, "4"),
        ("\\boxed{1{,}000 \\text{ dollars}}", "1,000", None, "000"),
        # Unclosed box (truncated output) falls through to the last number.
        ("\\boxed{12", "12", None, "12"),
        # Answer phrases, last one wins, any case.
        ("I think the answer is 5. Wait: The answer is 7. Check: 7 * 2 = 14", "7", None, "14"),
        ("**Final Answer:** $42.", "$42", None, "$42"),
        ("The answer is:\n\n$18$", "$18", None, "$18$"),
        # Last number fallback; a minus after a digit is subtraction, not a sign.
        ("x = 10-4 = 6", "6", None, "6"),
        ("it drops to -5", "-5", None, "-5"),
        ("the numbers 3,4,5", "5", None, "3,4,5"),
        ("no numbers here", None, None, None),
        # flexible-extract's regex also matches "..."; like lm-eval, that is no answer.
        ("It is 5 ...", "5", None, None),
    ],
)
def test_extract_answer(text, auto, strict, flexible):
    assert extract_answer(text) == auto
    assert extract_answer(text, "auto") == auto
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_extract_answer_bad_mode():
    with pytest.raises(RewardError, match="use 'auto', 'strict' or 'flexible'"):
        extract_answer("1", "loose")


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("18.00", "18", True),
        ("$1,234", "1234", True),
        ("1,234", "1,234", True),
        ("0.5", "1/2", True),
        ("-5", "-5", True),
        ("18", "Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 18", True),  # full GSM8K solution as gold
        ("0.3333333", "1/3", True),  # |diff| / (1/3) = 1e-7 < 1e-6
        ("0.3333", "1/3", False),  # 1e-4 relative
        ("1234568", "1234567", False),  # integers must match exactly
        ("17", "18", False),
        (None, "18", False),
        ("yes", "Yes", True),
        ("18", "eighteen", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


# ---------------------------------------------------------------------------- reward functions


def test_correctness_rewards_strings_and_conversations():
    completions = ["so #### 18", "The answer is 17.", [{"role": "assistant", "content": "\\boxed{18}"}], ""]
    got = correctness_reward(completions, answer=["18", "18", 18, "18"], prompts=["p"] * 4)
    assert got == [1.0, 0.0, 1.0, 0.0]
    got = strict_correctness_reward(completions, answer=["18"] * 4, difficulty=[1] * 4)
    assert got == [1.0, 0.0, 0.0, 0.0]


def test_correctness_reward_misaligned_columns():
    with pytest.raises(RewardError, match="2 completions but 1 values of column 'answer'"):
        correctness_reward(["1", "2"], answer=["1"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3 + 4 = 7\n#### 7", 1.0),  # 0.5 marker + 0.25 at the end + 0.25 work
        ("Work: <<3*4=12>>\n#### 12.\n", 1.0),  # calculator annotation counts as work; '.' is not substantial
        ("3 + 4 = 7\n#### 7 apples", 0.75),  # words after the marker
        ("#### 7\n3 + 4 = 7", 0.5),  # work only after the marker; a digit after it
        ("#### 7", 0.75),  # no work
        ("3 + 4 = 7\n#### 7\n#### \n#### \n#### ", 0.75),  # bare '####' lines after the answer: it never ends
        ("3 + 4 = 7\n#### 7 #", 0.75),
        ("3 + 4 = 7\n**#### 7**.\n", 1.0),  # markdown and a full stop close the answer
        ("####", 0.0),  # no number
        ("3 + 4 = 7", 0.25),  # work, no marker
        ("3 + 4 is 7", 0.0),  # no '='
        ("x = 7", 0.0),  # no arithmetic
        ("", 0.0),
    ],
)
def test_format_reward(text, expected):
    assert format_reward([text], answer=["7"]) == [expected]
    assert format_reward([[{"role": "assistant", "content": text}]]) == [expected]


def test_builtins_take_extra_columns_and_return_floats():
    columns = dict(answer=["1"], prompts=["q"], difficulty=[3], pattern=["1"], nums=[[1]], target=[1],
                   tests=["check(len('ab'), 2)"], rg_task=["rg:chain_sum"], rg_seed=[0], rg_index=[0],
                   environments=[type("Game", (), {"get_reward": lambda self: 1.0})()])
    import importlib.util

    for name, fn in BUILTIN_REWARDS.items():
        if name == "reasoning_gym" and importlib.util.find_spec("reasoning_gym") is None:
            continue  # the `rg` extra, which `make test` installs where it can build
        out = fn(["#### 1"], **columns)
        assert isinstance(out, list) and all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in out), fn


# ---------------------------------------------------------------------------- load_reward


def test_load_builtin_and_module():
    assert load_reward("correctness") is correctness_reward
    assert load_reward("cpu_grpo.data.rewards:format_reward") is format_reward


def test_overlong_punishes_the_last_quarter_of_the_run_limit_in_tokens():
    fn = load_reward("overlong", 256)  # 0 up to 192 tokens, then down to -1 at 256
    ids = [[7] * n for n in (10, 192, 224, 256)]
    assert fn(["x"] * 4, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0]
    with pytest.raises(RewardError, match="needs the completion limit"):
        load_reward("overlong")
    with pytest.raises(RewardError, match="got 1 completions but 2 values of column 'completion_ids'"):
        fn(["x"], completion_ids=ids[:2])


def test_load_file_with_function(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text(
        "from dataclasses import dataclass\n"
        "@dataclass\nclass Cfg:\n    bonus: float = 2.0\n"
        "def length_reward(completions, **kw):\n    return [float(len(c)) for c in completions]\n"
        "def helper():\n    pass\n"
    )
    fn = load_reward(f"{f}:length_reward")
    assert fn.__name__ == "length_reward"
    assert fn(["ab", "c"], answer=["1", "2"]) == [2.0, 1.0]
    assert load_reward(str(f)).__name__ == "length_reward"  # the one public *reward function


def test_load_file_alone_ignores_imported_and_private(tmp_path):
    f = tmp_path / "r.py"
    f.write_text(
        "from cpu_grpo.data.rewards import correctness_reward\n"
        "def _private_reward(completions, **kw):\n    return []\n"
        "def mine_reward(completions, **kw):\n    return [0.0] * len(completions)\n"
    )
    assert load_reward(str(f)).__name__ == "mine_reward"


def test_load_file_alone_ambiguous_or_none(tmp_path):
    two = tmp_path / "two.py"
    two.write_text("def a_reward(c, **k):\n    return []\ndef b_reward(c, **k):\n    return []\n")
    with pytest.raises(RewardError, match=r"several \(a_reward, b_reward\); name one as"):
        load_reward(str(two))
    none = tmp_path / "none.py"
    none.write_text("def score(c, **k):\n    return []\n")
    with pytest.raises(RewardError, match=r"functions there: score\)"):
        load_reward(str(none))


def test_load_callable_without_name_gets_one(tmp_path):
    f = tmp_path / "p.py"
    f.write_text(
        "import functools\n"
        "def base(completions, scale, **kw):\n    return [scale] * len(completions)\n"
        "scaled = functools.partial(base, scale=3.0)\n"
    )
    fn = load_reward(f"{f}:scaled")
    assert fn.__name__ == "scaled"
    assert fn(["a", "b"], answer=["1", "2"]) == [3.0, 3.0]


def test_load_errors_are_one_sentence(tmp_path):
    f = tmp_path / "foo.py"
    f.write_text("def baz(c, **k):\n    return []\ndef qux(c, **k):\n    return []\nX = 3\n")
    with pytest.raises(RewardError, match=r"file .*foo.py has no function 'bar'; available: baz, qux"):
        load_reward(f"{f}:bar")
    with pytest.raises(RewardError, match="has 'X' but it is not callable"):
        load_reward(f"{f}:X")
    with pytest.raises(RewardError, match="does not exist; check the path"):
        load_reward(f"{tmp_path / 'missing.py'}:fn")
    with pytest.raises(RewardError, match="does not exist"):
        load_reward(str(tmp_path / "missing.py"))
    with pytest.raises(RewardError, match="is not a builtin .*correctness.*'package.module:function'"):
        load_reward("corectness")
    with pytest.raises(RewardError, match="importing module 'no_such_pkg_xyz.mod' failed"):
        load_reward("no_such_pkg_xyz.mod:fn")
    with pytest.raises(RewardError, match="module cpu_grpo.data.rewards has no function 'nope'"):
        load_reward("cpu_grpo.data.rewards:nope")


def test_load_file_that_raises(tmp_path):
    f = tmp_path / "broken.py"
    f.write_text("def ok_reward(c, **k):\n    return []\nraise RuntimeError('boom')\n")
    before = set(sys.modules)
    with pytest.raises(RewardError, match=r"running .*broken.py failed \(RuntimeError: boom\); fix"):
        load_reward(f"{f}:ok_reward")
    assert set(sys.modules) == before  # the half-loaded module is not left behind


@pytest.mark.parametrize("values, words", [
    (0.5, "returned a float '0.5' for 2 completions: return a list"),
    ([1.0], "returned a list of length 1 for 2 completions"),
    (["1.0", 0.0], "returned '1.0' \\(str\\): return floats"),
    ([{"a": 1}, 0.0], "returned \"{'a': 1}\" \\(dict\\)"),
    ([float("-inf"), 0.0], "returned -inf: return finite floats"),
])
def test_bad_reward_output_names_the_function(values, words):
    from cpu_grpo.data.rewards import as_scores

    with pytest.raises(RewardError, match=f"reward function mine {words}"):
        as_scores("mine", values, 2)


# ---------------------------------------------------------------------------- a time limit on each call
SLOW = '''
import os
import signal
import time


def hang_reward(completions, **kwargs):
    if os.environ.get("HANG_MARK"):
        open(os.environ["HANG_MARK"], "w").close()  # the test's cue: the call has begun
    try:
        time.sleep(600)
    except Exception:  # a reward's own `except Exception` does not swallow the limit
        pass
    return [1.0] * len(completions)


def spin_reward(completions, **kwargs):
    while True:
        pass


def alarm_reward(completions, **kwargs):
    """Sets SIGALRM for itself (as math_verify's timeouts do), which works only in the main thread."""
    old = signal.signal(signal.SIGALRM, lambda *a: None)
    signal.alarm(5)
    try:
        return [2.0] * len(completions)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
'''


@pytest.fixture
def slow_file(tmp_path):
    scoring._late.clear()
    path = tmp_path / "slow_rewards.py"
    path.write_text(SLOW)
    return path


def test_a_reward_that_hangs_scores_zero_at_its_time_limit_then_stops_the_run(slow_file):
    """A reward function that never returns held the run forever: each call is cut at `reward_timeout`, its batch
    scores 0 with one warning, and 3 batches in a row stop the run with one sentence."""
    import signal
    import time

    from cpu_grpo.data.rewards import TIMEOUTS_IN_A_ROW, call_reward

    handler = signal.getsignal(signal.SIGURG)
    lines = []
    for spec in ("hang_reward", "spin_reward"):
        fn = load_reward(f"{slow_file}:{spec}")
        for _ in range(TIMEOUTS_IN_A_ROW - 1):
            t0 = time.monotonic()
            assert call_reward(fn, ["a", "b"], {}, ["r1", "r2"], lines.append, limit=0.3) == [0.0, 0.0]
            assert time.monotonic() - t0 < 5
            assert lines.pop() == (f"warning: reward function {spec} ran past its limit of 0.3 s on a batch of 2 "
                                   "completions, which scored 0: give it more time with --reward-timeout if it "
                                   "needs it")
        with pytest.raises(RewardError) as err:
            call_reward(fn, ["a", "b"], {}, ["r1", "r2"], lines.append, limit=0.3)
        assert str(err.value) == (f"reward function {spec} ran past its limit of 0.3 s on 3 batches in a row: fix "
                                  "it (a loop that never ends, a wait for something that never comes), or give it "
                                  "more time with --reward-timeout")
    assert not lines and signal.getsignal(signal.SIGURG) == handler  # the signal's handler is put back
    # a call within its limit runs in the main thread as before (signals of its own work) and resets the count
    fn = load_reward(f"{slow_file}:hang_reward")
    call_reward(fn, ["a"], {}, ["r1"], lines.append, limit=0.3)
    assert call_reward(load_reward(f"{slow_file}:alarm_reward"), ["a"], {}, ["r1"], limit=30) == [2.0]
    assert scoring._late == {"hang_reward": 1}
    assert call_reward(format_reward, ["#### 4"], {}, ["r1"], limit=30) == [0.75]
    pytest.importorskip("math_verify")
    assert call_reward(load_reward("math"), ["so \\boxed{42}"], {"answer": ["42"]}, ["r1"], limit=30) == [1.0]


def test_a_stop_interrupts_a_reward_that_hangs(slow_file):
    import time

    from cpu_grpo.data.rewards import RewardStopped, call_reward

    fn, t0 = load_reward(f"{slow_file}:hang_reward"), time.monotonic()
    with pytest.raises(RewardStopped):
        call_reward(fn, ["a"], {}, ["r1"], limit=300, stop=lambda: time.monotonic() > t0 + 0.2)
    assert time.monotonic() - t0 < 5 and not scoring._late


def test_a_step_whose_reward_hangs_ends_within_its_time_limit(slow_file):
    """The step's scoring (step.score) with reward_timeout 0.5: the hanging function's scores are 0, the others'
    are kept, and it ends in about the limit."""
    import time

    from cpu_grpo.config import build
    from cpu_grpo.data.example import Example
    from cpu_grpo.train.rollout import Rollout, score

    cfg = build(None, None, {"rewards": f"{slow_file}:hang_reward,format", "reward_weights": "1,0.5",
                             "reward_timeout": "0.5", "num_generations": 2})
    assert build().reward_timeout == 120  # generous by default
    rollout = Rollout([Example("2 + 2?", "4", "basic", id="q1")], [[1, 2]], [[3], [4]], ["2 + 2 = 4\n#### 4", "no"],
                      [False, False])
    lines, t0 = [], time.monotonic()
    scored = score(cfg, [load_reward(spec) for spec in cfg.rewards], rollout, lines.append)
    total, per_fn = scored.total, scored.per_fn
    assert time.monotonic() - t0 < 5 and len(lines) == 1 and "hang_reward ran past its limit of 0.5 s" in lines[0]
    assert per_fn == {"hang_reward": [0.0, 0.0], "format_reward": [1.0, 0.0]} and total.tolist() == [0.5, 0.0]


@pytest.mark.slow
def test_sigterm_during_a_reward_that_hangs_stops_the_run(tiny_model, slow_file, tmp_path):
    """A real `cpu-grpo train` whose reward function hangs: one SIGTERM stops it in seconds, not at the time limit
    (300 s here) and not never; the step's rollout is discarded, and the message says how to go on."""
    import os
    import signal
    import subprocess
    import time

    mark, out = tmp_path / "reward-called", tmp_path / "run"
    cmd = [sys.executable, "-m", "cpu_grpo.cli", "train", "--profile", "demo", "--model", tiny_model, "--output-dir",
           str(out), "--steps", "3", "--prompts-per-step", "2", "--num-generations", "2", "--max-new-tokens", "4",
           "--eval-size", "0", "--train-size", "20", "--rewards", f"{slow_file}:hang_reward", "--reward-weights", "1",
           "--reward-timeout", "300"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HANG_MARK": str(mark)})
    try:
        deadline = time.monotonic() + 300
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mark.exists(), proc.communicate(timeout=60)[0] if proc.poll() is not None else "no reward call"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and time.monotonic() - t0 < 60, rest
    assert "stopped before the first step: run the same command again" in rest and "Traceback" not in rest
    assert not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text()  # no step was logged


def test_an_evaluation_judge_has_the_runs_time_limit(slow_file):
    """The reward that decides "correct" in an evaluation is cut at the run's reward_timeout too (it was unlimited)."""
    import time

    from cpu_grpo.data.example import Example
    from cpu_grpo.eval.evaluate import Judge

    judge = Judge.of([f"{slow_file}:hang_reward"], time_limit=0.3)
    rows = [Example("Say hi", "", "mine", id="r1", math=False)]
    t0, lines = time.monotonic(), []
    assert judge.scores(rows, ["hi"], [[1]], lines.append) == [False]
    assert time.monotonic() - t0 < 5 and "ran past its limit of 0.3 s" in lines[0]
    scoring._late.clear()


def test_a_reward_too_large_to_train_on_is_named():
    """+-1e300 is finite, but every step then said "the gradient is not finite: update skipped" and the run
    learned nothing, naming no reward."""
    from cpu_grpo.data.rewards import as_scores
    from cpu_grpo.errors import RewardError

    assert as_scores("mine", [1e6, -1e6, 0.5], 3) == [1e6, -1e6, 0.5]
    for value in (1e300, -1e300, float("inf"), 2e6):
        with pytest.raises(RewardError, match=r"reward function mine returned .*within \+-1e\+06 \(scale it"):
            as_scores("mine", [0.0, value], 2)
