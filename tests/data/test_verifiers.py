"""The verifiers shipped as rewards, on hand-written completions: right answers, and the ways a completion can look
right without being right (an answer repeated among alternatives, an answer in the reasoning but not at the end,
padding after it, numbers used twice)."""

from __future__ import annotations

import pytest

from cpu_grpo.data import verifiers as v
from cpu_grpo.data.rewards import BUILTIN_REWARDS, load_reward


@pytest.mark.parametrize("text, gold, expected", [
    ("The capital is easy.\nAnswer: Paris", "Paris", 1.0),
    ("<answer>the  Paris</answer>", "paris", 1.0),  # articles, case and spaces
    ("Paris, or maybe Rome", "Paris", 0.0),  # alternatives
    ("Paris is in France. But the answer is Rome.", "Paris", 0.0),  # in the reasoning, not at the end
    ("Answer: Paris\n" + "Paris " * 50 + "\nlorem", "Paris", 0.0),  # padding after it
    ("", "Paris", 0.0),
])
def test_exact_match(text, gold, expected):
    assert v.exact_match_reward([text], answer=[gold]) == [expected]
    assert v.exact_match_reward([[{"role": "assistant", "content": text}]], answer=[gold]) == [expected]


@pytest.mark.parametrize("text, expected", [
    ("The answer is (B).", 1.0), ("B", 1.0), ("<answer>B</answer>", 1.0), ("\\boxed{B}", 1.0),
    ("A or B", 0.0), ("A, B, C, D", 0.0), ("B is wrong, the answer is C", 0.0), ("The answer is B\nC", 0.0),
    ("ABCD", 0.0),
])
def test_choice(text, expected):
    assert v.choice_reward([text], answer=["B"]) == [expected]


def test_regex_matches_the_whole_final_answer():
    pattern = [r"[A-Z]{3}-\d{4}"] * 4
    texts = ["code: <answer>ABC-1234</answer>", "<answer>ABC-1234 and ABD-9999</answer>", "ABC-1234\nthen more",
             "ABC-123"]
    assert v.regex_reward(texts, pattern=pattern) == [1.0, 0.0, 0.0, 0.0]


def test_json_parses_fits_the_schema_and_holds_the_fields():
    schema = {"type": "object", "required": ["name", "age"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    texts = ['Here:\n```json\n{"name": "Ada", "age": 36}\n```', '{"name": "Ada", "age": "36"}', '{"name": "Ada"}',
             '{"name": "Bob", "age": 36}', "{not json", '{"name": "Ada", "age": true}']
    got = v.json_reward(texts, schema=[schema] * 6, expected=[{"name": "Ada"}] * 6)
    assert got == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert v.json_reward(['{"a": [1, 2]}'], schema=['{"type": "object", "properties": {"a": {"type": "array", '
                                                     '"items": {"type": "integer"}}}}']) == [1.0]


@pytest.mark.parametrize("text, expected", [
    ("<answer>(25 - 5) * 2</answer>", 1.0),
    ("<answer>2 * (25 - 5) = 40</answer>", 1.0),
    ("<answer>25 + 5 + 2 + 8</answer>", 0.0),  # a number not given
    ("<answer>(25 - 5) * 2 * 1</answer>", 0.0),
    ("<answer>25 * 2 - 5 - 5</answer>", 0.0),  # 5 used twice
    ("<answer>40</answer>", 0.0),  # the target, not an equation of the numbers
    ("(25 - 5) * 2", 0.0),  # no tags
    ("<answer>(25 - 5) * 2</answer> <answer>1</answer>", 0.0),  # the last tags count
    ("<answer>__import__('os').system('true')</answer>", 0.0),  # not arithmetic: never evaluated
    ("<answer>25 / (5 - 5) * 2</answer>", 0.0),
])
def test_countdown(text, expected):
    assert v.countdown_reward([text], nums=[[2, 5, 25]], target=[40]) == [expected]


def test_math_reward_reads_latex():
    pytest.importorskip("math_verify")
    texts = ["so \\boxed{\\frac{1}{2}}", "<answer>0.5</answer>", "\\boxed{\\frac{1}{3}}", "1/2 or 1/3"]
    assert v.math_reward(texts, answer=["\\frac{1}{2}"] * 4) == [1.0, 1.0, 0.0, 0.0]


def test_code_reward_runs_the_last_block_against_the_tests():
    tests = ["check(add(2, 3), 5)\nassert add(-1, 1) == 0"] * 4
    texts = ["```python\ndef add(a, b):\n    return a + b\n```",
             "```python\ndef add(a, b):\n    return a - b\n```",
             "First try:\n```python\ndef add(a, b):\n    return 0\n```\nBetter:\n```python\ndef add(a, b):\n"
             "    return a + b\n```",
             "def add(a, b): return a + b  # no block: the whole text"]
    assert v.code_reward(texts, tests=tests) == [1.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("hack", [
    "import sys\nsys.exit(0)",  # leave before the tests run
    "import os\nos._exit(0)",
    "class Any:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Any()",
    "def add(a, b):\n    return [Any() for Any in [type('A', (), {'__eq__': lambda s, o: True})]][0]",
    "print(open('main.py').read())\nimport os\nos._exit(0)",  # print the program, hoping the token is in it
    "import os\nprint(os.environ.get('CPU_GRPO_PASS'))\nos._exit(0)",
    "print(open('tests.py').read())",  # the tests are gone before the solution runs
    "def add(a, b):\n    return 0\ndef check(got, want):\n    pass",  # a check of its own
    "import builtins\nclass Any:\n    def __eq__(self, other):\n        return True\nbuiltins.type = lambda x: int\n"
    "def add(a, b):\n    return Any()",  # check's type test defeated through the builtins
])
def test_code_reward_is_not_fooled(hack):
    assert v.code_reward([f"```python\n{hack}\n```"], tests=["check(add(2, 3), 5)"]) == [0.0]
    assert v.code_tests_reward([f"```python\n{hack}\n```"], tests=["check(add(2, 3), 5)\ncheck(add(1, 1), 2)"]) == [0.0]


def test_code_tests_reward_is_the_share_of_the_tests_passed():
    tests = ["check(add(2, 3), 5)\ncheck(add(0, 0), 0)\nassert add(-1, 1) == 0\ncheck(add(1, 1), 2)"] * 4
    texts = ["```python\ndef add(a, b):\n    return a + b\n```",
             "```python\ndef add(a, b):\n    return 0\n```",  # right where the sum is 0
             "```python\ndef plus(a, b):\n    return a + b\n```",  # another name: nothing runs
             "```python\ndef add(a, b):\n    return a + b\nimport sys\nsys.exit(0)\n```"]  # leaves before the tests
    assert v.code_tests_reward(texts, tests=tests) == [1.0, 0.5, 0.0, 0.0]
    assert v.code_reward(texts, tests=tests) == [1.0, 0.0, 0.0, 0.0]


def test_answer_tag():
    assert v.answer_tag_reward(["work <answer>3</answer>", "<answer>3</answer> and more text",
                                "no tags", "<answer>3</answer><answer>4</answer>"]) == [1.0, 0.0, 0.0, 0.0]


def test_every_verifier_loads_by_name():
    for name in ("exact_match", "choice", "regex", "json", "math", "countdown", "code", "code_tests",
                 "answer_tag"):
        assert load_reward(name) is BUILTIN_REWARDS[name]
