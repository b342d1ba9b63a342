"""The one reader of corpus files: `embedder train --set corpus=PATH` and /adapt uploads read a file through it, so
one file is one corpus everywhere (issue: a ``.txt`` was one document per line for training and one per blank-line
block for /adapt).

The format comes from the file name's suffix:

- ``.txt`` — documents are **separated by blank lines** (a line holding only whitespace): a paragraph or a
  hard-wrapped article is one document. A file with **no blank line between two lines of text** holds **one
  document per line** (a list of sentences or of one-line records; blank lines at the start or end do not count).
- ``.jsonl`` / ``.ndjson`` — one record per line: a JSON string, or an object with a ``"text"`` string and an
  optional ``"label"``; blank lines are skipped; an error names the line.
- ``.json`` — one JSON array of such records.
- ``.parquet`` — a ``text`` column and an optional ``label`` column (needs ``pyarrow``).
- a folder — every ``.txt`` file under it (sorted, recursively) is one document.
- no suffix (an upload without a file name) — JSONL when the first non-blank line starts with ``{`` or ``"``,
  else text. Any other suffix is refused.

Text is UTF-8 (a byte-order mark is dropped). Documents are stripped and empty ones dropped. Labels are all or
nothing: when some records carry a ``label`` and others do not, the reader refuses the file. Every problem raises
`core.text.CorpusError` with a message that says what to fix.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.text import CorpusError

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = ".txt, .jsonl, .ndjson, .json, .parquet or a folder of .txt files"
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_KIND_NAMES = {"text": "text", "jsonl": "JSONL", "json": "JSON", "parquet": "Parquet"}


@dataclass(frozen=True)
class CorpusFile:
    """What a corpus file holds: its documents and, when every record has one, their labels."""

    texts: list[str]
    labels: list[str] | None


def read_corpus_file(path: str | Path) -> CorpusFile:
    """Read a corpus file or folder (see the module docstring for the formats)."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {str(path)!r} does not exist: give a {SUPPORTED}")
    return _parse(path.read_bytes(), path.name, where=str(path))


def read_corpus_bytes(data: bytes, filename: str | None = None) -> CorpusFile:
    """Read an uploaded corpus (its bytes and, when the client sent one, its file name)."""
    return _parse(data, filename or "", where=None)


def split_text_documents(content: str) -> list[str]:
    """The ``.txt`` rule: documents are separated by blank lines; with no blank line between two lines of text, each
    line is one document."""
    content = content.replace("\r\n", "\n").replace("\r", "\n").strip()  # blank lines at either end separate nothing
    parts = _BLANK_LINE.split(content) if _BLANK_LINE.search(content) else content.split("\n")
    return [part.strip() for part in parts if part.strip()]


def _format(data: bytes, filename: str) -> str:
    suffix = Path(filename).suffix.lower()
    for kind, suffixes in (
        ("text", TEXT_SUFFIXES),
        ("jsonl", JSONL_SUFFIXES),
        ("json", JSON_SUFFIXES),
        ("parquet", PARQUET_SUFFIXES),
    ):
        if suffix in suffixes:
            return kind
    if suffix:
        raise CorpusError(f"{filename}: unsupported corpus file type {suffix!r}; use {SUPPORTED}")
    first = next((line.lstrip() for line in data[:65536].splitlines() if line.strip()), b"")
    return "jsonl" if first[:1] in (b"{", b'"') else "text"


def _parse(data: bytes, filename: str, *, where: str | None) -> CorpusFile:
    kind = _format(data, filename)
    label = where or f"the uploaded {_KIND_NAMES[kind]}"
    if kind == "parquet":
        return _parse_parquet(data, label)
    content = _decode(data, label)
    if kind == "text":
        return CorpusFile(split_text_documents(content), None)
    if kind == "json":
        try:
            records = json.loads(content)
        except json.JSONDecodeError as err:
            raise CorpusError(
                f"{label} is not valid JSON ({err.msg} at line {err.lineno}); a file with one record per line "
                "must be named .jsonl"
            ) from err
        if not isinstance(records, list):
            raise CorpusError(f"{label} must hold one JSON array of strings or {{'text', 'label'}} objects")
        return _from_records(((i, r) for i, r in enumerate(records, start=1)), label, unit="record")
    return _from_records(_jsonl_records(content, label), label, unit="line")


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{label} is not UTF-8 text ({err}); re-encode it as UTF-8") from err


def _jsonl_records(content: str, label: str) -> Any:
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(
                f"line {number} of {label} is not valid JSON: {err.msg}; each line must be one JSON string or object"
            ) from err


def _from_records(records: Any, label: str, *, unit: str) -> CorpusFile:
    texts: list[str] = []
    labels: list[str] = []
    for number, record in records:
        if isinstance(record, str):
            text, tag = record, None
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            text, tag = record["text"], record.get("label")
        else:
            found = f"an object with keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
            raise CorpusError(
                f'{unit} {number} of {label} must be a string or an object with a "text" string, got {found}'
            )
        if not text.strip():
            continue
        texts.append(text.strip())
        if tag is not None:
            labels.append(str(tag))
    if labels and len(labels) != len(texts):
        kind = "JSONL records" if unit == "line" else "records"
        raise CorpusError(f"{len(labels)} of {len(texts)} {kind} have a label: give every record a label, or none")
    return CorpusFile(texts, labels or None)


def _parse_parquet(data: bytes, label: str) -> CorpusFile:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise CorpusError(f"{label}: reading .parquet needs pyarrow (`pip install pyarrow`), or send JSONL") from err
    try:
        table = pq.read_table(io.BytesIO(data))
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise CorpusError(f"{label} is not a readable Parquet file ({err})") from err
    if "text" not in table.column_names:
        raise CorpusError(f"{label}: no 'text' column (found {table.column_names}); name the text column 'text'")
    texts = table.column("text").to_pylist()
    tags = table.column("label").to_pylist() if "label" in table.column_names else None
    records = (
        (i, {"text": t, **({"label": tags[i - 1]} if tags is not None and tags[i - 1] is not None else {})})
        for i, t in enumerate(texts, start=1)
        if t is not None
    )
    return _from_records(records, label, unit="row")


def _read_folder(folder: Path) -> CorpusFile:
    files = sorted(folder.rglob("*.txt"))
    if not files:
        raise CorpusError(f"corpus folder {folder} holds no .txt files: put one document per .txt file in it")
    texts = [text for file in files if (text := _decode(file.read_bytes(), str(file)).strip())]
    return CorpusFile(texts, None)
