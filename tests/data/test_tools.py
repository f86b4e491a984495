"""Tools, TRL's way (issue 69's pieces): typed functions loaded by name, their JSON schemas, calls parsed from the
model's format and answered as TRL answers them, and the shipped calculator."""

from __future__ import annotations

import pytest

from cpu_grpo.data.tools import ToolError, calculator, call, load_tools, schemas, tool_calls

TOOLS = '''
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def shout(text: str) -> str:
    """Say it louder.

    Args:
        text: What to say.
    """
    return text.upper()


def untyped(a, b):
    return a + b
'''


@pytest.fixture
def tool_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(TOOLS)
    return path


def test_tools_load_by_name_and_give_the_schemas_trl_gives(tool_file):
    from transformers.utils import get_json_schema

    tools = load_tools([f"{tool_file}:multiply,shout", "calculator"])
    assert [t.__name__ for t in tools] == ["multiply", "shout", "calculator"]
    got = schemas(tools)
    assert got == [get_json_schema(t) for t in tools]
    assert got[0]["function"]["parameters"]["properties"]["a"] == {"type": "number", "description": "The first number."}


@pytest.mark.parametrize("spec, words", [
    ("{file}:untyped", "tool untyped: "),
    ("{file}:divide", "tool '{file}:divide': file {file} has no function 'divide'"),
    ("nowhere.py:f", "tool 'nowhere.py:f': file nowhere.py does not exist"),
    ("abacus", "tool 'abacus' is not a builtin (calculator)"),
])
def test_a_tool_that_cannot_be_offered_is_one_sentence(tool_file, spec, words):
    with pytest.raises(ToolError, match="^" + __import__("re").escape(words.format(file=tool_file))):
        load_tools([spec.format(file=tool_file)])


def test_two_tools_of_one_name_are_refused(tool_file):
    with pytest.raises(ToolError, match="two tools are called 'multiply'"):
        load_tools([f"{tool_file}:multiply", f"{tool_file}:multiply"])


def test_a_completions_calls_are_run_and_failures_answered_as_trl_does(tool_file):
    tools = load_tools([f"{tool_file}:multiply", "calculator"])
    text = ('I will multiply.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1/0"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "multiply", "arguments": {"a": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "multiply", "arguments": [1, 2]}</tool_call>')
    results = [call(tools, c) for c in tool_calls(text)]
    assert results[0] == ("multiply", "42", False)
    assert results[1] == ("calculator", "{'error': 'division by zero'}", True)
    assert results[2][0] == "multiply" and results[2][2] and "missing 1 required positional argument" in results[2][1]
    assert results[3][2] and "did not parse" in results[3][1]


@pytest.mark.parametrize("expression, value", [
    ("12 * (3 + 4)", "84"), ("0.1 + 0.2", "0.3"), ("-2 ** 2", "-4"), ("(1 - 3) ** 3", "-8"), ("7 / 4", "1.75"),
    ("2 / 3", "2/3"), ("3 × 4 ÷ 6", "2"), ("2^5", "32"),
])
def test_the_calculator_is_exact(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os').system('id')", "x + 1", "[1, 2]", "2 ** 0.5",
                                        "10 ** 64 ** 2", "(10 ** 60) * (10 ** 60)", "True + 1"])
def test_the_calculator_runs_nothing_but_arithmetic(expression):
    with pytest.raises((ValueError, SyntaxError)):
        calculator(expression)


def test_the_calculators_schema_tells_the_model_only_what_it_is():
    described = schemas([calculator])[0]["function"]
    assert described["parameters"]["properties"]["expression"]["description"] == \
        'The expression, for example "(3 + 4) * 12 / 5".'
    assert ">>>" not in str(described)


def test_qwen_coders_fenced_json_calls_are_calls_and_other_fences_are_not():
    text = ('Let me compute.\n```json\n{\n  "name": "calculator",\n  "arguments": {"expression": "16 - 3 - 4"},\n'
            '  "return": "9"\n}\n```\n```json\n'
            '{"name": "calculator", "parameters": "{\\"expression\\": \\"9 * 2\\"}"}\n```')
    assert [call([calculator], c) for c in tool_calls(text)] == [("calculator", "9", False),
                                                                   ("calculator", "18", False)]
    assert tool_calls('```python\nprint({"a": 1})\n```\n```json\n{"answer": 18}\n```') == []
    tagged = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'
    assert len(tool_calls(tagged + '\n```json\n{"name": "x", "arguments": {}}\n```')) == 1  # the tags win
