"""Problems from files and datasets: GSM8K-format lines (yours and the shipped GSM8K), Hugging Face datasets."""

import json
import re
import sys
import types
from pathlib import Path

import pytest

from cpu_grpo.data import loaders, tasks
from cpu_grpo.data.loaders import load_jsonl, load_task
from cpu_grpo.data.rewards import correctness_reward
from cpu_grpo.data.tasks import TaskError

GSM8K_DIR = loaders.GSM8K_DIR  # shipped inside the package
GSM8K_TEST = GSM8K_DIR / "test.jsonl.gz"


def write(tmp_path: Path, rows: list[object | str], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


# ---------------------------------------------------------------------------- JSONL
def test_real_gsm8k_test_file():
    data = load_task("gsm8k", split=None)
    assert len(data) == 1319
    first = data[0]
    assert first.answer == "18" and first.id == "test.jsonl:1" and first.difficulty == "gsm8k"
    assert first.question.startswith("Janet") and first.solution.endswith("#### 18")
    assert all(re.fullmatch(r"-?\d+(\.\d+)?", e.answer) for e in data)
    mine = load_task(str(GSM8K_TEST), n=5, split=None)  # `cpu-grpo eval`: the file as it is, named after itself
    assert [e.question for e in mine] == [e.question for e in data[:5]] and {e.difficulty for e in mine} == {"test"}


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
    other = "train" if tasks.split_of(rows[0]["question"]) == "test" else "test"
    with pytest.raises(TaskError, match=f"none of its questions falls in the {other} split"):
        load_task(str(one), split=other)


def test_gold_answers_are_cleaned(tmp_path):
    path = write(tmp_path, [
        {"question": "a?", "answer": "so\n#### 1,234"},
        {"question": "b?", "answer": "x #### 2 #### $1,234.50"},
        {"question": "c?", "answer": "#### 7.0", "difficulty": "hard"},
        {"question": "d?", "answer": "#### 50%", "level": 3},
    ])
    data = load_jsonl(path)
    assert [e.answer for e in data] == ["1234", "1234.5", "7", "50%"]
    assert [e.difficulty for e in data] == ["data", "data", "hard", "3"]  # named after the file, not "gsm8k"
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


def test_a_gsm8k_row_whose_final_answer_is_not_a_number_is_a_bad_line(tmp_path):
    """`#### forty-two` gave a problem no completion can earn: it is refused at load as `file:line`, like any
    malformed row, and --skip-bad-lines skips it with a count."""
    rows = [{"question": "ok?", "answer": "6 * 7 = 42\n#### 42"}, {"question": "words?", "answer": "#### forty-two"},
            {"question": "units?", "answer": "#### 3 apples"}, {"question": "empty?", "answer": "x\n####  $ "}]
    path = write(tmp_path, rows)
    with pytest.raises(TaskError) as err:
        load_jsonl(path)
    assert str(err.value) == (f"{path}:2: the answer after '####' is 'forty-two', not a number: write it as "
                              "'#### <number>'. Fix the line or pass --skip-bad-lines to skip it.")
    with pytest.warns(UserWarning, match=r"skipped 2 malformed line\(s\), first at line 2: the answer after '####' "
                                         r"is 'forty-two', not a number"):
        data = load_task(str(path), on_error="skip", split=None)
    assert [e.answer for e in data] == ["42", "3 apples"]  # 3 apples: answers_match reads 3 from it
    assert correctness_reward(["#### 3"], answer=[data[1].answer]) == [1.0]


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
    with pytest.raises(TaskError, match=r"needs the 'datasets' package: pip install 'cpu-grpo\[data\]'.*\.jsonl"):
        load_task("hf:openai/gsm8k")


def test_hf_unreachable_hub_says_how_to_fix(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(TaskError, match=r"could not load 'openai/gsm8k'.*ConnectionError.*local file"):
        load_task("hf:openai/gsm8k:main:test")


def test_hf_rows_convert_like_jsonl(monkeypatch):
    """hf:NAME[:config][:split]; a split named alone (hf:NAME:test) is a split, as before configs were named."""
    calls = []

    def fake(name, config, split):
        calls.append((name, config, split))
        return [{"question": "q1?", "answer": "w\n#### 1,000"}, {"question": "q2?", "answer": "#### 2"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake))
    data = load_task("hf:openai/gsm8k:main:test", n=1, split=None)  # a split named: all of it (a run splits it)
    assert [(e.answer, e.id, e.difficulty) for e in data] == [("1000", "openai/gsm8k:test:0", "gsm8k")]
    assert len(load_task("hf:me/data:train", split=None)) == 2
    assert calls == [("openai/gsm8k", "main", "test"), ("me/data", None, "train")]
    with pytest.raises(TaskError, match="needs a dataset name"):
        load_task("hf:")


def test_files_as_spreadsheets_and_pandas_write_them_load_right_or_say_why(tmp_path):
    """A UTF-8 byte-order mark (Excel's "CSV UTF-8") was read into the first column's name; a CSV row with an
    unquoted comma was found only when a batch drew it, blaming the reward; chat messages in a CSV cell arrived as
    one user message holding JSON text; a cut or foreign .parquet file ended in pyarrow's traceback."""
    rows = [{"prompt": f"Say {i}.", "answer": str(i)} for i in range(10)]
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    header = "prompt,answer\n" + "".join(f"Say {i}.,{i}\n" for i in range(10))
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + header.encode())
    for name in ("bom.jsonl", "bom.csv"):
        got = load_task(str(tmp_path / name), split=None)
        assert [ex.question for ex in got] == [r["prompt"] for r in rows] and got[0].columns == {"answer": "0"}
    (tmp_path / "extra.csv").write_text(header + "Say 10, please.,10\n" + "Say 11.,11\n")
    with pytest.raises(TaskError, match=r"extra.csv:12: 3 fields where the header has 2: quote a field that holds "
                                        r"a comma .*--skip-bad-lines"):
        load_task(str(tmp_path / "extra.csv"), split=None)
    with pytest.warns(UserWarning, match="skipped 1 malformed line"):
        assert len(load_task(str(tmp_path / "extra.csv"), split=None, on_error="skip")) == 11
    chat = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of Peru?"}]
    import csv

    with open(tmp_path / "chat.csv", "w", newline="") as f:
        csv.writer(f).writerows([["prompt", "answer"], [json.dumps(chat), "Lima"]])
    (got,) = load_task(str(tmp_path / "chat.csv"), split=None)
    assert got.messages == tuple(chat) and got.question == "Answer in one word.\nCapital of Peru?"
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "text.parquet").write_text("prompt,answer\nSay 1.,1\n")
    for name in ("cut.parquet", "text.parquet"):
        with pytest.raises(TaskError, match=f"{name}: not a readable Parquet file .*write it again"):
            load_task(str(tmp_path / name), split=None)


def test_a_chat_role_no_template_knows_names_the_row(tmp_path):
    """A template that renders any role name (the tiny models', SmolLM2's) would take a 'robot' turn in silence."""
    rows = ['{"prompt": [{"role": "user", "content": "What is 1 + 1?"}], "answer": "2"}',
            '{"prompt": [{"role": "robot", "content": "What is 2 + 2?"}], "answer": "4"}']
    path = write(tmp_path, rows, "chat.jsonl")
    with pytest.raises(TaskError, match=r"chat.jsonl:2: its 'prompt' messages have the role 'robot', which chat "
                                        r"templates do not know: use assistant, system, tool, user\. Fix the line"):
        load_jsonl(path)
