"""experiments/card.py: a run's card keeps every evaluation as NAME.jsonl.gz, reused base evaluations included."""

import gzip
import importlib.util
import json
from pathlib import Path

spec = importlib.util.spec_from_file_location("card", Path(__file__).parents[1] / "experiments" / "card.py")
card = importlib.util.module_from_spec(spec)
spec.loader.exec_module(card)


def test_a_card_keeps_full_and_reused_compact_evaluations(tmp_path):
    run, out = tmp_path / "run", tmp_path / "card"
    run.mkdir()
    rows = [{"id": f"basic-test-{i}", "difficulty": "basic", "answer": str(i), "pred": str(i), "correct": True}
            for i in range(600)]  # a card's compact records, copied into the run: > card.SMALL bytes
    (run / "eval_before.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_after.jsonl").write_text("".join(json.dumps({**r, "completion": "x"}) + "\n" for r in rows))
    assert (run / "eval_before.jsonl").stat().st_size > card.SMALL
    card.make_card(run, out, "`run`", "run", [])
    for name in ("eval_before", "eval_after"):
        kept = [json.loads(line) for line in gzip.open(out / f"{name}.jsonl.gz", "rt")]
        assert kept == rows, name
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "eval_after.jsonl.gz", "eval_before.jsonl.gz"]  # no
    # completion kept


def test_a_card_leaves_out_every_console_log(tmp_path):
    run, out = tmp_path / "run", tmp_path / "card"
    run.mkdir()
    for name in ("console.log", "console.out", "console-resume.log"):  # raw console output stays out of the tree
        (run / name).write_text("step 1\n")
    (run / "summary.json").write_text("{}")
    card.make_card(run, out, "`run`", "run", [])
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("console")) == []
