"""Reward functions for math word problems, with TRL's signature `f(completions, **columns) -> list[float]`.

`completions` is a list of strings, or (TRL conversational format) a list of message lists, in which
case the content of the last message is scored. Dataset columns arrive as keyword lists aligned with
`completions` (`answer=[...]`, `prompts=[...]`, ...), so every reward accepts `**kwargs`, and a reward
function written for TRL works here unchanged. `load_reward` turns a string from a config or the
command line into such a function; scoring.py calls them on a batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import RewardError
from . import catalogue, sandbox, verifiers
from .answers import NUMBER, answers_match, completion_text, extract_answer
from .reward_model import RewardModel, is_reward_model
from .scoring import MAX_REWARD, TIMEOUTS_IN_A_ROW, RewardStopped, as_scores, call_reward  # noqa: F401 (rewards.*)

RewardFn = Callable[..., list[float]]

_MARKER_RE = re.compile(r"####[ \t]*(" + NUMBER + ")")
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")  # \boxed{...}, one level of inner braces
_ARITH_RE = re.compile(r"\d\s*(?:[-+*/×÷x]|\\times|\\cdot|\\div)\s*\(?\$?\d")
_ENDING_RE = re.compile(r"[\s.,;:!*_`)\]$\\]*")  # what may follow a final answer: spaces, closing punctuation


# ---------------------------------------------------------------------------- reward functions


def _check_aligned(completions: Sequence, column: Sequence, name: str) -> None:
    if len(completions) != len(column):
        raise RewardError(
            f"got {len(completions)} completions but {len(column)} values of column {name!r}; "
            f"pass one {name!r} per completion"
        )


def correctness_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the answer found by `extract_answer(text, "auto")` matches `answer`, else 0.0.

    >>> correctness_reward(["so #### 18", "I think 17", "The answer is 18."], answer=["18", "18", 18])
    [1.0, 0.0, 1.0]
    """
    _check_aligned(completions, answer, "answer")
    return [
        float(answers_match(extract_answer(completion_text(c), "auto"), str(a)))
        for c, a in zip(completions, answer, strict=True)
    ]


def strict_correctness_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 only where the text has "#### N" (lm-eval strict-match) and N matches `answer`.

    >>> strict_correctness_reward(["#### 18", "The answer is 18."], answer=["18", "18"])
    [1.0, 0.0]
    """
    _check_aligned(completions, answer, "answer")
    return [
        float(answers_match(extract_answer(completion_text(c), "strict"), str(a)))
        for c, a in zip(completions, answer, strict=True)
    ]


def _format_score(text: str) -> float:
    boxed = [m for m in _BOXED_RE.finditer(text) if any(ch.isdigit() for ch in m.group(1))]
    markers = sorted([*_MARKER_RE.finditer(text), *boxed], key=lambda m: m.start())
    score, work = 0.0, text
    if markers:
        last = markers[-1]
        score += 0.5
        if len(markers) == 1 and _ENDING_RE.fullmatch(text[last.end() :]):
            score += 0.25
        work = text[: last.start()]
    if any("=" in line and _ARITH_RE.search(line) for line in work.splitlines()):
        score += 0.25
    return score


def format_reward(completions: Sequence, **kwargs: Any) -> list[float]:
    """Partial credit in [0, 1] for a marked final answer, whether or not the answer is right.

    A final-answer marker is "####" followed (spaces or tabs allowed) by a number (GSM8K's format), or a
    \\boxed{...} with a number in it (the format Qwen's math-tuned models are trained on). The rule, summed:
    - 0.5 if the text has a marker;
    - 0.25 if there is exactly one marker and the answer ends the text: only whitespace and closing
      punctuation (. , ; : ! * _ ` ) ] $ \\) follow it. A model that repeats "#### N" lines, or writes
      bare "####" lines after its answer until the length limit, does not get this part;
    - 0.25 if a line of work holds a number, an operator (+ - * / x × ÷ \\times \\cdot \\div), a number, and
      "=" ("3 + 4 = 7", "<<3*4=12>>", "\\( 3 \\times 4 = 12 \\)"): before the last marker, or anywhere when
      there is no marker.

    >>> format_reward(["3 + 4 = 7\\n#### 7", "#### 7 because 3 + 4 = 7", "3 + 4 = 7", "I don't know"])
    [1.0, 0.5, 0.25, 0.0]
    >>> format_reward(["3 + 4 = 7\\n#### 7\\n#### 7", "3 + 4 = 7\\n#### 7\\n#### \\n#### "])
    [0.75, 0.75]
    >>> format_reward(["\\\\( 3 \\\\times 4 = 12 \\\\)\\n\\\\[\\\\boxed{12}\\\\]", "\\\\boxed{x}"])
    [1.0, 0.0]
    >>> format_reward(["\\\\boxed{7} \\\\boxed{7}", "So \\\\(\\\\boxed{7}\\\\) apples."])
    [0.5, 0.5]
    """
    return [_format_score(completion_text(c)) for c in completions]


def correct_format_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """`format_reward`'s credit where the answer is right (`correctness_reward`), else 0: a format reward that pays
    nothing the task's answer does not also earn. Paid for a marker alone, the demo model collapsed at one seed to a
    bare "#### 2" that earns a sure 0.15 (results/demo-dtype, issue 67); here a marked wrong answer earns nothing.

    >>> correct_format_reward(["3 + 4 = 7\\n#### 7", "#### 2", "3 + 4 = 7 so 7"], answer=["7", "7", "7"])
    [1.0, 0.0, 0.25]
    """
    right = correctness_reward(completions, answer)
    return [f * r for f, r in zip(format_reward(completions), right, strict=True)]


def soft_overlong_punishment(max_completion_len: int, soft_punish_cache: int) -> RewardFn:
    """DAPO's overlong reward shaping (TRL's `get_soft_overlong_punishment`): 0 up to `max_completion_len -
    soft_punish_cache` tokens, then falling linearly to -1 at `max_completion_len`, and -1 beyond. It reads the
    `completion_ids` column, so it counts tokens, not characters.

    >>> fn = soft_overlong_punishment(100, 20)
    >>> fn(["a"] * 4, completion_ids=[[0] * 80, [0] * 90, [0] * 100, [0] * 120])
    [0.0, -0.5, -1.0, -1.0]
    """
    start = max_completion_len - soft_punish_cache

    def overlong_reward(completions: Sequence, completion_ids: Sequence, **kwargs: Any) -> list[float]:
        _check_aligned(completions, completion_ids, "completion_ids")
        return [0.0 if len(ids) <= start else max(-1.0, (start - len(ids)) / max(soft_punish_cache, 1))
                for ids in completion_ids]

    return overlong_reward


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "correctness": correctness_reward,
    "strict_correctness": strict_correctness_reward,
    "format": format_reward,
    "correct_format": correct_format_reward,
    # verifiers for tasks of your own (verifiers.py)
    "exact_match": verifiers.exact_match_reward,
    "choice": verifiers.choice_reward,
    "regex": verifiers.regex_reward,
    "json": verifiers.json_reward,
    "math": verifiers.math_reward,
    "countdown": verifiers.countdown_reward,
    "code": verifiers.code_reward,
    "code_tests": verifiers.code_tests_reward,
    "answer_tag": verifiers.answer_tag_reward,
    "reasoning_gym": catalogue.reasoning_gym_reward,
    "environment": verifiers.environment_reward,  # each rollout's environment's get_reward()
}
BUILTIN_NAMES = (*BUILTIN_REWARDS, "overlong")  # overlong is built for the run's completion limit


# ---------------------------------------------------------------------------- loading by name


def _load_file(spec: str, path: str) -> ModuleType:
    file = Path(path).expanduser()
    if not file.is_file():
        raise RewardError(
            f"reward {spec!r}: file {path} does not exist; check the path (relative to {Path.cwd()})"
        )
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:8]
    stem = re.sub(r"\W", "_", file.stem)
    name = f"cpu_grpo_reward_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"reward {spec!r}: cannot load {path} as Python; give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise RewardError(
            f"reward {spec!r}: running {path} failed ({type(e).__name__}: {e}); fix that file"
        ) from e
    return module


def _import_module(spec: str, target: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as e:
        raise RewardError(
            f"reward {spec!r}: importing module {target!r} failed ({type(e).__name__}: {e}); "
            "check the module name and that its package is installed"
        ) from e


def _own_functions(module: ModuleType) -> list[str]:
    """Public functions defined in `module` itself (not imported into it)."""
    return sorted(
        n
        for n, obj in vars(module).items()
        if inspect.isfunction(obj) and not n.startswith("_") and obj.__module__ == module.__name__
    )


def _named(fn: Callable, name: str) -> RewardFn:
    """`fn`, or a wrapper named `name` when it has no __name__ (a partial, a callable object)."""
    if hasattr(fn, "__name__"):
        return fn

    def reward(completions: Sequence, **kwargs: Any) -> list[float]:
        return fn(completions, **kwargs)

    reward.__name__ = reward.__qualname__ = name
    return reward


GIVEN: dict[str, RewardFn] = {}  # functions handed over in this process (the Python API): name -> function


@contextlib.contextmanager
def given(fns: dict[str, RewardFn]):
    """While inside, `load_reward(name)` returns these functions (a script's or a notebook's own, which no
    module path reaches) before any builtin or module of that name."""
    GIVEN.update(fns)
    try:
        yield
    finally:
        for name in fns:
            GIVEN.pop(name, None)


def load_reward(spec: str, max_completion_len: int = 0) -> RewardFn:
    """A reward function from a builtin name, "package.module:function", "file.py:function", or
    "file.py" alone when that file defines exactly one public function whose name ends in "reward", or a reward
    model's directory (reward_model.py).
    The builtin `overlong` is `soft_overlong_punishment` over the last quarter of `max_completion_len` tokens.

    >>> load_reward("format") is format_reward
    True
    >>> load_reward("cpu_grpo.data.rewards:correctness_reward") is correctness_reward
    True
    """
    if spec in GIVEN:
        return GIVEN[spec]
    if spec == "overlong":
        if max_completion_len <= 0:
            raise RewardError("reward 'overlong' needs the completion limit: give max_new_tokens")
        return soft_overlong_punishment(max_completion_len, max_completion_len // 4)
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if is_reward_model(spec):
        return RewardModel(spec)
    if spec.endswith(".py"):
        module = _load_file(spec, spec)
        found = [n for n in _own_functions(module) if n.endswith("reward")]
        if len(found) != 1:
            what = f"several ({', '.join(found)})" if found else "no public function named '*reward'"
            raise RewardError(
                f"reward {spec!r}: file {spec} defines {what}; name one as '{spec}:function' "
                f"(functions there: {', '.join(_own_functions(module)) or 'none'})"
            )
        return getattr(module, found[0])
    if not spec.rpartition(":")[0] or not spec.rpartition(":")[2]:
        raise RewardError(
            f"reward {spec!r} is not a builtin ({', '.join(BUILTIN_NAMES)}); give one of those, "
            "'package.module:function', 'path/to/file.py:function' or 'path/to/file.py'"
        )
    return load_function(spec)


def load_function(spec: str, kind: str = "reward") -> Callable:
    """The function "package.module:function" or "path/to/file.py:function" names (a reward, a tool)."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        module, where = _load_file(spec, target), f"file {target}"
    else:
        module, where = _import_module(spec, target), f"module {target}"
    fn = getattr(module, name, None)
    if not callable(fn):
        problem = f"has no function {name!r}" if fn is None else f"has {name!r} but it is not callable"
        raise RewardError(
            f"{kind} {spec!r}: {where} {problem}; available: {', '.join(_own_functions(module)) or 'none'}"
        )
    return _named(fn, name)


# ---------------------------------------------------------------------------- calling them on rows
ALWAYS = ("difficulty", "question", "prompts", "completion_ids")  # columns every row gives (math rows: answer too)


def reward_columns(examples: Sequence, g: int = 1) -> dict[str, list]:
    """The keyword columns of a reward call on `g` completions of each example, aligned with the completions: the
    row's answer, level and question, `prompts` (the prompt as the row gives it: text or chat messages, as TRL
    passes it), and every column of the row by its own name (which wins over the standard ones)."""
    names = dict.fromkeys(k for ex in examples for k in ex.columns)
    rows = [ex for ex in examples for _ in range(g)]
    return {"answer": [ex.answer for ex in rows], "difficulty": [ex.difficulty for ex in rows],
            "question": [ex.question for ex in rows],
            "prompts": [list(ex.messages) if ex.messages else ex.question for ex in rows],
            **{k: [ex.columns.get(k) for ex in rows] for k in names}}


def as_completions(texts: Sequence[str], examples: Sequence, g: int = 1) -> list:
    """The completions a reward function gets, as TRL passes them: the text for a text prompt, one assistant
    message for a chat prompt (`completion[0]["content"]`); `g` completions of each example in turn.

    >>> from cpu_grpo.data.example import Example
    >>> chat = Example("Hi?", None, "mine", messages=({"role": "user", "content": "Hi?"},))
    >>> as_completions(["Hello", "Yo"], [chat, Example("2+2?", "4", "basic")])
    [[{'role': 'assistant', 'content': 'Hello'}], 'Yo']
    """
    rows = [ex for ex in examples for _ in range(g)]
    return [[{"role": "assistant", "content": t}] if ex.messages else t for t, ex in zip(texts, rows, strict=True)]


def check_columns(fns: Sequence[RewardFn], examples: Sequence, task: str, run_gives: Sequence[str] = ()) -> None:
    """Every column a reward function requires (a parameter without a default) is in the data or among those the
    run gives (`environments`), or one sentence that names it, the columns there are, and the flag that maps one;
    before anything is trained or evaluated."""
    have = set(ALWAYS) | set(run_gives) | {k for ex in examples for k in ex.columns} | \
        ({"answer"} if all(ex.math or "answer" in ex.columns for ex in examples) else set())
    for fn in fns:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):  # a builtin or C callable: nothing to check
            continue
        need = [p.name for p in params if p.default is p.empty and p.name != "completions"
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if missing := [name for name in need if name not in have]:
            own = sorted(have - set(ALWAYS)) or ["none of its own"]
            raise RewardError(f"reward {fn.__name__} needs column {missing[0]!r}, which task {task} lacks (its "
                              f"columns: {', '.join(own)}; every row also gives {', '.join(ALWAYS)}): rename one with "
                              f"--column-map 'yours:{missing[0]}', or use a reward that reads the columns there")
        if getattr(fn, "runs_code", False):
            verifiers.check_code_rows(examples)


def sandbox_for(fns: Sequence[RewardFn], allow_unisolated_code: bool = False) -> str:
    """'' when no reward among `fns` runs model-written code; else the line that says which sandbox the code gets,
    or SandboxError where there is none and the user has not accepted running it without (sandbox.require)."""
    return sandbox.require(allow_unisolated_code) if any(getattr(fn, "runs_code", False) for fn in fns) else ""
