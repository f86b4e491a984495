"""Arithmetic slips in a run's answers: of the equations `a op b = c` (+, -, \\times, *) written in the completions,
how many are wrong. Evaluation files (eval_before.jsonl, eval_after.jsonl) or groups.jsonl (sampled completions, by
step); one problem type kept apart by a fragment of its question (default: the bike type of docs/learning.md).

    .venv/bin/python bench/dev/arithmetic_slips.py docs/runs/NAME/eval_before.jsonl docs/runs/NAME/eval_after.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

EQUATION = re.compile(r"(\d+(?:\.\d+)?)\s*(\+|-|\\times|\*)\s*(\d+(?:\.\d+)?)\s*=\s*(\d+(?:\.\d+)?)")


def slips(text: str) -> tuple[int, int]:
    """(equations, wrong ones) in a text; thousands separators dropped."""
    found = EQUATION.findall(text.replace(",", ""))
    wrong = 0
    for a, op, b, c in found:
        a, b, c = float(a), float(b), float(c)
        wrong += abs((a + b if op == "+" else a - b if op == "-" else a * b) - c) > 1e-6
    return len(found), wrong


def main(paths: list[str], apart: str = "wants a bike") -> None:
    for path in paths:
        counts = defaultdict(lambda: [0, 0, 0])  # key -> equations, wrong, answers right
        for line in open(path):
            x = json.loads(line)
            kind = "apart" if apart in x["question"] else "rest"
            if "completions" in x:  # a GRPO group: by step
                for text, right in zip(x["completions"], x["rewards"]["correctness_reward"], strict=True):
                    n, bad = slips(text)
                    c = counts[(x["step"], kind)]
                    c[0], c[1], c[2] = c[0] + n, c[1] + bad, c[2] + right
            else:
                n, bad = slips(x["completion"])
                c = counts[kind]
                c[0], c[1], c[2] = c[0] + n, c[1] + bad, c[2] + x["correct"]
        print(path)
        for key, (n, bad, right) in sorted(counts.items()):
            print(f"  {key}: {bad} of {n} equations wrong ({bad / max(1, n):.1%}), {right:g} answers right")


if __name__ == "__main__":
    main(sys.argv[1:])
