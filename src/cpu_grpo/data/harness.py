"""The program that runs inside the sandbox (sandbox.py), with the standard library only: it sets the
limits, then either runs main.py (in the folder it is given) as a script ("run"), or runs main.py (a solution), the
setup lines of a row's tests and each test call, and writes each call's value as plain data, a line of JSON a call,
to the file descriptor it is given ("calls").

It knows no expected value and judges nothing: the trainer compares the values with the expected ones in its own
process (codecheck.py). Whatever the solution does to this interpreter (replace `print`, `json`, this module's
functions, the values' `__eq__`) changes only what is written, never what it is compared with."""

import json
import os
import resource
import runpy
import sys


def set_limits(limits: dict) -> None:
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def encode(value, depth=0):
    """A value as [type name, plain JSON] for the exact builtin types a test compares; anything else is refused,
    so an object with an `__eq__` of its own never reaches a comparison."""
    kind = type(value)
    if depth > 50:
        raise ValueError("nested too deeply")
    if value is None or kind in (bool, int, str):
        return [kind.__name__, value]
    if kind in (float, complex):
        return [kind.__name__, repr(value)]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in (list, tuple, set, frozenset):
        return [kind.__name__, [encode(x, depth + 1) for x in value]]
    if kind is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"a {kind.__name__} is not a plain value")


def run_calls(task: str, spec: dict, fd: int) -> None:
    out = os.fdopen(fd, "w")
    ns = {"__name__": "__main__"}
    with open(os.path.join(task, "main.py")) as f:
        exec(compile(f.read(), "solution.py", "exec"), ns)
    for source in spec["setup"]:
        exec(compile(source, "tests.py", "exec"), ns)
    for i, source in enumerate(spec["calls"]):
        try:
            line = {"i": i, "value": encode(eval(compile(source, "tests.py", "eval"), ns))}
        except Exception as e:
            line = {"i": i, "error": type(e).__name__}
        out.write(json.dumps(line) + "\n")
        out.flush()


if __name__ == "__main__":
    mode, task, limits, fd = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    set_limits(limits)
    if mode == "run":
        runpy.run_path(os.path.join(task, "main.py"), run_name="__main__")
    else:
        with open(os.path.join(task, "calls.json")) as f:
            run_calls(task, json.load(f), fd)
