"""What an agent's held-out evaluation did with its tools (issue 69's proof, results/agent-gsm8k/PLAN.md).

    .venv/bin/python experiments/agent_transcripts.py runs/agent-gsm8k-calculator-seed0 [results/agent-gsm8k/NAME]

Reads each evaluation of the run that kept transcripts (eval_before.jsonl, eval_after.jsonl) and prints, per
evaluation: problems, calls a problem, calls that failed (an unknown name, a bad expression, a malformed call),
problems answered without a call, and for the right and the wrong answers how many copy a tool's result (the
boxed number equals a number a tool returned) and how many had the gold number among the tool's results. With a
card directory, the table goes to its tools.md and one line a problem (id, correct, calls, failed, the tools'
results cut to 40 characters, answer_from_tool, gold_from_tool) to tools-NAME.jsonl.gz: transcripts stay in runs/.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from cpu_grpo.data.answers import answers_match, extract_answer
from cpu_grpo.rundir import read_jsonl


def tool_use(record: dict) -> dict:
    """One problem's use of its tools, from its transcript."""
    results = [m["content"] for m in record["transcript"] if m["role"] == "tool"]
    pred = extract_answer(record["completion"], "auto")
    return {"id": record["id"], "correct": record["correct"], "calls": record["tool_calls"],
            "failed": record["tool_failures"], "results": [r[:40] for r in results],
            "answer_from_tool": pred is not None and any(answers_match(pred, r) for r in results),
            "gold_from_tool": any(answers_match(r, record["answer"]) for r in results)}


def table(name: str, uses: list[dict]) -> list[str]:
    """The markdown rows of one evaluation: all problems, then the right and the wrong ones."""
    rows = []
    for part, chosen in (("all", uses), ("right", [u for u in uses if u["correct"]]),
                         ("wrong", [u for u in uses if not u["correct"]])):
        n, calls = len(chosen), sum(u["calls"] for u in chosen)
        if not n:
            continue
        rows.append(f"| {name} | {part} | {n} | {calls / n:.2f} | {sum(u['failed'] for u in chosen)} of {calls} | "
                    f"{sum(not u['calls'] for u in chosen)} | {sum(u['answer_from_tool'] for u in chosen)} | "
                    f"{sum(u['gold_from_tool'] for u in chosen)} |")
    return rows


def main(run: Path, card: Path | None) -> None:
    lines = ["| evaluation | problems | n | calls a problem | failed calls | without a call | answer copies a "
             "tool result | gold among the results |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for path in sorted(run.glob("eval_*.jsonl")):
        records, name = read_jsonl(path), path.stem.removeprefix("eval_")
        if not records or "transcript" not in records[0]:
            continue
        uses = [tool_use(r) for r in records]
        lines += table(name, uses)
        if card is not None:
            with gzip.open(card / f"tools-{name}.jsonl.gz", "wt") as f:
                f.write("".join(json.dumps(u) + "\n" for u in uses))
    print("\n".join(lines))
    if card is not None:
        (card / "tools.md").write_text(f"# Tool use in {run.name}'s held-out evaluations\n\nMade by "
                                       "experiments/agent_transcripts.py from the transcripts.\n\n"
                                       + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
