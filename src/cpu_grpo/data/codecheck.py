"""The checker of code tasks, which the solution cannot reach: a row's tests are split here into the calls to run
(`square(3)`) and the values they must give (`9`); only the calls go into the sandbox, which runs them after the
solution and writes back each value as plain data (harness.py); the comparison is made here, in the trainer's
process. There is no pass token to forge and no checker to patch: a crash, a timeout, a missing or unreadable value,
or a value of another type is a failed test.

A test statement is one of
- `check(CALL, VALUE)`: the call's value equals VALUE with the same exact types, element by element;
- `assert CALL == VALUE` (or `VALUE == CALL`): the same typed comparison; `!=`, `<`, `<=`, `>`, `>=`, `in`,
  `not in`, `is`, `is not` are applied to the plain values;
- `assert CALL` / `assert not CALL`: the value is true / false as a plain value;
- `assert math.isclose(CALL, VALUE, rel_tol=..., abs_tol=...)` (or `isclose(...)`);
where VALUE is a Python literal (numbers, strings, lists, tuples, dicts, sets, True, False, None). Other statements
(imports, definitions, assignments) run before the calls, in the solution's namespace, and may not hold an assert
or a `check`. Tests with no test statement, or a statement of another form, are refused when the task is loaded.
"""

from __future__ import annotations

import ast
import functools
import json
import math
import operator
from dataclasses import dataclass
from typing import Any

_SYMBOLS = {ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
            ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_OPS = {"!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "in": lambda a, b: a in b, "not in": lambda a, b: a not in b, "is": operator.is_, "is not": operator.is_not}
_FORMS = ("check(CALL, VALUE), assert CALL == VALUE (or another comparison), assert CALL, assert not CALL, "
          "or assert math.isclose(CALL, VALUE), with VALUE a literal")


class CodeTestsError(ValueError):
    """A row's tests that cannot be checked outside the solution's process; the message says why and what to write."""


@dataclass(frozen=True)
class Check:
    call: str  # the expression run in the sandbox
    op: str  # "==", "!=", "<", ..., "in", "not in", "is", "is not", "true", "false", "isclose"
    want: Any = None  # the literal the value is compared with
    call_first: bool = True  # `CALL op VALUE`, else `VALUE op CALL`
    tolerance: tuple = ()  # isclose's (name, value) options

    def holds(self, got: Any) -> bool:
        """Whether the call's (decoded) value passes this check."""
        if self.op == "==":
            return same(got, self.want)
        if self.op in ("true", "false"):
            return bool(got) == (self.op == "true")
        if self.op == "isclose":
            numbers = all(type(x) in (int, float) for x in (got, self.want))
            return numbers and math.isclose(got, self.want, **dict(self.tolerance))
        fn = _OPS[self.op]
        try:
            return bool(fn(got, self.want) if self.call_first else fn(self.want, got))
        except TypeError:
            return False


@dataclass(frozen=True)
class CodeTests:
    setup: tuple[str, ...]  # statements run before the calls (imports, definitions)
    checks: tuple[Check, ...]

    def spec(self) -> dict:
        """What the sandbox is given: the setup and the calls, no expected value."""
        return {"setup": list(self.setup), "calls": [c.call for c in self.checks]}


def _literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _is_check_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"


def _isclose(node: ast.AST) -> bool:
    f = getattr(node, "func", None)
    return isinstance(node, ast.Call) and (isinstance(f, ast.Name) and f.id == "isclose" or
                                           isinstance(f, ast.Attribute) and f.attr == "isclose")


def _check_of(stmt: ast.stmt) -> Check | None:
    """The Check a test statement is, None when it is a setup statement; CodeTestsError when it is neither."""
    if isinstance(stmt, ast.Expr) and _is_check_call(stmt.value):
        call = stmt.value
        ok, want = _literal(call.args[1]) if len(call.args) == 2 and not call.keywords else (False, None)
        return Check(ast.unparse(call.args[0]), "==", want) if ok else None
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right, op = test.left, test.comparators[0], test.ops[0]
        (lit_l, want_l), (lit_r, want_r) = _literal(left), _literal(right)
        if lit_l != lit_r and (type(op) in _SYMBOLS or isinstance(op, ast.Eq)):
            symbol = "==" if isinstance(op, ast.Eq) else _SYMBOLS[type(op)]
            return Check(ast.unparse(left if lit_r else right), symbol, want_r if lit_r else want_l,
                         call_first=lit_r)
        return None
    if _isclose(test) and len(test.args) == 2:
        ok, want = _literal(test.args[1])
        tolerance = tuple((k.arg, _literal(k.value)[1]) for k in test.keywords if k.arg in ("rel_tol", "abs_tol"))
        if ok and len(tolerance) == len(test.keywords) and all(type(v) in (int, float) for _, v in tolerance):
            return Check(ast.unparse(test.args[0]), "isclose", want, tolerance=tolerance)
        return None
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    inner = test.operand if negated else test
    if _literal(inner)[0]:
        return None
    return Check(ast.unparse(inner), "false" if negated else "true")


@functools.lru_cache(maxsize=4096)
def parse_tests(text: str) -> CodeTests:
    """A row's tests as setup statements and checks, or CodeTestsError in one sentence.

    >>> t = parse_tests("import math\\ncheck(area(2), 4)\\nassert area(0) == 0\\nassert 3 < area(2)")
    >>> t.setup, [(c.call, c.op, c.want, c.call_first) for c in t.checks]
    (('import math',), [('area(2)', '==', 4, True), ('area(0)', '==', 0, True), ('area(2)', '<', 3, False)])
    """
    try:
        body = ast.parse(text).body
    except SyntaxError as e:
        raise CodeTestsError(f"the tests do not parse as Python (line {e.lineno}: {e.msg}): fix them") from None
    setup, checks = [], []
    for stmt in body:
        check = _check_of(stmt)
        if check is not None:
            checks.append(check)
            continue
        if any(isinstance(n, ast.Assert) or _is_check_call(n) for n in ast.walk(stmt)):
            raise CodeTestsError(f"test line {stmt.lineno} ({ast.unparse(stmt)[:80]!r}) cannot be checked outside "
                                 f"the solution's process: write each test as {_FORMS}")
        setup.append(ast.unparse(stmt))
    if not checks:
        raise CodeTestsError(f"the tests hold no test statement, so any code would pass: write at least one as "
                             f"{_FORMS}")
    return CodeTests(tuple(setup), tuple(checks))


def same(a: Any, b: Any) -> bool:
    """Equal values of the same exact types, element by element (1 is not True, 1.0 is not 1, (1,) is not [1]).

    >>> same([1, (2.0, "x")], [1, (2.0, "x")]), same(1, True), same({1: [2]}, {1: (2,)})
    (True, False, False)
    """
    if type(a) is not type(b):
        return False
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return sorted(map(repr, a)) == sorted(map(repr, b)) and all(same(a[k], b[k]) for k in a)
    if type(a) in (set, frozenset):
        return sorted(map(repr, a)) == sorted(map(repr, b))
    return a == b


_PLAIN = {"NoneType": type(None), "bool": bool, "int": int, "str": str}


def decode(item: Any) -> Any:
    """A value written by the sandbox's harness ([type name, data]) back as that value; ValueError when malformed.

    >>> decode(["tuple", [["int", 1], ["float", "0.5"], ["NoneType", None]]])
    (1, 0.5, None)
    """
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
        raise ValueError("not an encoded value")
    kind, data = item
    if kind in _PLAIN and type(data) is _PLAIN[kind]:
        return data
    if kind in ("float", "complex") and isinstance(data, str) and len(data) < 400:
        return (float if kind == "float" else complex)(data)
    if kind == "bytes" and isinstance(data, str):
        return bytes.fromhex(data)
    if kind in ("list", "tuple", "set", "frozenset") and isinstance(data, list):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](decode(x) for x in data)
    if kind == "dict" and isinstance(data, list) and all(isinstance(p, list) and len(p) == 2 for p in data):
        return {decode(k): decode(v) for k, v in data}
    raise ValueError(f"not an encoded value of type {kind[:20]!r}")


def results(tests: CodeTests, lines: list[str]) -> list[bool]:
    """Which checks passed, from the lines the harness wrote (untrusted: anything malformed fails its check)."""
    got: dict[int, Any] = {}
    for line in lines:
        try:
            record = json.loads(line)
            i = record["i"]
            if type(i) is int and i not in got and "value" in record:
                got[i] = decode(record["value"])
        except (ValueError, TypeError, KeyError, RecursionError, OverflowError, MemoryError):
            continue
    return [i in got and check.holds(got[i]) for i, check in enumerate(tests.checks)]
