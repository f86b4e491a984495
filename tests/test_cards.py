"""The cards under results/ keep one shape: each file is of a kind below, by its name (no scripts: they live in
experiments/ and bench/), and a run's card holds its summary and step log, with its README (plan and result) and
resolved config beside them or in the card it belongs to."""

import re
from pathlib import Path

R = Path(__file__).resolve().parents[1] / "results"
KINDS = {
    "plan and result": r"README\.md|PLAN\.md",
    "a run's own files": r"summary\.json|status\.json|forgetting\.json|train_config\.yaml|metrics\.jsonl|stages\.jsonl|"
                         r"report\.md",
    "a config file given to a run": r"[\w.-]+\.yaml",
    "per-problem evaluation records": r"[\w.,=-]+\.jsonl\.gz",  # a reasoning-gym task's config in its name
    "a comparison or ablation table": r"(compare|ABLATION)[\w.-]*\.md",
    "an agent's tool use, read from its transcripts": r"tools\.md",
    "an evaluation's console summary or a run's timing": r"[\w.-]+\.(log|txt)",
    "a plot": r"[\w.-]+\.png",
    "the results' own pages": r"LOG\.md|TASKS\.md",
}

# runs whose card gives the command and commit in its README: their run directories had no config file
NO_CONFIG_FILE = {"demo-allocator-seed0/auto", "demo-allocator-seed0/glibc", "demo-reward-hack-fix-speed-seed0/head",
                  "demo-reward-hack-fix-speed-seed0/183"}


def test_every_file_in_results_is_of_a_known_kind():
    pattern = re.compile("|".join(f"(?:{p})" for p in KINDS.values()))
    odd = [str(f.relative_to(R)) for f in R.rglob("*") if f.is_file() and not pattern.fullmatch(f.name)]
    assert not odd, f"files of no card kind (a script goes to experiments/ or bench/): {odd}"


def test_a_runs_card_holds_its_summary_step_log_readme_and_config():
    for summary in R.rglob("summary.json"):
        run = summary.parent
        card = R / run.relative_to(R).parts[0]
        around = [run, *[p for p in run.parents if p.is_relative_to(card)]]
        assert (run / "metrics.jsonl").exists(), f"{run.relative_to(R)}: no metrics.jsonl"
        for name in ("README.md", "train_config.yaml")[:1 if str(run.relative_to(R)) in NO_CONFIG_FILE else 2]:
            assert any((d / name).exists() for d in around), f"{run.relative_to(R)}: no {name} in it or its card"
