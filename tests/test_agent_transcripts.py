"""experiments/agent_transcripts.py: what an agent's evaluation did with its tools, read from the transcripts."""

import gzip
import importlib.util
import json
from pathlib import Path

spec = importlib.util.spec_from_file_location("agent_transcripts",
                                              Path(__file__).parents[1] / "experiments" / "agent_transcripts.py")
agent_transcripts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent_transcripts)


def record(id_, answer, completion, results, failed=0, correct=False):
    transcript = [{"role": "tool", "name": "calculator", "content": r} for r in results]
    return {"id": id_, "answer": answer, "completion": completion, "correct": correct, "tool_calls": len(results),
            "tool_failures": failed, "transcript": transcript + [{"role": "assistant", "content": completion}]}


def test_answers_copied_from_a_tool_and_gold_among_the_results_are_counted(tmp_path):
    run, card = tmp_path / "run", tmp_path / "card"
    run.mkdir(), card.mkdir()
    rows = [record("a", "16", "so 16\n\\boxed{16}", ["80", "16"], correct=True),
            record("b", "5", "\\boxed{7}", ['{"error": "Tool x not found."}', "7"], failed=1),
            record("c", "5", "\\boxed{5.0}", ["2", "5"]),  # the gold computed, the answer judged wrong anyway
            record("d", "5", "\\boxed{7}", [])]
    (run / "eval_after.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    agent_transcripts.main(run, card)
    uses = [json.loads(line) for line in gzip.open(card / "tools-after.jsonl.gz", "rt")]
    assert [(u["answer_from_tool"], u["gold_from_tool"]) for u in uses] == \
        [(True, True), (True, False), (True, True), (False, False)]
    table = (card / "tools.md").read_text()
    assert "| after | all | 4 | 1.50 | 1 of 6 | 1 | 3 | 2 |" in table
    assert "| after | right | 1 | 2.00 | 0 of 2 | 0 | 1 | 1 |" in table
