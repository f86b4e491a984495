"""Problems from any task spec: a generated level or task, the GSM8K shipped in the package, or rows of your own
(a file, a saved dataset, hf:NAME) in TRL's convention: a `prompt` column (text or chat messages) and any other
columns, which reach the reward functions by name. Rows without a prompt column are read as GSM8K (`question`,
and an `answer` ending in '#### <number>'), so GSM8K-format files work as they are.

The held-out split of rows of your own is a fixed function of the prompt text (tasks.split_of), or the dataset's
own test split when it has one, so a held-out row is never trained on; the shipped GSM8K keeps its own files.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from . import catalogue, files
from .answers import gold_number
from .example import Example
from .generated import GENERATED, generate_task
from .tasks import (
    UNKNOWN,
    TaskError,
    canonical_number,
    generate,
    in_equal_shares,
    levels_of,
    parts_of,
    split_of,
)

GSM8K_DIR = Path(__file__).parent / "gsm8k"  # GSM8K (Cobbe et al., 2021; MIT licence, file beside it)
DATASETS = {"gsm8k": {"train": "train.jsonl.gz", "test": "test.jsonl.gz", None: "test.jsonl.gz"},
            "gsm8k-train": {"train": "train.jsonl.gz", "test": "test.jsonl.gz", None: "train.jsonl.gz"}}
FIRST_NAMES = {"test.jsonl.gz": "test.jsonl"}  # shipped plain at first: its problems keep the ids records pair on


@dataclass(frozen=True)
class RowFormat:
    """How a row becomes an Example: the column that holds the prompt, and columns renamed before that."""

    prompt_column: str = "prompt"
    renames: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, prompt_column: str = "prompt", column_map: str = "") -> RowFormat:
        """From a prompt column and a column map as config fields write them ('problem:prompt,solution:answer')."""
        pairs = [pair.split(":", 1) for pair in column_map.split(",") if pair.strip()]
        return cls(prompt_column, tuple((a.strip(), b.strip()) for a, b in pairs))


def to_example(row: dict, id_: str, fmt: RowFormat = RowFormat(), name: str = "") -> Example:
    """A row as an Example: with the prompt column, a row of your own; else a GSM8K row. ValueError says what is
    wrong with it."""
    renames = dict(fmt.renames)
    row = {renames.get(k, k): v for k, v in row.items()}
    if fmt.prompt_column in row:
        return _own_example(row, id_, fmt.prompt_column, name)
    if "question" in row or "answer" in row:
        return _gsm8k_example(row, id_, name)
    raise ValueError(f"no {fmt.prompt_column!r} column (its columns: {', '.join(map(repr, row)) or 'none'}): name "
                     "the prompt's column with --prompt-column, or rename columns with --column-map 'yours:prompt'")


ROLES = {"system", "user", "assistant", "tool"}  # the chat roles of TRL's conversational rows


def _own_example(row: dict, id_: str, column: str, name: str) -> Example:
    prompt = row[column]
    chat = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if chat:
        if unknown := sorted({m["role"] for m in prompt} - ROLES):
            raise ValueError(f"its {column!r} messages have the role {unknown[0]!r}, which chat templates do not "
                             f"know: use {', '.join(sorted(ROLES))}")
        question, messages = "\n".join(m["content"] for m in prompt), tuple(dict(m) for m in prompt)
    elif isinstance(prompt, str) and prompt.strip():
        question, messages = prompt, ()
    else:
        raise ValueError(f"the {column!r} column must be non-empty text or a list of chat messages "
                         "({'role': ..., 'content': ...})")
    answer, level = row.get("answer"), row.get("level") or row.get("difficulty") or name
    columns = {k: v for k, v in row.items() if k != column}
    return Example(question, "" if answer is None else str(answer), str(level), id=id_, messages=messages,
                   columns=columns, math=False)


def _gsm8k_example(row: dict, id_: str, name: str = "") -> Example:
    """A GSM8K-style {"question", "answer": "...#### 18"} row, labelled by its level column, else by the task's name;
    ValueError if malformed (a final answer that is not a number included)."""
    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not question.strip() or not isinstance(answer, str):
        raise ValueError("needs a non-empty 'question' and an 'answer' string")
    gold = answer.rsplit("####", 1)[-1].strip().replace(",", "").replace("$", "").strip()
    if "####" not in answer or not gold:
        raise ValueError("the 'answer' must end in a '#### <number>' line")
    if gold_number(gold) is None:  # no completion could ever match it: a problem that teaches nothing
        raise ValueError(f"the answer after '####' is {gold[:40]!r}, not a number: write it as '#### <number>'")
    try:
        gold = canonical_number(Fraction(gold))
    except (ValueError, ZeroDivisionError):
        pass  # a number Fraction does not read (50%): kept as written, as the rewards read it
    extra = {k: v for k, v in row.items() if k not in ("question", "answer")}
    return Example(question, gold, str(row.get("difficulty") or row.get("level") or name or "gsm8k"), answer, id_,
                   columns=extra)


def load_file(spec: str, split: str | None = "train", n: int | None = None, fmt: RowFormat = RowFormat(),
              on_error: str = "raise", name: str = "") -> list[Example]:
    """The examples of a file, a saved dataset or hf:NAME in `split` (None: the whole file, or a dataset's own test
    split, each example marked with the split a run on it would put it in), at most `n`, in order. Rows that cannot
    be read stop the load with `file:line` and the fix, or are skipped with one warning (on_error="skip").

    A held-out row is never a training row: a held-out prompt that repeats a training one (spaces aside) is left
    out of "test" and marked "train" (by a hash, twins that differ by spaces may fall on both sides; a dataset's
    own test split may repeat its train split), with one warning."""
    if on_error not in ("raise", "skip"):
        raise TaskError(f"on_error must be 'raise' or 'skip', got '{on_error}'.")
    bad: list[tuple[str, str]] = []
    rows = files.read(spec, on_error, bad, limit=n if split is None else None)
    if not name:  # a hub dataset's last part; a file's name without its suffixes (data.jsonl.gz: data)
        name = spec[3:].split(":")[0].split("/")[-1] if spec.startswith("hf:") else Path(spec.removesuffix(".gz")).stem
    out = _examples(rows.train if rows.test is None or split == "train" else rows.test, spec, fmt, on_error, bad, name)
    if split is None and rows.test is None and len(rows.train) == n:  # cut at n: a training twin may come later
        everything = _examples(files.read(spec, "skip", []).train, spec, fmt, "skip", [], name)
        trained = {_same(ex.question) for ex in everything if split_of(ex.question) == "train"}
    else:
        trained = None
    if bad:
        warnings.warn(f"{spec}: skipped {len(bad)} malformed line(s), first at line {bad[0][0]}: {bad[0][1]}",
                      stacklevel=2)
    if not out:
        raise TaskError(f"{spec}: no examples found: each row needs a {fmt.prompt_column!r} (text or chat messages), "
                        "or GSM8K's 'question' and an 'answer' ending in '#### <number>'.")
    _check_columns(out, spec)
    if rows.test is not None:  # the dataset's own splits
        if split == "train":
            return [replace(ex, split="train") for ex in out[:n]]
        trained = {_same(ex.question) for ex in _examples(rows.train, spec, fmt, "skip", [], name)}
        marked = [replace(ex, split="train" if _same(ex.question) in trained else "test") for ex in out]
    else:
        trained = trained or {_same(ex.question) for ex in out if split_of(ex.question) == "train"}
        marked = [replace(ex, split="train" if split_of(ex.question) == "train" or _same(ex.question) in trained
                          else "test") for ex in out]
        if split == "train":
            return [ex for ex in marked if split_of(ex.question) == "train"][:n]
    if twins := sum(ex.split == "train" for ex in marked if rows.test is not None or split_of(ex.question) == "test"):
        warnings.warn(f"{spec}: {twins} held-out row(s) repeat a training row (the same prompt, spaces aside): they "
                      "are left out of the held-out set", stacklevel=2)
    if split is None:
        return marked[:n]
    mine = [ex for ex in marked if ex.split == "test"]
    if not mine and twins:
        raise TaskError(f"{spec}: every one of its {twins} held-out rows repeats a training row (the same prompt, "
                        "spaces aside), so nothing is left to evaluate on: give a test split of problems the "
                        "training split does not hold.")
    if not mine:
        raise TaskError(f"{spec}: none of its questions falls in the {split} split (a fifth of them, by a hash "
                        "of the text, is held out): give a file with more problems.")
    return mine[:n]


def _same(question: str) -> str:
    """A prompt as compared for repeats: its words, spaces aside."""
    return " ".join(question.split())


def _examples(pairs, spec: str, fmt: RowFormat, on_error: str, bad: list, name: str) -> list[Example]:
    out = []
    for id_, row in pairs:
        try:
            out.append(to_example(row, id_, fmt, name))
        except ValueError as e:
            where = Path(spec).with_name(id_) if files.is_file_spec(spec) else id_
            if on_error == "raise":
                raise TaskError(f"{where}: {e}. Fix the line or pass --skip-bad-lines to skip it.") from None
            bad.append((id_.rsplit(":", 1)[-1], str(e)))
    return out


def _check_columns(examples: list[Example], spec: str) -> None:
    """One type per column (numbers count as one), so that a reward never meets a surprise on row 9,000."""
    seen: dict[str, tuple[str, str]] = {}
    for ex in examples:
        for key, value in ex.columns.items():
            if value is None:
                continue
            kind = "number" if isinstance(value, int | float) and not isinstance(value, bool) else type(value).__name__
            first = seen.setdefault(key, (kind, ex.id))
            if first[0] != kind:
                raise TaskError(f"{spec}: column {key!r} holds {first[0]} ({first[1]}) and {kind} ({ex.id}): give "
                                "one type per column.")


def load_jsonl(path: str | Path, on_error: str = "raise", limit: int | None = None, name: str = "") -> list[Example]:
    """Every example of a JSON-lines file in file order (GSM8K rows or rows of your own), at most `limit`, labelled
    `name` (else the file's name) where a row has no level of its own."""
    return load_file(str(path), None, limit, on_error=on_error, name=name)


VERIFIERS = {"countdown": "countdown", "code": "code"}  # a generated task -> the builtin reward that verifies it


@dataclass(frozen=True)
class Task:
    """A --task value, read once (`Task.of`), with what every part of the tool asks of it: the tasks it joins in
    equal shares (`parts`), the levels it draws from (`levels`), whether its rows are drawn by seed (`drawn`: the
    levels, countdown, code and reasoning-gym tasks, --n of them, each split its own draw) rather than read from
    data, and the reward it brings as its default reward and judge (`verifier`: countdown's, code's,
    reasoning-gym's; None for the math levels, GSM8K and data of your own).

    >>> Task.of("rg:chain_sum+rg:basic_arithmetic").verifier, Task.of("basic+intermediate").levels
    ('reasoning_gym', ('basic', 'intermediate'))
    >>> Task.of("countdown").drawn, Task.of("gsm8k").drawn, Task.of("basic").verifier
    (True, False, None)
    """

    spec: str
    parts: tuple[str, ...]
    levels: tuple[str, ...]
    drawn: bool
    verifier: str | None

    @staticmethod
    @functools.cache
    def of(spec: str) -> Task:
        parts, levels = parts_of(spec), levels_of(spec)
        kinds = {"reasoning_gym" if catalogue.is_catalogue(p) else VERIFIERS.get(p) for p in parts}
        drawn = bool(levels) or spec in GENERATED or catalogue.is_catalogue(spec)
        return Task(spec, tuple(parts), tuple(levels), drawn, kinds.pop() if len(kinds) == 1 and None not in kinds
                    else None)


def load_task(spec: str, n: int | None = None, seed: int = 0, split: str | None = "train",
              on_error: str = "raise", fmt: RowFormat = RowFormat()) -> list[Example]:
    """Problems named by `spec`: a level, "mix", a generated task (countdown, code), a reasoning-gym task
    ("rg:NAME[:key=value,...]"), "gsm8k", "gsm8k-train", levels joined by "+", a file, a saved dataset or
    "hf:NAME[:config][:split]".

    Generated tasks give `n` problems (500 when None) of `split` (None: test). "gsm8k" is the shipped GSM8K, trained
    on its train file and held out from its test file; "gsm8k-train" is the same in a run, and its train file for
    split None (`cpu-grpo eval --task gsm8k-train`: training problems). Rows of your own are split by a hash of
    each prompt (or by the dataset's own test split), so a held-out problem is never trained on; split None takes
    the whole file (`cpu-grpo eval`). Files give their first `n` examples of the split, in order. Joined tasks give
    `n` (500 when None) in equal shares, interleaved ("advanced+gsm8k": an advanced problem, a GSM8K one, ...).
    """
    task = Task.of(spec)
    if task.drawn:  # drawn apart by seed and split: a test problem is never trained on
        make = generate if task.levels else catalogue.generate if catalogue.is_catalogue(spec) else generate_task
        made = make(spec, 500 if n is None else n, seed, split or "test")
        return [replace(ex, split=split or "test") for ex in made]
    if len(task.parts) > 1:  # levels and the shipped GSM8K
        return in_equal_shares(list(task.parts), 500 if n is None else n,
                               lambda part, k: load_task(part, k, seed, split, on_error, fmt))
    if spec in DATASETS:
        file = DATASETS[spec][split]
        name = FIRST_NAMES.get(file, file)
        return [replace(ex, split="train" if file.startswith("train") else "test", id=name + ex.id[len(file):])
                for ex in load_jsonl(GSM8K_DIR / file, on_error, limit=n, name="gsm8k")]
    if spec.startswith("hf:") or files.is_file_spec(spec):
        return load_file(spec, split, n, fmt, on_error)
    raise TaskError(UNKNOWN.format(spec))
