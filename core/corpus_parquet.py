"""Parquet corpora: rows read `PARQUET_BATCH_ROWS` at a time as records (``text``, optional ``label``), each batch
measured against the reader's `core.corpus_limits.ReadLimits` — from the footer, then on its Arrow arrays — before a
row is decoded into Python; a dictionary-encoded value repeated on every row is measured once. pyarrow is imported
only when a Parquet file is read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from core.corpus_limits import ReadLimits, too_large, too_many
from core.text import CorpusError

PARQUET_BATCH_ROWS = 256  # rows decoded at a time: at most 256 documents of max_document_chars in memory at once


def parquet_records(
    source: Callable[[], Any], label: str, limits: ReadLimits | None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The numbered rows of a Parquet file (``source()``: its path, or its bytes opened) as records, decoded
    `PARQUET_BATCH_ROWS` at a time, each batch measured against ``limits`` before its rows are given."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise CorpusError(f"{label}: reading .parquet needs pyarrow (`pip install pyarrow`), or send JSONL") from err
    try:
        names = pq.ParquetFile(source()).schema_arrow.names
        if "text" not in names:
            raise CorpusError(f"{label}: no 'text' column (found {names}); name the text column 'text'")
        columns = ["text", "label"] if "label" in names else ["text"]
        # dictionary-encoded columns stay encoded: a value repeated on every row is decoded once, and measured once
        parquet = pq.ParquetFile(source(), read_dictionary=columns)
    except CorpusError:
        raise
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise CorpusError(f"{label} is not a readable Parquet file ({err})") from err
    if limits is not None:
        _check_parquet_metadata(parquet, columns, label, limits)
    rows = decoded = 0
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches, None)
            if batch is None:
                return
            if limits is not None:
                decoded += _check_parquet_batch(batch, rows, decoded, label, limits)
            texts = _strings(batch.column("text"))
            tags = _strings(batch.column("label")) if "label" in columns else [None] * len(texts)
        except CorpusError:
            raise
        except Exception as err:
            raise CorpusError(f"{label} is not a readable Parquet file ({err})") from err
        for text, tag in zip(texts, tags, strict=True):
            rows += 1
            if text is not None:
                yield rows, {"text": text, **({"label": tag} if tag is not None else {})}


def _strings(column: Any) -> list[Any]:
    """A batch's column as Python values (labels of any type become strings, as in JSON records)."""
    values = column.to_pylist()
    return [v if v is None or isinstance(v, str) else str(v) for v in values]


def _check_parquet_metadata(parquet: Any, columns: list[str], label: str, limits: ReadLimits) -> None:
    """Refuse from the footer alone: too many rows, or plain-encoded text larger than the decoded-bytes limit."""
    meta = parquet.metadata
    if meta.num_rows > limits.max_documents:
        raise too_many(label, meta.num_rows, limits)
    stored = 0
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for index in range(row_group.num_columns):
            column = row_group.column(index)
            if column.path_in_schema in columns:
                stored += column.total_uncompressed_size
    # Plain-encoded strings take their bytes plus a 4-byte length each; dictionary-encoded ones take less here and
    # are measured batch by batch instead.
    if stored > limits.max_decoded_bytes + 4 * meta.num_rows + 65536:
        raise too_large(label, stored, limits, "holds")


def _check_parquet_batch(batch: Any, before: int, decoded: int, label: str, limits: ReadLimits) -> int:
    """Check one batch's lengths on its Arrow arrays (a dictionary's values measured once, not per row); returns
    the bytes it decodes to."""
    import pyarrow as pa
    import pyarrow.compute as pc

    size = 0
    for name in batch.schema.names:
        column = batch.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                or pa.types.is_dictionary(column.type)):  # fmt: skip
            continue
        if pa.types.is_dictionary(column.type):
            values = column.dictionary
            textual = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
            chars = pc.take(pc.utf8_length(values), column.indices) if textual else None
            octets = pc.take(pc.binary_length(values), column.indices) if chars is not None else None
        else:
            chars, octets = pc.utf8_length(column), pc.binary_length(column)
        if octets is None:
            continue
        size += int(pc.sum(octets).as_py() or 0)
        if name == "text":
            longest = pc.max(chars).as_py() or 0
            if longest > limits.max_document_chars:
                _check_long_rows(column, chars, before, label, limits)
    if decoded + size > limits.max_decoded_bytes:
        raise too_large(label, decoded + size, limits, "decodes to at least")
    return size


def _check_long_rows(column: Any, chars: Any, before: int, label: str, limits: ReadLimits) -> None:
    """Rows over the character limit before stripping: decode each alone and refuse the first still over it."""
    for row, length in enumerate(chars.to_pylist()):
        if length is not None and length > limits.max_document_chars:
            text = column[row].as_py().strip()
            if len(text) > limits.max_document_chars:
                raise CorpusError(
                    f"{label}: row {before + row + 1} is {len(text)} characters long; the limit is "
                    f"{limits.max_document_chars} (adapt_max_document_chars): split long documents into sections",
                    code="document_too_long",
                    details={"indices": [before + row], "max_document_chars": limits.max_document_chars},
                )
