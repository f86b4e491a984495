"""Verifiers for tasks of your own, each a reward with TRL's signature `f(completions, **columns) -> list[float]`,
1.0 for a verified answer and 0.0 otherwise, reading the columns it names:

- `exact_match_reward(answer)`: the final answer equals the row's answer, after normalising case, spaces,
  punctuation at the ends and English articles (SQuAD's normalisation);
- `choice_reward(answer)`: the final answer is the row's multiple-choice letter (one letter, A-J);
- `regex_reward(pattern)`: the final answer matches the row's regular expression, whole;
- `json_reward(schema=None, expected=None)`: the last JSON value in the completion parses, fits the row's JSON
  schema (a subset: type, required, properties, items, enum) and has the row's expected fields;
- `math_reward(answer)`: the final answer and the row's answer are the same mathematical object (math-verify:
  LaTeX, fractions, expressions);
- `countdown_reward(nums, target)`: the equation in the last <answer> tags uses each number exactly once and
  reaches the target;
- `code_reward(tests)`: the last ```python block runs in the sandbox (sandbox.py) and every call of the row's
  tests gives the expected value, compared in the trainer's process (codecheck.py);
- `answer_tag_reward()`: the completion ends with one <answer>...</answer> (a format reward, for shaping);
- `environment_reward(environments)`: each rollout's environment's `get_reward()` (environments.py).

The final answer is the content of the last <answer> tags, else of the last \\boxed{}, else the last line that is
not empty (an "Answer:" label dropped). Reading only that, an answer repeated among alternatives, mentioned in the
reasoning, or followed by padding is not verified.
"""

from __future__ import annotations

import ast
import json
import re
import string
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from . import codecheck, sandbox
from .answers import completion_text

_TAG = re.compile(r"<answer>(.*?)</answer>", re.S | re.I)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_LABEL = re.compile(r"^\s*(?:\**\s*(?:final\s+)?answer\s*\**\s*[:：]\s*\**)", re.I)
_CODE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def final_answer(text: str) -> str:
    """The answer a completion ends with: its last <answer> tags, else its last \\boxed{}, else its last line.

    >>> final_answer("so <answer> 7 </answer>"), final_answer("x \\\\boxed{\\\\frac{1}{2}}.")
    ('7', '\\\\frac{1}{2}')
    >>> final_answer("Answer: B\\n")
    'B'
    """
    if tags := _TAG.findall(text):
        return tags[-1].strip()
    if boxed := _BOXED.findall(text):
        return boxed[-1].strip()
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return _LABEL.sub("", lines[-1]).strip().strip("*").strip() if lines else ""


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces.

    >>> normalize("  The Eiffel  Tower. ")
    'eiffel tower'
    """
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def exact_match_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the normalised final answer equals the normalised `answer`.

    >>> exact_match_reward(["...\\nAnswer: Paris.", "Paris or Rome", "Paris is big.\\nRome"], answer=["paris"] * 3)
    [1.0, 0.0, 0.0]
    """
    return [float(normalize(final_answer(completion_text(c))) == normalize(str(a)))
            for c, a in zip(completions, answer, strict=True)]


_CHOICE = re.compile(r"^\(?([A-J])\)?[.:]?$")
_CHOICE_IN_TEXT = re.compile(r"(?:answer|option|choice)\s+(?:is\s+)?\(?([A-J])\)?\W*$", re.I)


def choice_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the final answer is exactly the letter `answer` ("B", "(B)", "B.", "The answer is B").

    >>> choice_reward(["... so (C)", "The answer is C.", "C or D", "C\\nD"], answer=["C"] * 4)
    [1.0, 1.0, 0.0, 0.0]
    """
    out = []
    for c, a in zip(completions, answer, strict=True):
        final = final_answer(completion_text(c))
        m = _CHOICE.match(final.strip()) or _CHOICE_IN_TEXT.search(final) or re.search(r"\(([A-J])\)\W*$", final)
        out.append(float(bool(m) and m.group(1) == str(a).strip().strip("()").upper()))
    return out


def regex_reward(completions: Sequence, pattern: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the whole final answer matches the row's regular expression `pattern`.

    >>> regex_reward(["<answer>2024-11-27</answer>", "<answer>2024-11-27 or so</answer>"],
    ...              pattern=[r"\\d{4}-\\d\\d-\\d\\d"] * 2)
    [1.0, 0.0]
    """
    return [float(re.fullmatch(str(p), final_answer(completion_text(c))) is not None)
            for c, p in zip(completions, pattern, strict=True)]


def last_json(text: str) -> Any:
    """The last top-level JSON object or array in the text (a ```json block, or raw), or None when none parses."""
    decoder, found, i = json.JSONDecoder(), None, 0
    while i < len(text):
        if text[i] in "{[":
            try:
                found, i = decoder.raw_decode(text, i)
                continue
            except json.JSONDecodeError:
                pass
        i += 1
    return found


def fits(value: Any, schema: dict) -> bool:
    """Whether `value` fits a JSON-schema subset: type, required, properties, items, enum.

    >>> fits({"a": 1}, {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}})
    True
    """
    types = {"object": dict, "array": list, "string": str, "number": (int, float), "integer": int, "boolean": bool,
             "null": type(None)}
    kind = schema.get("type")
    if kind and (not isinstance(value, types[kind]) or kind in ("number", "integer") and isinstance(value, bool)):
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return all(k in value for k in schema.get("required", [])) and \
            all(fits(value[k], s) for k, s in props.items() if k in value)
    if isinstance(value, list) and "items" in schema:
        return all(fits(v, schema["items"]) for v in value)
    return True


def json_reward(completions: Sequence, schema: Sequence | None = None, expected: Sequence | None = None,
                **kwargs: Any) -> list[float]:
    """1.0 where the completion's last JSON value parses, fits the row's `schema` and holds the row's `expected`
    fields with equal values (each may be a JSON string or a value; either column may be absent).

    >>> json_reward(['x {"name": "Ada", "age": 36}', '{"name": "Ada"}', "no json"],
    ...             expected=['{"name": "Ada", "age": 36}'] * 3)
    [1.0, 0.0, 0.0]
    """
    n = len(completions)
    schemas, wants = schema or [None] * n, expected or [None] * n
    out = []
    for c, s, want in zip(completions, schemas, wants, strict=True):
        value = last_json(completion_text(c))
        s, want = (json.loads(x) if isinstance(x, str) else x for x in (s, want))
        ok = value is not None and (s is None or fits(value, s)) and \
            (want is None or isinstance(value, dict) and all(value.get(k) == v for k, v in want.items()))
        out.append(float(ok))
    return out


def _equation_value(equation: str) -> tuple[Fraction, list[int]] | None:
    """The exact value of an arithmetic equation (+ - * / and parentheses) and the numbers it uses, else None."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b}
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise ValueError("not + - * / of whole numbers")

    try:
        return walk(ast.parse(equation.split("=")[0].strip(), mode="eval").body), used
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def countdown_reward(completions: Sequence, nums: Sequence, target: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the equation in the last <answer> tags uses each of `nums` exactly once and equals `target`.

    >>> countdown_reward(["<answer>(3 + 5) * 2</answer>", "<answer>3 * 5</answer>", "<answer>16</answer>"],
    ...                  nums=[[2, 3, 5]] * 3, target=[16] * 3)
    [1.0, 0.0, 0.0]
    """
    out = []
    for c, ns, t in zip(completions, nums, target, strict=True):
        tags = _TAG.findall(completion_text(c))
        found = _equation_value(tags[-1]) if tags and len(tags[-1]) < 200 else None
        out.append(float(found is not None and Counter(found[1]) == Counter(ns) and found[0] == t))
    return out


def code_of(text: str) -> str:
    """The last ```python block of a completion, else the whole text."""
    blocks = _CODE.findall(text)
    return blocks[-1] if blocks else text


def _code_results(completions: Sequence, tests: Sequence) -> list[sandbox.Result]:
    try:
        pairs = [(code_of(completion_text(c)), codecheck.parse_tests(str(t)))
                 for c, t in zip(completions, tests, strict=True)]
    except codecheck.CodeTestsError as e:
        from ..errors import RewardError

        raise RewardError(f"a row's tests: {e}") from None
    return sandbox.run_many(pairs)


def code_reward(completions: Sequence, tests: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the completion's code runs in the sandbox and every call of the row's `tests` gives the value the
    tests expect, compared outside the sandbox (codecheck.py: `check(CALL, VALUE)`, `assert CALL == VALUE`, ...;
    sandbox.py: 5 s, 512 MB, no network, no way out)."""
    return [float(r.passed) for r in _code_results(completions, tests)]


def code_tests_reward(completions: Sequence, tests: Sequence, **kwargs: Any) -> list[float]:
    """The share of the row's test statements that hold (as `code_reward`, which pays only when all do): partial
    credit for shaping, 0 where the code fails to run."""
    return [r.share for r in _code_results(completions, tests)]


# rewards that run model-written code: their rows' tests are checked at load, and a run needs the sandbox
code_reward.runs_code = code_tests_reward.runs_code = True


def check_code_rows(examples: Sequence) -> None:
    """Every row's `tests` can be checked outside the solution's process (codecheck.py), or a RewardError that
    names the first row that cannot; before anything is trained or evaluated."""
    from ..errors import RewardError

    for ex in examples:
        try:
            codecheck.parse_tests(str(ex.columns.get("tests", "")))
        except codecheck.CodeTestsError as e:
            raise RewardError(f"row {ex.id or repr(ex.question[:40])}: {e}") from None


def answer_tag_reward(completions: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where the completion ends with exactly one <answer>...</answer> (what follows it is at most a period).

    >>> answer_tag_reward(["x <answer>1</answer>", "<answer>1</answer> <answer>2</answer>", "<answer>1</answer> ok"])
    [1.0, 0.0, 0.0]
    """
    texts = [completion_text(c).strip() for c in completions]
    return [float(len(_TAG.findall(t)) == 1 and re.search(r"</answer>\W{0,2}$", t, re.I) is not None)
            for t in texts]


def math_reward(completions: Sequence, answer: Sequence, **kwargs: Any) -> list[float]:
    """1.0 where math-verify finds the final answer equal to `answer` (LaTeX, fractions, sets, expressions)."""
    try:
        from math_verify import parse, verify
    except ImportError:
        from ..errors import RewardError

        raise RewardError("reward 'math' needs math-verify: pip install 'cpu-grpo[eval]'") from None
    out = []
    for c, a in zip(completions, answer, strict=True):
        final = final_answer(completion_text(c))
        gold, pred = parse(f"${a}$"), parse(f"${final}$") if final else []
        out.append(float(bool(gold and pred) and verify(gold, pred)))
    return out


def environment_reward(completions: Sequence, environments: Sequence | None = None, **kwargs: Any) \
        -> list[float | None]:
    """Each rollout's environment's `get_reward()`, TRL's environment that owns its reward (environments.py); None
    where its environment has none."""
    if environments is None:
        from ..errors import RewardError

        raise RewardError("reward 'environment' reads each rollout's environment: give --environment, or remove it "
                          "from --rewards")
    return [float(env.get_reward()) if hasattr(env, "get_reward") else None for env in environments]
