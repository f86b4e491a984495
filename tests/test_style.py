"""Small is enforced (STYLE.md): modules under ~400 lines, functions under ~60 (the training loop too), and no
import circles."""

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


def _imports(path: Path) -> set[str]:
    """The package's modules that `path` imports anywhere in it (top level or inside a function)."""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]  # ("cpu_grpo",) or ("cpu_grpo", "app")
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[:len(package) - node.level + 1])
            targets = [f"{base}.{node.module}"] if node.module else [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cpu_grpo"):
            targets = [node.module]
        else:
            continue
        out |= {t for t in targets if (SRC.parent / (t.replace(".", "/") + ".py")).exists()}
    return out


def test_no_import_circles():
    graph = {".".join(p.relative_to(SRC.parent).with_suffix("").parts): _imports(p) for p in SRC.rglob("*.py")}

    def visit(node: str, path: list[str]) -> None:
        for nxt in graph.get(node, ()):
            assert nxt not in path, f"import circle: {' -> '.join([*path[path.index(nxt):], nxt])}"
            visit(nxt, [*path, nxt])

    for module in graph:
        visit(module, [module])
