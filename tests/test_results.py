"""README's results table, recomputed from the cards' per-problem files in results/ (no model, no network).

For each profile, seed and level: the before and after accuracy on the same problems (paired by id) and the
paired change; then the mean, min and max over seeds, rounded as README prints them. And every relative link into
results/ from README.md, docs/, results/LOG.md and the cards resolves.
"""

import gzip
import json
import re
from pathlib import Path

from cpu_grpo.eval import stats

ROOT = Path(__file__).resolve().parents[1]
R = ROOT / "results"
DEFAULT = ["default-seed0", "default-seed1", "default-seed2"]  # seeds 0, 1, 2


def load(path: Path, renumber_from: int = 0, field: str = "correct") -> dict[str, bool]:
    """id -> (level, `field`: correct, or correct_strict for lm-eval's strict match); the GSM8K files of lines
    501-1319 are renamed test.jsonl:N as experiments/gsm8k_merge.py does."""
    with gzip.open(path, "rt") as f:
        records = [json.loads(line) for line in f]
    out = {}
    for r in records:
        key = r["id"]
        if renumber_from:
            key = f"test.jsonl:{renumber_from + int(key.rsplit(':', 1)[1])}"
        out[key] = (r["difficulty"], bool(r[field]))
    return out


def gsm8k_1319(first_500: Path, rest: Path | None) -> dict:
    """All 1,319 GSM8K test problems: the first 500 from one file and lines 501-1319 from another."""
    return {**load(first_500), **(load(rest, renumber_from=500) if rest else {})}


def pairs() -> dict[tuple[str, str], list[tuple[dict, dict]]]:
    """(profile, level as README names it) -> one (before, after) pair of id -> (level, correct) maps per seed."""
    demo, strict = ([(load(R / f"demo-format/seed{s}/eval_before.jsonl.gz", field=field),
                      load(R / f"demo-format/seed{s}/eval_after.jsonl.gz", field=field)) for s in range(3)]
                    for field in ("correct", "correct_strict"))
    default = [(load(R / run / "eval_before.jsonl.gz"), load(R / run / "eval_after.jsonl.gz")) for run in DEFAULT]
    full = R / "default-gsm8k-full"
    base = gsm8k_1319(R / "default-gsm8k-first500-seed1/base.jsonl.gz", full / "base.jsonl.gz")
    gsm8k = [(base, gsm8k_1319(R / "default-gsm8k-first500-seed0/seed0.jsonl.gz", full / "seed0.jsonl.gz")),
             (base, gsm8k_1319(R / "default-gsm8k-first500-seed1/seed1.jsonl.gz", full / "seed1.jsonl.gz")),
             (base, load(R / "default-seed2/gsm8k-1319.jsonl.gz"))]
    out = {("demo", "basic"): demo, ("demo", "basic, strict `#### N`"): strict, ("default", "gsm8k"): gsm8k}
    for level in ("basic", "intermediate", "advanced"):
        out[("default", level)] = default
    return out


def row(level: str, seeds: list[tuple[dict, dict]]) -> list[str]:
    """The README cells for one row: n, before, after (means over seeds), change mean (min to max), significant."""
    befores, afters, changes, significant, ns = [], [], [], 0, set()
    for before, after in seeds:
        ids = sorted(i for i in before if i in after and before[i][0] == level)
        b = [before[i][1] for i in ids]
        a = [after[i][1] for i in ids]
        cmp = stats.paired_comparison(b, a)
        ns.add(len(ids))
        befores.append(100 * sum(b) / len(b))
        afters.append(100 * sum(a) / len(a))
        changes.append(100 * cmp["diff"])
        significant += cmp["significant"]
    assert len(ns) == 1, f"the seeds of {level} scored different numbers of problems: {ns}"
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return [f"{ns.pop():,}", f"{mean(befores):.1f}%", f"{mean(afters):.1f}%",
            f"{mean(changes):+.1f} ({min(changes):+.1f} to {max(changes):+.1f})", f"{significant} of {len(seeds)}"]


def readme_rows() -> dict[tuple[str, str], list[str]]:
    """The results table as README.md prints it: (profile, level) -> [n, before, after, change, significant]."""
    text = (ROOT / "README.md").read_text()
    table = text.split("<!-- results table -->")[1]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not re.match(r"\d", cells[2]):
            continue
        profile = cells[0].split()[0]
        level = "gsm8k" if cells[1].startswith("GSM8K") else cells[1]
        rows[(profile, level)] = cells[2:7]
    return rows


def test_readme_results_table_recomputes_from_the_cards():
    printed = readme_rows()
    computed = {key: row(key[1].split(",")[0], seeds) for key, seeds in pairs().items()}
    assert set(printed) == set(computed)
    for key, cells in computed.items():
        assert printed[key] == cells, f"{key}: README prints {printed[key]}, the cards give {cells}"


def test_links_into_results_resolve():
    link = re.compile(r"\[[^\]]*\]\(([^)\s#]+)[^)]*\)")  # [text](path#anchor): the path
    docs = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), R / "LOG.md", *R.rglob("README.md")]
    broken = [f"{doc.relative_to(ROOT)}: {target}" for doc in docs for target in link.findall(doc.read_text())
              if not re.match(r"[a-z]+:", target) and (doc.parent / target).resolve().is_relative_to(R)
              and not (doc.parent / target).exists()]
    assert not broken, broken


def table_rows(script: str, page: Path, marker: str) -> tuple[list[str], list[str]]:
    """The rows `page` prints between its `<!-- MARKER -->` and `<!-- end MARKER -->`, and the header and rows
    experiments/SCRIPT.py computes from the cards."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script, ROOT / "experiments" / f"{script}.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    printed = page.read_text().split(f"<!-- {marker} -->")[1].split(f"<!-- end {marker} -->")[0]
    return printed.strip().splitlines(), [*table.HEADER.splitlines(), *table.rows()]


def test_tasks_table_recomputes_from_the_cards():
    """results/TASKS.md lists every run of the task suite that has a card, as experiments/tasks_table.py computes
    it from the card's per-problem files."""
    printed, computed = table_rows("tasks_table", R / "TASKS.md", "tasks table")
    assert printed == computed


def test_ablation_table_recomputes_from_the_cards():
    """results/ablation/PLAN.md's result lists every run of the knob ablation that has a card, as
    experiments/ablation_table.py computes it from the cards' per-problem files."""
    printed, computed = table_rows("ablation_table", R / "ablation" / "PLAN.md", "ablation table")
    assert printed == computed


def test_a_suite_run_repeated_makes_the_same_predictions_and_steps():
    """results/task-suite-repeat/ holds task-suite runs made again (same command, code and seed): each repeat's
    answers before and after training, and each step's reward and loss, are its first run's."""
    repeats = sorted((R / "task-suite-repeat").glob("*-seed*"))
    assert repeats
    for repeat in repeats:
        first = R / "task-suite" / repeat.name
        for name in ("eval_before.jsonl.gz", "eval_after.jsonl.gz"):
            with gzip.open(first / name, "rt") as a, gzip.open(repeat / name, "rt") as b:
                assert [json.loads(x)["pred"] for x in a] == [json.loads(x)["pred"] for x in b], (repeat.name, name)
        steps = [[(s["reward"], s["loss"]) for s in map(json.loads, (run / "metrics.jsonl").open())]
                 for run in (first, repeat)]
        assert steps[0] == steps[1], repeat.name


def test_demo_format_table_recomputes_from_the_cards():
    """results/demo-format/PLAN.md's result lists every seed of the demo run at its shipped recipe, as
    experiments/demo_format_table.py computes it from the cards' per-problem files."""
    printed, computed = table_rows("demo_format_table", R / "demo-format" / "PLAN.md", "demo-format table")
    assert printed == computed
