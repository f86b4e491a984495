"""What the docs cite exists: every `test_file.py::test_name`, every backticked path of the tree and every
`package/module.name` a page of README.md, docs/ or bench/README.md names (results/LOG.md is history and may name
what has gone since)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "cpu_grpo"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md"]
NOT_OURS = ("examples/scripts/grpo_tldr.py", "out/")  # TRL's file; a run's files
EXTENSIONS = ("py", "sh", "md", "yaml", "yml", "txt", "json", "jsonl", "gz", "ipynb", "toml", "png")
TEST = re.compile(r"\b(test_\w+\.py)::(test_\w+)")
PATH = re.compile(rf"`((?:[\w.-]+/)+[\w.-]+\.(?:{'|'.join(EXTENSIONS)}))`")
NAME = re.compile(r"`((?:[a-z_]+/)+[a-z_]+)\.([A-Za-z_]\w*)(?:\(\))?`")  # engine/batching.activation_bytes


def _tests() -> dict[str, str]:
    out: dict[str, str] = {}
    for f in (ROOT / "tests").rglob("test_*.py"):
        out[f.name] = out.get(f.name, "") + f.read_text()
    return out


def _defined(module: Path, name: str) -> bool:
    return bool(re.search(rf"^\s*((async )?def|class) {name}\b|^\s*{name}\s*[:=]", module.read_text(), re.M))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_what_a_doc_cites_exists(doc):
    text, tests, missing = doc.read_text(), _tests(), []
    for file, name in TEST.findall(text):
        if not re.search(rf"def {name}\b", tests.get(file, "")):
            missing.append(f"{file}::{name}")
    for path in PATH.findall(text):
        if not path.startswith(NOT_OURS) and not any((base / path).exists() for base in (ROOT, PKG, doc.parent)):
            missing.append(path)
    for module, name in NAME.findall(text):
        if name in EXTENSIONS:
            continue
        found = [m for m in (PKG / f"{module}.py", PKG / module / "__init__.py", ROOT / f"{module}.py") if m.exists()]
        if not found or not _defined(found[0], name):
            missing.append(f"{module}.{name}")
    assert not missing, f"{doc.relative_to(ROOT)} cites what is not in the tree: {missing}"
