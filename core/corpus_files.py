"""The one reader of corpus files: `embedder train --set corpus=PATH` and /adapt uploads read a file through it, so
one file is one corpus everywhere (before it, a ``.txt`` was one document per line for training and one per blank-line
block for /adapt).

The format comes from the file name's suffix:

- ``.txt`` — documents are **separated by blank lines** (a line holding only whitespace): a paragraph or a
  hard-wrapped article is one document. A file with **no blank line between two lines of text** holds **one
  document per line** (a list of sentences or of one-line records; blank lines at the start or end do not count).
- ``.jsonl`` / ``.ndjson`` — one record per line: a JSON string, or an object with a ``"text"`` string and an
  optional ``"label"``; blank lines are skipped; an error names the line.
- ``.json`` — one JSON array of such records.
- ``.parquet`` — a ``text`` column and an optional ``label`` column (needs ``pyarrow``), read a few rows at a time
  with dictionaries kept encoded, so `ReadLimits` stop a file that would decode to far more than it weighs before
  it is decoded (a 1 KB file can hold one 1 MB string repeated 2,000 times).
- a folder — every ``.txt`` file under it (sorted, recursively) is one document.
- no suffix (an upload without a file name) — JSONL when the first non-blank line starts with ``{`` or ``"``,
  else text. Any other suffix is refused.

A file on disk is read one document at a time (`iter_corpus_file`; `read_corpus_file` keeps them all), except a
``.json`` array, read whole. Text is UTF-8 (a byte-order mark is dropped). Documents are stripped and empty ones
dropped. Labels are all or nothing: when some records carry a ``label`` and others do not, the reader refuses the
file. Every problem raises `core.text.CorpusError` with a message that says what to fix.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.corpus_limits import ReadLimits, more_than
from core.corpus_parquet import parquet_records
from core.text import CorpusError, not_unicode

TEXT_SUFFIXES = (".txt",)
JSONL_SUFFIXES = (".jsonl", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = ".txt, .jsonl, .ndjson, .json, .parquet or a folder of .txt files"
_BLANK = re.compile(r"[ \t\f\v]*")  # a blank line of a .txt: it separates documents
# Where str.splitlines ends a line: JSONL lines are cut one at a time with the same rule.
_LINE_END = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_KIND_NAMES = {"text": "text", "jsonl": "JSONL", "json": "JSON", "parquet": "Parquet"}


@dataclass(frozen=True)
class CorpusFile:
    """What a corpus file holds: its documents and, when every record has one, their labels."""

    texts: list[str]
    labels: list[str] | None


def read_corpus_file(path: str | Path) -> CorpusFile:
    """Read a corpus file or folder (see the module docstring for the formats)."""
    texts: list[str] = []
    labels: list[str] = []
    for text, tag in _path_documents(path):
        texts.append(text)
        if tag is not None:
            labels.append(tag)
    return CorpusFile(texts, labels or None)


def iter_corpus_file(path: str | Path) -> Iterator[str]:
    """The documents `read_corpus_file` reads, one at a time, the file read as they are asked for: a caller that keeps
    a sample of a corpus holds only the sample, one document and a read buffer, whatever the file's size. A ``.json``
    file (one array) is the exception: it is read whole, then its records one at a time."""
    for text, _tag in _path_documents(path):
        yield text


def _path_documents(path: str | Path) -> Iterator[tuple[str, str | None]]:
    """The documents of a corpus file or folder, each with its label (None without), streamed from the file."""
    path = Path(path).expanduser()
    if path.is_dir():
        yield from ((text, None) for text in _folder_documents(path))
        return
    if not path.is_file():
        raise CorpusError(f"corpus file {str(path)!r} does not exist: give a {SUPPORTED}")
    with open(path, "rb") as handle:
        head = handle.read(65536)
    kind, where = _format(head, path.name), str(path)
    if kind == "parquet":
        yield from _documents(parquet_records(lambda: str(path), where, None), where, unit="row")
    elif kind == "json":
        yield from _documents(_json_array_records(_decode(path.read_bytes(), where), where), where, unit="record")
    elif kind == "text":
        yield from ((text, None) for text in _text_documents(lambda: _file_lines(path, where, newline=None)))
    else:
        lines = (line for physical in _file_lines(path, where, newline="") for line in _lines(physical))
        yield from _documents(_jsonl_records(lines, where), where, unit="line")


def _file_lines(path: Path, where: str, *, newline: str | None) -> Iterator[str]:
    """A UTF-8 file's lines read one at a time: with ``newline=None`` split at ``\\n`` after ``\\r\\n`` and ``\\r``
    became ``\\n`` (the lines of ``.txt``, their ends dropped); with ``""`` as written, each with its end."""
    try:
        with open(path, encoding="utf-8-sig", newline=newline) as handle:
            for line in handle:
                yield line[:-1] if newline is None and line.endswith("\n") else line
    except UnicodeDecodeError as err:
        raise CorpusError(f"{where} is not UTF-8 text ({err}); re-encode it as UTF-8") from err


def read_corpus_bytes(data: bytes, filename: str | None = None, limits: ReadLimits | None = None) -> CorpusFile:
    """Read an uploaded corpus (its bytes and, when the client sent one, its file name), refusing one that breaks
    ``limits`` before decoding what breaks them."""
    return _parse(data, filename or "", where=None, limits=limits)


def split_text_documents(content: str) -> list[str]:
    """The ``.txt`` rule: documents are separated by blank lines; with no blank line between two lines of text, each
    line is one document."""
    return list(iter_text_documents(content))


def iter_text_documents(content: str) -> Iterator[str]:
    """The documents of `split_text_documents`, cut out one at a time: a reader that stops at a document limit
    never holds the rest."""
    content = content.replace("\r\n", "\n").replace("\r", "\n")
    return _text_documents(lambda: _split_at_newlines(content))


def _split_at_newlines(content: str) -> Iterator[str]:
    """``content.split("\\n")`` one line at a time."""
    start = 0
    while (end := content.find("\n", start)) != -1:
        yield content[start:end]
        start = end + 1
    yield content[start:]


def _text_documents(lines: Callable[[], Iterable[str]]) -> Iterator[str]:
    """The ``.txt`` rule over a text's lines (split at ``\\n`` once ``\\r\\n`` and ``\\r`` are ``\\n``), which
    ``lines()`` gives afresh on each call: a first pass finds whether a blank line — one of nothing but spaces, tabs,
    form feeds and vertical tabs — stands between two lines of text; the second cuts the documents, at blank lines if
    so, else at every line. Each document is stripped; empty ones are dropped."""
    if not _has_blank_line(lines()):
        yield from (part for line in lines() if (part := line.strip()))
        return
    block: list[str] = []
    for line in lines():
        if _BLANK.fullmatch(line):
            if part := "\n".join(block).strip():
                yield part
            block = []
        else:
            block.append(line)
    if part := "\n".join(block).strip():
        yield part


def _has_blank_line(lines: Iterable[str]) -> bool:
    """Whether a blank line stands between two lines of text (blank lines at either end separate nothing)."""
    text_before = blank_after_text = False
    for line in lines:
        if not line.isspace() and line:
            if blank_after_text:
                return True
            text_before = True
        elif text_before and _BLANK.fullmatch(line):
            blank_after_text = True
    return False


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


def _parse(data: bytes, filename: str, *, where: str | None, limits: ReadLimits | None = None) -> CorpusFile:
    kind = _format(data, filename)
    label = where or f"the uploaded {_KIND_NAMES[kind]}"
    if kind == "parquet":
        return _parse_parquet(data, label, limits)
    content = _decode(data, label)
    if kind == "text":
        return CorpusFile(_within(iter_text_documents(content), label, limits), None)
    if kind == "json":
        return _from_records(_json_array_records(content, label), label, unit="record", limits=limits)
    return _from_records(_jsonl_records(_lines(content), label), label, unit="line", limits=limits)


def _decode(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{label} is not UTF-8 text ({err}); re-encode it as UTF-8") from err


def _within(documents: Iterable[str], label: str, limits: ReadLimits | None) -> list[str]:
    """The documents, read until one is past ``limits.max_documents`` (refused then)."""
    kept: list[str] = []
    for document in documents:
        kept.append(document)
        if limits is not None and len(kept) > limits.max_documents:
            raise more_than(label, limits)
    return kept


def _lines(content: str) -> Iterator[str]:
    """``content.splitlines()`` one line at a time: a list of every line of a 50 MB file costs several times its
    size, and a reader stopped at the document limit never needs the rest."""
    start = 0
    for end in _LINE_END.finditer(content):
        yield content[start : end.start()]
        start = end.end()
    if start < len(content):
        yield content[start:]


def _json_array_records(content: str, label: str) -> Iterator[tuple[int, Any]]:
    """The numbered records of a file holding one JSON array, decoded one element at a time (json.loads would
    build every record before the first could be counted); what follows a record is read only when the caller asks
    for the next one."""
    decoder = json.JSONDecoder()
    try:
        pos = _skip_space(content, 0)
        if not content.startswith("[", pos):
            json.loads(content)  # not an array: the parser's own error, or a value of another type
            raise CorpusError(f"{label} must hold one JSON array of strings or {{'text', 'label'}} objects")
        pos = _skip_space(content, pos + 1)
        number = 0
        while not content.startswith("]", pos):
            if number:
                if not content.startswith(",", pos):
                    raise json.JSONDecodeError("Expecting ',' delimiter", content, pos)
                pos = _skip_space(content, pos + 1)
            record, pos = decoder.raw_decode(content, pos)
            number += 1
            yield number, record
            pos = _skip_space(content, pos)
        end = _skip_space(content, pos + 1)
        if end != len(content):
            raise json.JSONDecodeError("Extra data", content, end)
    except json.JSONDecodeError as err:
        raise CorpusError(
            f"{label} is not valid JSON ({err.msg} at line {err.lineno}); a file with one record per line "
            "must be named .jsonl"
        ) from err
    except RecursionError as err:
        raise _too_deep(label, "send one array of strings or {'text', 'label'} objects") from err


def _skip_space(content: str, pos: int) -> int:
    """The position of the first character at or after ``pos`` that is not JSON whitespace."""
    space = _JSON_SPACE.match(content, pos)
    return space.end() if space else pos


def _jsonl_records(lines: Iterable[str], label: str) -> Iterator[tuple[int, Any]]:
    """The numbered records of a JSONL text's lines (`_lines`: cut where str.splitlines cuts)."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(
                f"line {number} of {label} is not valid JSON: {err.msg}; each line must be one JSON string or object"
            ) from err
        except RecursionError as err:
            raise _too_deep(f"line {number} of {label}", "each line must be one JSON string or object") from err


def _too_deep(what: str, fix: str) -> CorpusError:
    """The JSON parser recurses once per nesting level, so thousands of ``[`` exhaust the stack (RecursionError):
    such a file is refused as a corpus error like any other unreadable one."""
    return CorpusError(f"{what} is nested too deeply to read as JSON: {fix}")


def _from_records(
    records: Iterable[tuple[int, Any]], label: str, *, unit: str, limits: ReadLimits | None = None
) -> CorpusFile:
    """The documents and labels of numbered records (strings, or objects with a "text" string), read until one
    document is past ``limits.max_documents``."""
    texts: list[str] = []
    labels: list[str] = []
    for text, tag in _documents(records, label, unit=unit):
        texts.append(text)
        if tag is not None:
            labels.append(tag)
        if limits is not None and len(texts) > limits.max_documents:
            raise more_than(label, limits)
    return CorpusFile(texts, labels or None)


def _documents(records: Iterable[tuple[int, Any]], label: str, *, unit: str) -> Iterator[tuple[str, str | None]]:
    """Each numbered record's document (stripped; empty ones dropped) and label, one at a time; a file where some
    records have a label and others not is refused after its last record."""
    texts = labels = 0
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
        for field, value in (("text", text), ("label", str(tag) if tag is not None else "")):
            if (problem := not_unicode(value)) is not None:
                raise CorpusError(f"the {field} of {unit} {number} of {label} {problem}")
        texts += 1
        labels += tag is not None
        yield text.strip(), None if tag is None else str(tag)
    if labels and labels != texts:
        kind = "JSONL records" if unit == "line" else "records"
        raise CorpusError(f"{labels} of {texts} {kind} have a label: give every record a label, or none")


def _parse_parquet(data: bytes, label: str, limits: ReadLimits | None) -> CorpusFile:
    # every batch measured against the limits before any record is taken
    records = list(parquet_records(lambda: io.BytesIO(data), label, limits))
    return _from_records(records, label, unit="row", limits=limits)


def _folder_documents(folder: Path) -> Iterator[str]:
    """Every ``.txt`` file under ``folder`` (sorted, recursively) as one document, read one at a time."""
    files = sorted(folder.rglob("*.txt"))
    if not files:
        raise CorpusError(f"corpus folder {folder} holds no .txt files: put one document per .txt file in it")
    for file in files:
        if text := _decode(file.read_bytes(), str(file)).strip():
            yield text
