"""Rows from the files and datasets people keep their tasks in: JSON lines, JSON, CSV (each may be gzipped), Parquet,
a dataset saved with `datasets.save_to_disk`, or `hf:NAME[:config][:split]` from the Hugging Face hub. Each row is a
plain dict with an id ("file.jsonl:12", "NAME:test:3") that names where it came from, so that every message about a
bad row can say `file:line`. A source with a test split of its own (a saved DatasetDict, a hub dataset) keeps it
apart."""

from __future__ import annotations

import csv
import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

from .tasks import TaskError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".jsonl.gz", ".json.gz", ".csv.gz")


@dataclass(frozen=True)
class Rows:
    """A source's rows, as (id, row) pairs; `test` holds its own held-out split when it has one (else None)."""

    train: list[tuple[str, dict]]
    test: list[tuple[str, dict]] | None = None


def is_file_spec(spec: str) -> bool:
    """Whether a task spec names a file or a saved dataset (rather than a level, a shipped set or hf:)."""
    return spec.endswith(SUFFIXES) or Path(spec).expanduser().exists()


def read(spec: str, on_error: str = "raise", bad: list | None = None, limit: int | None = None) -> Rows:
    """The rows of a file, a saved dataset directory or `hf:NAME[:config][:split]` (JSON lines: the first `limit`).
    With on_error="skip", lines that are not JSON objects are skipped and appended to `bad` as (line, reason)."""
    if spec.startswith("hf:"):
        return _hub(spec[3:])
    path = Path(spec).expanduser()
    if path.is_dir():
        return _saved(path)
    if not path.is_file():
        raise TaskError(f"data file not found: {spec}: check the path, or use a generated task (basic, intermediate, "
                        "advanced, mix, countdown, code).")
    if path.suffix == ".parquet":
        return Rows(_parquet(path))
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError):
        raise TaskError(f"{spec}: not a whole gzip file: compress it again with gzip, or pass it uncompressed.") \
            from None
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (Excel's "CSV UTF-8") is not part of the first column
    except UnicodeDecodeError:
        raise TaskError(f"{spec}: not UTF-8 text: give JSON lines, JSON, CSV (each may be gzipped) or Parquet.") \
            from None
    kind = path.with_suffix("").suffix if path.suffix == ".gz" else path.suffix
    if kind == ".csv":
        return Rows(_csv(path, text, on_error, bad if bad is not None else []))
    if kind == ".json":
        return Rows(_json(path, text))
    return Rows(_jsonl(path, text, on_error, bad if bad is not None else [], limit))


def _jsonl(path: Path, text: str, on_error: str, bad: list, limit: int | None) -> list[tuple[str, dict]]:
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if limit is not None and len(out) >= limit:
            break
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
        except ValueError as e:  # json.JSONDecodeError is a ValueError too
            reason = f"invalid JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
            if on_error == "raise":
                raise TaskError(f"{path}:{lineno}: {reason}. Fix the line or pass --skip-bad-lines to skip it.") \
                    from None
            bad.append((str(lineno), reason))
            continue
        out.append((f"{path.name}:{lineno}", row))
    return out


def _csv(path: Path, text: str, on_error: str, bad: list) -> list[tuple[str, dict]]:
    """CSV rows by their header; a row with more or fewer fields than the header is a bad line (an unquoted comma
    in a field, a cut line), and a cell that holds chat messages as JSON text is read as those messages."""
    reader, out = csv.DictReader(io.StringIO(text, newline="")), []
    for row in reader:
        if None in row or None in row.values():
            got = len(reader.fieldnames or []) + len(row.get(None) or []) - list(row.values()).count(None)
            reason = f"{got} fields where the header has {len(reader.fieldnames or [])}"
            if on_error == "raise":
                raise TaskError(f"{path}:{reader.line_num}: {reason}: quote a field that holds a comma (\"a, b\"). "
                                "Fix the line or pass --skip-bad-lines to skip it.")
            bad.append((str(reader.line_num), reason))
            continue
        out.append((f"{path.name}:{reader.line_num}", {k: _chat_cell(v) for k, v in row.items()}))
    return out


def _chat_cell(value: str):
    """A CSV cell holding chat messages as JSON text ([{"role": ..., "content": ...}, ...]) as those messages."""
    if not value.lstrip().startswith("[{"):
        return value
    try:
        messages = json.loads(value)
    except ValueError:
        return value
    chat = isinstance(messages, list) and messages and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(x, str) for x in m.values())
        for m in messages)
    return messages if chat else value


def _json(path: Path, text: str) -> list[tuple[str, dict]]:
    """A JSON list of objects, or an object holding one such list (e.g. {"data": [...]})."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskError(f"{path}:{e.lineno}: invalid JSON ({e.msg}): fix the file.") from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else data
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise TaskError(f"{path}: expected a list of objects (or an object with one such list): one row each.")
    return [(f"{path.name}:{i}", row) for i, row in enumerate(data)]


def _parquet(path: Path) -> list[tuple[str, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskError(f"{path}: reading Parquet needs pyarrow: pip install 'cpu-grpo[data]'.") from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow.lib.ArrowInvalid for a cut or foreign file, OSError for some others
        raise TaskError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0][:120]}): write it again "
                        "(pandas: df.to_parquet), or give JSON lines or CSV.") from None
    return [(f"{path.name}:{i}", row) for i, row in enumerate(table.to_pylist())]


def _datasets():
    try:
        import datasets
    except ImportError:
        raise TaskError("reading a saved dataset or hf:NAME needs the 'datasets' package: pip install "
                        "'cpu-grpo[data]', or pass a .jsonl, .json, .csv or .parquet file.") from None
    return datasets


def _split_rows(ds, name: str) -> list[tuple[str, dict]]:
    return [(f"{name}:{i}", dict(row)) for i, row in enumerate(ds)]


def _saved(path: Path) -> Rows:
    """A directory written by `Dataset.save_to_disk` (one split) or `DatasetDict.save_to_disk` (train and test)."""
    datasets = _datasets()
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # not a saved dataset: a directory of something else
        raise TaskError(f"{path}: not a dataset saved with save_to_disk ({type(e).__name__}): give such a "
                        "directory or a data file.") from None
    if isinstance(ds, datasets.DatasetDict):
        return _train_test(ds, path.name)
    return Rows(_split_rows(ds, path.name))


def _train_test(ds, name: str) -> Rows:
    """A DatasetDict's train split (else its first) and its test split when it has one."""
    train = ds["train"] if "train" in ds else ds[next(iter(ds))]
    test = _split_rows(ds["test"], f"{name}:test") if "test" in ds else None
    return Rows(_split_rows(train, f"{name}:train"), test)


def _hub(name: str) -> Rows:
    """hf:NAME, hf:NAME:config or hf:NAME:config:split (the config may be empty: hf:NAME::test)."""
    if not name:
        raise TaskError("'hf:' needs a dataset name: e.g. hf:openai/gsm8k:main or hf:openai/gsm8k:main:test.")
    name, config, split = (name.split(":") + ["", ""])[:3]
    if config in ("train", "test", "validation") and not split:  # hf:NAME:test, as before configs were named
        config, split = "", config
    datasets = _datasets()
    try:
        ds = datasets.load_dataset(name, config or None, split=split or None)
    except Exception as e:  # offline, or an unknown name/config/split: all for the user to fix
        raise TaskError(f"could not load '{name}' (config '{config}', split '{split}') from the Hugging Face hub "
                        f"({type(e).__name__}): check the name and your network, or pass a local file.") from None
    return Rows(_split_rows(ds, f"{name}:{split}")) if split else _train_test(ds, name)
