import ast
import doctest
import json
import re
import sys
import types
import zlib
from fractions import Fraction
from pathlib import Path

import pytest

from cpu_grpo import tasks
from cpu_grpo.tasks import LEVELS, Example, TaskError, canonical_number, generate, load_jsonl, load_task

GSM8K_DIR = tasks.GSM8K_DIR  # shipped inside the package
GSM8K_TEST = GSM8K_DIR / "test.jsonl"
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


def test_module_doctests_pass():
    assert doctest.testmod(tasks).failed == 0


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


def test_load_task_levels():
    assert len(load_task("advanced", n=7, split="test")) == 7
    assert len(load_task("basic")) == 500
    assert load_task("intermediate", n=0) == []


@pytest.mark.parametrize("call", [lambda: generate("expert", 3), lambda: load_task("expert")])
def test_unknown_level_says_what_to_use(call):
    with pytest.raises(TaskError, match="unknown task 'expert': use one of basic, intermediate, advanced, "
                                        "mix, gsm8k, gsm8k-train, a .jsonl path, or hf:NAME"):
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


# ---------------------------------------------------------------------------- JSONL
def test_real_gsm8k_test_file():
    data = load_jsonl(GSM8K_TEST)
    assert len(data) == 1319
    first = data[0]
    assert first.answer == "18" and first.id == "test.jsonl:1" and first.difficulty == "gsm8k"
    assert first.question.startswith("Janet") and first.solution.endswith("#### 18")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", e.answer) for e in data)
    assert load_task(str(GSM8K_TEST), n=5, split=None) == data[:5]  # `cpu-grpo eval`: the file as it is


def test_shipped_gsm8k_needs_no_path():
    test, train = load_task("gsm8k", split="test"), load_task("gsm8k", split="train")
    assert len(test) == 1319 and len(train) == 7473
    assert test[0].question.startswith("Janet") and test[0].answer == "18"
    assert not {e.question for e in test} & {e.question for e in train}
    assert load_task("gsm8k-train", n=3, split="test") == test[:3]  # a run on it holds out the test file
    assert load_task("gsm8k-train", n=3, split=None) == train[:3]  # `cpu-grpo eval`: training problems
    assert load_task("gsm8k", n=3, split=None) == test[:3]
    assert (GSM8K_DIR / "LICENSE").read_text().startswith("MIT License")


def test_a_file_task_never_holds_out_a_training_problem(tmp_path):
    rows = [{"question": f"Problem {i}: what is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(200)]
    path = write(tmp_path, rows)
    train, test = load_task(str(path), split="train"), load_task(str(path), split="test")
    assert len(train) + len(test) == 200 and 20 < len(test) < 60  # a fifth held out, by a hash of the text
    assert not {e.question for e in train} & {e.question for e in test}
    assert load_task(str(path), n=5, split="test") == test[:5]  # always the same ones, in file order
    one = write(tmp_path, rows[:1], "one.jsonl")
    other = "train" if tasks._split_of(rows[0]["question"]) == "test" else "test"
    with pytest.raises(TaskError, match=f"none of its questions falls in the {other} split"):
        load_task(str(one), split=other)


def test_gold_answers_are_cleaned(tmp_path):
    path = write(tmp_path, [
        {"question": "a?", "answer": "so\n#### 1,234"},
        {"question": "b?", "answer": "x #### 2 #### $1,234.50"},
        {"question": "c?", "answer": "#### 7.0", "difficulty": "hard"},
        {"question": "d?", "answer": "#### yes", "level": 3},
    ])
    data = load_jsonl(path)
    assert [e.answer for e in data] == ["1234", "1234.5", "7", "yes"]
    assert [e.difficulty for e in data] == ["gsm8k", "gsm8k", "hard", "3"]
    assert data[1].id == "data.jsonl:2" and data[1].solution == "x #### 2 #### $1,234.50"
    assert len(load_jsonl(path, limit=2)) == 2


BAD_LINES = [
    {"question": "ok?", "answer": "#### 18"},
    '{"question": "broken',
    "[1, 2]",
    "",
    {"question": "no answer"},
    {"question": "no marker", "answer": "18"},
    {"question": "", "answer": "#### 3"},
    {"question": "also ok?", "answer": "#### 4"},
]


def test_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path, BAD_LINES)
    with pytest.raises(TaskError) as err:
        load_jsonl(path)
    assert f"{path}:2: invalid JSON" in str(err.value) and "--skip-bad-lines" in str(err.value)
    with pytest.raises(TaskError, match=r"b.jsonl:3: the 'answer' must end in a '#### <number>' line\. Fix"):
        load_jsonl(write(tmp_path, [BAD_LINES[0], "", BAD_LINES[5]], "b.jsonl"))
    assert len(load_jsonl(path, limit=1)) == 1  # stops before the bad lines


def test_skip_mode_counts_and_warns(tmp_path):
    path = write(tmp_path, BAD_LINES)
    with pytest.warns(UserWarning, match=r"skipped 5 malformed line\(s\), first at line 2: invalid JSON"):
        data = load_jsonl(path, on_error="skip")
    assert [e.answer for e in data] == ["18", "4"]
    assert [e.id for e in data] == ["data.jsonl:1", "data.jsonl:8"]
    with pytest.warns(UserWarning):
        assert load_task(str(path), on_error="skip", split=None) == data


def test_missing_empty_and_bad_options(tmp_path):
    with pytest.raises(TaskError, match="data file not found: .*nope.jsonl: check the path"):
        load_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(TaskError, match="data file not found"):
        load_task(str(tmp_path / "nope.jsonl"))
    with pytest.raises(TaskError, match="no examples found"):
        load_jsonl(write(tmp_path, ["", "  "]))
    with pytest.raises(TaskError, match="on_error must be"):
        load_jsonl(write(tmp_path, BAD_LINES[:1]), on_error="ignore")


# ---------------------------------------------------------------------------- Hugging Face
def test_hf_without_datasets_says_how_to_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(TaskError, match=r"pip install datasets.*local \.jsonl path"):
        load_task("hf:openai/gsm8k")


def test_hf_unreachable_hub_says_how_to_fix(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(TaskError, match=r"could not load 'openai/gsm8k'.*ConnectionError.*local \.jsonl"):
        tasks.load_hf()


def test_hf_rows_convert_like_jsonl(monkeypatch):
    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return [{"question": "q1?", "answer": "w\n#### 1,000"}, {"question": "q2?", "answer": "#### 2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake))
    data = load_task("hf:openai/gsm8k", n=1, split="test")
    assert [(e.answer, e.id, e.difficulty) for e in data] == [("1000", "openai/gsm8k:test:0", "gsm8k")]
    assert len(load_task("hf:me/data:train")) == 2
    assert calls == [("openai/gsm8k", "main", "test"), ("me/data", "main", "train")]
    with pytest.raises(TaskError, match="needs a dataset name"):
        load_task("hf:")
