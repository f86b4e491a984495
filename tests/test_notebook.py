"""examples/notebook.ipynb runs from top to bottom (`jupyter nbconvert --execute`), on the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[1] / "examples" / "notebook.ipynb"


@pytest.mark.slow
def test_the_notebook_runs(tiny_model, tmp_path):
    env = {**os.environ, "NOTEBOOK_MODEL": tiny_model, "NOTEBOOK_STEPS": "2", "NOTEBOOK_EVAL": "6",
           "NOTEBOOK_OUT": str(tmp_path / "run")}
    done = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK),
                           "--output-dir", str(tmp_path), "--ExecutePreprocessor.timeout=600"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    cells = json.loads((tmp_path / NOTEBOOK.name).read_text())["cells"]
    printed = "".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code" for o in c["outputs"])
    assert "accuracy before" in printed and "McNemar p" in printed
    assert (tmp_path / "run" / "summary.json").exists() and (tmp_path / "run" / "eval_after.jsonl").exists()
