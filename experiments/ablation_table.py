"""results/ablation/PLAN.md's table, from the ablation's cards (results/ablation/ARM-seedS/) and the default's
(results/task-suite/basic_arithmetic-seedS/): one row a run.

    python experiments/ablation_table.py       # prints the rows; paste them between PLAN.md's table markers

For each run, on the same 200 held-out problems paired by id: its accuracy after training, the change from the
base (the same records for every arm of a seed) and from the default recipe's run of the same seed, each with its
95% interval and McNemar's exact p; the share of answers finished within the 256 evaluation tokens; the run's
minutes (summary.json's wall time). tests/test_results.py recomputes the table and compares it with PLAN.md.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from tasks_table import change, records  # noqa: E402  (a paired change as printed; a card's records)

ABLATION, SUITE = ROOT / "results" / "ablation", ROOT / "results" / "task-suite"
ARMS = {"default": "default", "code": "code recipe", "lr": "lr 2e-4", "96": "96 tokens", "nodyn": "no dynamic sampling",
        "codemask": "code recipe, cut masked"}
HEADER = ("| arm | seed | n | after | finished | change from base (95% CI) | p | change from default (95% CI) | p | "
          "minutes |\n|---|---:|---:|---:|---:|---|---:|---|---:|---:|")


def paired(before: dict, after: dict) -> tuple[str, str]:
    """The change from `before` to `after` (id -> record) on the problems both hold, as tasks_table prints it."""
    ids = sorted(set(before) & set(after))
    return change([bool(before[i]["correct"]) for i in ids], [bool(after[i]["correct"]) for i in ids])


def row(arm: str, seed: int) -> str:
    """One table line: the arm's run at `seed` against its base and the default's run."""
    default = SUITE / f"basic_arithmetic-seed{seed}"
    card = default if arm == "default" else ABLATION / f"{arm}-seed{seed}"
    before, after = records(default / "eval_before.jsonl.gz"), records(card / "eval_after.jsonl.gz")
    summary = json.loads((card / "summary.json").read_text())
    from_base = paired(before, after)
    from_default = ("-", "-") if arm == "default" else paired(records(default / "eval_after.jsonl.gz"), after)
    done = sum(bool(r.get("finished")) for r in after.values()) / len(after)
    right = sum(bool(r["correct"]) for r in after.values()) / len(after)
    return (f"| {ARMS[arm]} | {seed} | {len(after)} | {100 * right:.1f}% | {100 * done:.0f}% | {from_base[0]} | "
            f"{from_base[1]} | {from_default[0]} | {from_default[1]} | {summary['wall_seconds'] / 60:.0f} |")


def rows() -> list[str]:
    """Every arm with a card, by arm then seed; the default's runs first."""
    runs = [(arm, int(seed)) for arm, seed in
            (re.fullmatch(r"(.+)-seed(\d+)", c.name).groups() for c in ABLATION.glob("*-seed*")
             if (c / "summary.json").exists())]
    seeds = sorted({seed for _, seed in runs})
    return [row("default", s) for s in seeds] + [row(a, s) for a in ARMS if a != "default"
                                                 for s in seeds if (a, s) in runs]


if __name__ == "__main__":
    print(HEADER)
    print("\n".join(rows()))
