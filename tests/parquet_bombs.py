"""Parquet files that weigh little and decode to a lot, written without ever holding their decoded text in memory."""

from __future__ import annotations

import base64
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq


def dictionary_bomb(value_chars: int = 1_000_000, rows: int = 2000) -> bytes:
    """One string of ``value_chars`` characters, dictionary-encoded on ``rows`` rows: well under 1 KB compressed."""
    values = pa.array(["x" * value_chars])
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), values)
    out = io.BytesIO()
    pq.write_table(pa.table({"text": column}), out, compression="zstd")
    return out.getvalue()


def plain_bomb(rows: int = 2000, row_chars: int = 1_000_000, random_chars: int = 32_000) -> bytes:
    """``rows`` plain-encoded (no dictionary) rows of ``row_chars`` characters, each ``random_chars`` random letters
    then one repeated letter: about ``rows * random_chars * 0.75`` bytes compressed, ``rows * row_chars`` decoded
    (the defaults: about 48 MB that decode to 2 GB). Written 20 rows at a time."""
    schema = pa.schema([("text", pa.string())])
    out = io.BytesIO()
    with pq.ParquetWriter(out, schema, compression="zstd", use_dictionary=False) as writer:
        for start in range(0, rows, 20):
            batch = []
            for _ in range(min(20, rows - start)):
                noise = base64.b64encode(os.urandom(random_chars * 3 // 4)).decode()[:random_chars]
                batch.append(noise + "a" * (row_chars - len(noise)))
            writer.write_table(pa.table({"text": batch}, schema=schema))
    return out.getvalue()
