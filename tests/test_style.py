"""Small is enforced (the team's style guide): modules under ~400 lines, functions under ~60 (the training loop
too), no import circles, and imports between the wings point down (docs/how-it-works.md, Layout)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "cpu_grpo"


def test_modules_are_small():
    for path in SRC.rglob("*.py"):
        n = len(path.read_text().splitlines())
        assert n <= 400, f"{path.name} has {n} lines: split it by responsibility"


def test_functions_are_small():
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                assert n <= 60, f"{path.name}:{node.name} has {n} lines"


def _is_module(name: str) -> bool:
    """A module of the package: a file, or a package whose __init__ holds names (the root's lazy ones too)."""
    where = SRC.parent / name.replace(".", "/")
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _imports(path: Path) -> set[str]:
    """The package's modules that `path` imports anywhere in it (top level or inside a function)."""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]  # ("cpu_grpo",) or ("cpu_grpo", "app")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[:len(package) - node.level + 1])
            module = f"{base}.{node.module}" if node.module else base
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cpu_grpo"):
            module = node.module
        else:
            continue
        for name in node.names:  # `from .eval import stats`: the module stats; `from . import x`: the package's x
            sub = f"{module}.{name.name}"
            out |= {sub} if _is_module(sub) else {module} if _is_module(module) else set()
    return out


# the wings from the bottom up; a module may import its own wing and those below it (config and rundir are
# the top-level records every wing reads; cli, the Python API (grpo_trainer, and the package's lazy names) and the
# app sit on top of everything)
LAYERS = {"errors": 0, "profiles": 0, "rundir": 0, "data": 1, "config": 2, "engine": 2, "rewards": 2,
          "grpo_config": 3, "eval": 3, "machine": 4, "train": 5, "export": 6, "app": 7, "cli": 8, "grpo_trainer": 8,
          "__main__": 9, "__init__": 9}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[1] if module.count(".") else "__init__"]


def test_imports_point_down_between_wings():
    wings = {p.name for p in SRC.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert wings >= {"data", "engine", "train", "eval", "machine", "app"} and wings <= set(LAYERS), wings
    for path in SRC.rglob("*.py"):
        me = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
        for other in _imports(path):
            assert _layer(other) <= _layer(me), f"{me} imports {other}, a wing above it: move the shared piece down"


def test_no_import_circles():
    graph = {".".join(p.relative_to(SRC.parent).with_suffix("").parts): _imports(p) for p in SRC.rglob("*.py")}

    def visit(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            assert nxt not in path, f"import circle: {' -> '.join([*path[path.index(nxt):], nxt])}"
            visit(nxt, [*path, nxt])

    for module in graph:
        visit(module, [module])
