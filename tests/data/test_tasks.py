import ast
import json
import re
import zlib
from fractions import Fraction
from pathlib import Path

import pytest

from cpu_grpo.data import tasks
from cpu_grpo.data.example import Example
from cpu_grpo.data.loaders import load_task
from cpu_grpo.data.tasks import LEVELS, TaskError, canonical_number, generate

ANNOTATION = re.compile(r"<<([^=<>]+)=([^<>]+)>>")
STEPS = {"basic": (1, 1), "intermediate": (2, 3), "advanced": (4, 99)}  # annotations per solution


def calc(expr: str) -> Fraction:
    """Independent exact evaluator for calculator annotations: numbers, + - * /, parentheses only."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b}

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return Fraction(str(node.value))
        raise AssertionError(f"unexpected syntax in annotation {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


@pytest.fixture(scope="module")
def splits() -> dict[str, tuple[list[Example], list[Example]]]:
    """Per level: 3000 train problems (seed 1) and 1000 test problems (seed 2)."""
    return {lv: (generate(lv, 3000, seed=1), generate(lv, 1000, seed=2, split="test")) for lv in LEVELS}


def write(tmp_path: Path, rows: list[object | str], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


# ---------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("x, want", [
    (18.0, "18"), (18, "18"), (3.5, "3.5"), (Fraction(1, 3), "0.3333"), (Fraction(2, 3), "0.6667"),
    (-4, "-4"), (-2.5, "-2.5"), (0.1, "0.1"), (-0.00001, "0"), (1e20, "100000000000000000000"),
    (Fraction(7, 4), "1.75"), (1234567, "1234567"),
])
def test_canonical_number(x, want):
    assert canonical_number(x) == want




# ---------------------------------------------------------------------------- generator
@pytest.mark.parametrize("level", LEVELS)
def test_generate_is_deterministic(level):
    a = generate(level, 40, seed=5)
    assert a == generate(level, 40, seed=5)
    assert [e.question for e in a] != [e.question for e in generate(level, 40, seed=6)]
    assert [e.id for e in a[:2]] == [f"{level}-train-0", f"{level}-train-1"]
    assert {e.difficulty for e in a} == {level}


@pytest.mark.parametrize("level", LEVELS)
def test_train_and_test_never_overlap(splits, level):
    train, test = splits[level]
    train_q, test_q = {e.question for e in train}, {e.question for e in test}
    assert len(train_q) == 3000 and len(test_q) == 1000  # no duplicates within a call
    assert not train_q & test_q
    assert all(zlib.crc32(q.encode()) % 5 == 0 for q in test_q)
    assert all(zlib.crc32(q.encode()) % 5 != 0 for q in train_q)


@pytest.mark.parametrize("level", LEVELS)
def test_solutions_recompute_to_the_answer(splits, level):
    lo, hi = STEPS[level]
    for ex in splits[level][0][:400] + splits[level][1][:200]:
        found = ANNOTATION.findall(ex.solution)
        assert lo <= len(found) <= hi, ex.solution
        for expr, value in found:
            assert calc(expr) == Fraction(value), ex.solution
        assert found[-1][1] == ex.answer
        assert ex.solution.splitlines()[-1] == f"#### {ex.answer}"
        answer = Fraction(ex.answer)
        assert answer >= 0 and (answer * 100).denominator == 1 and canonical_number(answer) == ex.answer


@pytest.mark.parametrize("level", LEVELS)
def test_counts_of_things_are_whole_numbers(splits, level):
    for ex in splits[level][0][:500]:
        if not any(w in ex.question for w in ("dollars", "How much", "miles")):
            assert "." not in ex.answer, ex.question


def test_basic_answers_are_small(splits):
    answers = [Fraction(e.answer) for e in splits["basic"][0]]
    assert sum(a < 1000 for a in answers) >= 0.95 * len(answers)


@pytest.mark.parametrize("level", LEVELS)
def test_wording_varies(splits, level):
    questions = [e.question for e in splits[level][0][:200]]
    names = set(tasks._FEMALE + tasks._MALE)
    assert len({w for q in questions for w in re.findall(r"[A-Z][a-z]+", q)} & names) >= 40
    assert len({i for q in questions for i in tasks._ITEMS if f" {i}" in q}) >= 25
    assert len(tasks._TEMPLATES[level]) >= 8
    words = re.compile(r"\b(" + "|".join(sorted(names | set(tasks._ITEMS), key=len, reverse=True)) + r")\b")
    pronouns = re.compile(r"\b(she|he|her|him|his|She|He)\b")
    skeletons = {pronouns.sub("P", words.sub("X", re.sub(r"\d+(\.\d+)?", "N", q))) for q in questions}
    assert len(skeletons) >= 8  # many different templates, not one template with new numbers


def test_mix_interleaves_equal_thirds():
    mix = load_task("mix", n=10, seed=3)
    assert [e.difficulty for e in mix[:4]] == ["basic", "intermediate", "advanced", "basic"]
    assert [e.difficulty for e in mix].count("basic") == 4 and len(mix) == 10
    assert mix == load_task("mix", n=10, seed=3)
    assert len({e.id for e in mix}) == 10


def test_levels_joined_by_plus_interleave_equal_shares():
    both = load_task("basic+intermediate", n=5, seed=3)
    assert [e.difficulty for e in both] == ["basic", "intermediate", "basic", "intermediate", "basic"]
    assert both[::2] == load_task("basic", n=3, seed=3) and both[1::2] == load_task("intermediate", n=2, seed=3)
    assert load_task("basic+intermediate+advanced", n=10, seed=3) == load_task("mix", n=10, seed=3)
    for bad in ("basic+expert", "basic+basic", "basic+"):
        with pytest.raises(TaskError, match=f"unknown task '{re.escape(bad)}'"):
            load_task(bad, n=4)


def test_a_level_joined_with_gsm8k_draws_both_in_equal_shares_and_is_held_out_as_each():
    from cpu_grpo.data.tasks import parts_of

    both = load_task("advanced+gsm8k", n=5, seed=3)
    assert [e.difficulty for e in both] == ["advanced", "gsm8k", "advanced", "gsm8k", "advanced"]
    assert both[::2] == load_task("advanced", n=3, seed=3) and both[1::2] == load_task("gsm8k", n=2)
    assert [e.id for e in both[1::2]] == ["train.jsonl.gz:1", "train.jsonl.gz:2"]  # training problems in a run
    assert [e.id for e in load_task("advanced+gsm8k", n=2, split="test")][1:] == ["test.jsonl:1"]
    assert parts_of("intermediate+advanced+gsm8k") == ["intermediate", "advanced", "gsm8k"]
    assert parts_of("mix") == ["mix"] and parts_of("gsm8k") == ["gsm8k"]
    for bad in ("gsm8k+gsm8k", "gsm8k+gsm8k-train", "gsm8k+mix", "gsm8k+"):
        with pytest.raises(TaskError, match=f"unknown task '{re.escape(bad)}'"):
            load_task(bad, n=4)


def test_load_task_levels():
    assert len(load_task("advanced", n=7, split="test")) == 7
    assert len(load_task("basic")) == 500
    assert load_task("intermediate", n=0) == []


@pytest.mark.parametrize("call", [lambda: generate("expert", 3), lambda: load_task("expert")])
def test_unknown_level_says_what_to_use(call):
    with pytest.raises(TaskError, match="unknown task 'expert': use one of basic, intermediate, advanced, "
                                        "mix, countdown, code, gsm8k, gsm8k-train, rg:NAME \\(a reasoning-gym task\\), "
                                        "levels joined by '\\+' "
                                        "\\(basic\\+intermediate, advanced\\+gsm8k\\), a data file"):
        call()


def test_bad_split_and_n():
    with pytest.raises(TaskError, match="use train or test"):
        generate("basic", 3, split="dev")
    with pytest.raises(TaskError, match="non-negative"):
        generate("basic", -1)


def test_generate_gives_up_when_it_cannot_find_enough(monkeypatch):
    one_question = (dict(a=(1,)), "What is {a} plus {a}?", ["It is [a+a]"], "2*a")
    monkeypatch.setitem(tasks._TEMPLATES, "basic", (one_question,))
    with pytest.raises(TaskError, match="found only"):
        generate("basic", 2, split="train")
    with pytest.raises(TaskError, match="found only"):
        generate("basic", 2, split="test")


@pytest.mark.parametrize("level", LEVELS)
def test_every_problem_names_its_type(level):
    """The report's by-type table groups by these names: one per template, distinct within a level."""
    names = [tasks.template_name(t) for t in tasks._TEMPLATES[level]]
    assert len(set(names)) == len(names)
    problems = generate(level, 200, split="test")
    assert {p.template for p in problems} == set(names)  # 200 draws reach every template
    bike = [p for p in generate("intermediate", 200, split="test") if "wants a bike" in p.question]
    assert bike and {p.template for p in bike} == {"_ wants a bike that costs ..."}
