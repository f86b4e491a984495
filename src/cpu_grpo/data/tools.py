"""Tools a model may call, TRL's way: plain Python functions with type hints and a Google-style docstring, given to
the model as JSON schemas through its chat template (`transformers.utils.get_json_schema`), called from the model's
own format, and answered with a `tool` message. The pieces of issue 69's multi-turn rollouts, each testable alone:

- `load_tools(["my_tools.py:multiply,divide", "calculator"])`: the functions, and their schemas (`schemas`);
- `tool_calls(text)`: the calls in a completion, in TRL's shape (`{"type": "function", "function": {"name",
  "arguments"}}`), from the Hermes format of Qwen2.5, Qwen3 and SmolLM3 (`<tool_call>{json}</tool_call>`) or
  Llama 3.x's bare `{"name": ..., "parameters": ...}`;
- `call(tools, tool_call)`: its result as text, or TRL's `{"error": ...}` when it fails (counted, never raised);
- `calculator(expression)`: the shipped tool, exact arithmetic on an expression without `eval`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import re
from collections.abc import Callable
from fractions import Fraction

from ..errors import UserError


class ToolError(UserError):
    """A tool that cannot be offered to a model; the message says what to change."""


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / ** and parentheses.

    Args:
        expression: The expression, for example "(3 + 4) * 12 / 5".
    """  # no examples here: the schema's description would carry them to the model (tests/data/test_tools.py has them)
    value = _evaluate(ast.parse(expression.replace("^", "**").replace("×", "*").replace("÷", "/"), mode="eval").body)
    if value.denominator == 1:
        return str(value.numerator)
    decimal = value.numerator / value.denominator
    return str(decimal) if Fraction(decimal).limit_denominator(10**9) == value and len(str(decimal)) < 16 else \
        f"{value.numerator}/{value.denominator}"


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 64):
            raise ValueError("powers must be whole numbers up to 64")
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        value = _OPERATORS[type(node.op)](left, right)
        if abs(value) > 10**100:
            raise ValueError("the result is larger than 10**100")
        return value
    raise ValueError("only numbers, + - * / ** and parentheses are allowed")


BUILTIN_TOOLS: dict[str, Callable] = {"calculator": calculator}
GIVEN: dict[str, Callable] = {}  # functions handed over in this process (the Python API's tools=): name -> function


@contextlib.contextmanager
def given(fns: list[Callable]):
    """While inside, these functions are tools by their names (a script's or a notebook's own)."""
    GIVEN.update({fn.__name__: fn for fn in fns})
    try:
        yield
    finally:
        for fn in fns:
            GIVEN.pop(fn.__name__, None)


def load_tools(specs: list[str]) -> list[Callable]:
    """The functions named by `specs`: a builtin name, `file.py:f,g` or `package.module:f,g` (as rewards are named);
    each must give a JSON schema (type hints and a docstring with an Args section)."""
    from .rewards import RewardError, load_function

    tools: list[Callable] = []
    last = ""  # a bare name after file.py:f is that file's (`--tools my.py:f,g` arrives as "my.py:f", "g")
    for spec in specs:
        if spec in GIVEN or spec in BUILTIN_TOOLS:
            tools.append(GIVEN.get(spec) or BUILTIN_TOOLS[spec])
            continue
        where, _, names = spec.rpartition(":")
        where, last = where or last, where or last
        if not where:
            raise ToolError(f"tool {spec!r} is not a builtin ({', '.join(BUILTIN_TOOLS)}): give one of those, or "
                            "file.py:function or package.module:function")
        try:
            tools += [load_function(f"{where}:{name.strip()}", "tool") for name in names.split(",") if name.strip()]
        except RewardError as e:  # the loader's sentence, about a tool
            raise ToolError(str(e).replace("reward ", "tool ", 1)) from None
    names = [t.__name__ for t in tools]
    if len(set(names)) < len(names):
        raise ToolError(f"two tools are called {next(n for n in names if names.count(n) > 1)!r}: the model calls "
                        "tools by name, so give each another name")
    schemas(tools)  # refused now, not at the first rollout
    return tools


def schemas(tools: list[Callable]) -> list[dict]:
    """The JSON schema of each tool, as a chat template's `tools=` takes them."""
    from transformers.utils import get_json_schema

    out = []
    for fn in tools:
        try:
            out.append(get_json_schema(fn))
        except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
            raise ToolError(f"tool {fn.__name__}: {e}: give every argument a type hint and describe it in the "
                            "docstring's Args section, as TRL's tools do") from None
    return out


_HERMES = re.compile(r"<tool_call>\s*(.+?)\s*</tool_call>", re.S)
_FENCED = re.compile(r"```(?:json)?\s*(\{.+?\})\s*```", re.S)
_LLAMA = re.compile(r'^\s*(\{"name":\s*".+?",\s*"parameters":\s*.+\})\s*$', re.S)


def tool_calls(text: str) -> list[dict]:
    """The tool calls in a completion, in TRL's shape: Hermes' `<tool_call>` tags (Qwen2.5, Qwen3, SmolLM3), else
    JSON objects with a "name" and "arguments" in code fences (what Qwen2.5-Coder writes when offered tools), else
    a completion that is one Llama 3.x call. A tagged call whose JSON does not parse is kept with its text as
    `{"type": "invalid", ...}` so that `call` counts it as a failure; a fence that holds no call is no call.

    >>> text = '<tool_call>\\n{"name": "calculator", "arguments": {"expression": "3*4"}}\\n</tool_call>'
    >>> tool_calls("Let me compute.\\n" + text)
    [{'type': 'function', 'function': {'name': 'calculator', 'arguments': {'expression': '3*4'}}}]
    >>> tool_calls('{"name": "calculator", "parameters": {"expression": "1+1"}}')[0]["function"]["arguments"]
    {'expression': '1+1'}
    >>> tool_calls('```json\\n{"name": "calculator", "arguments": {"expression": "2+2"}}\\n```')[0]["function"]["name"]
    'calculator'
    >>> tool_calls("The answer is 12."), tool_calls('```json\\n{"total": 12}\\n```')
    ([], [])
    >>> tool_calls("<tool_call>{oops</tool_call>")[0]["type"]
    'invalid'
    """
    found = _HERMES.findall(text) or [raw for raw in _FENCED.findall(text) if _names_a_call(raw)]
    if not found and (bare := _LLAMA.match(text)):
        found = [bare.group(1).replace('"parameters":', '"arguments":', 1)]
    calls = []
    for raw in found:
        try:
            data = json.loads(raw)
            name, arguments = data["name"], data.get("arguments", data.get("parameters", {}))
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments  # OpenAI's JSON text
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be text and arguments an object")
            calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
        except (ValueError, KeyError, TypeError) as e:
            calls.append({"type": "invalid", "text": raw, "error": f"{type(e).__name__}: {e}"})
    return calls


def _names_a_call(raw: str) -> bool:
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and "name" in data and ("arguments" in data or "parameters" in data)


def call(tools: list[Callable], tool_call: dict) -> tuple[str, str, bool]:
    """Run one tool call: (the tool's name, its result as text, whether it failed). A failure (no such tool, bad
    arguments, an exception, a call that did not parse) is answered as TRL answers it, `{"error": "..."}` (an unknown
    name with the names there are: a small model invents names), so that the model reads why.

    >>> call([calculator], {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}})
    ('calculator', '42', False)
    >>> call([calculator], {"type": "function", "function": {"name": "search", "arguments": {}}})
    ('search', "{'error': 'Tool search not found. The tools are: calculator.'}", True)
    """
    if tool_call.get("type") != "function":
        return "unknown", str({"error": f"the tool call did not parse: {tool_call.get('error', '')}"}), True
    name, arguments = tool_call["function"]["name"], tool_call["function"]["arguments"]
    by_name = {t.__name__: t for t in tools}
    try:
        if name not in by_name:
            raise ValueError(f"Tool {name} not found. The tools are: {', '.join(by_name)}.")  # TRL's, and the way out
        return name, str(by_name[name](**arguments)), False
    except Exception as e:
        return name, str({"error": str(e)}), True
