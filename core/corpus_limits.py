"""What a corpus file read for an upload may hold (`ReadLimits`), and the errors that refuse one past them: checked
by `core.corpus_files` and `core.corpus_parquet` while they read, before what breaks a limit is decoded."""

from __future__ import annotations

from dataclasses import dataclass

from core.text import CorpusError


@dataclass(frozen=True)
class ReadLimits:
    """Limits checked while a file is read (an upload's: `AdaptSettings`), before what breaks them is
    decoded: most documents, longest document in characters, most bytes of decoded text. Parquet's rows are counted
    from its footer, before empty ones are dropped (as in a JSON body); the documents of a text, JSONL or JSON file are
    counted as they are read, and the reader stops at the first one past the limit, so a long file of short
    documents is not turned into millions of strings before it is refused. Only compressed formats (Parquet) can
    decode to more than their size."""

    max_documents: int
    max_document_chars: int
    max_decoded_bytes: int


def more_than(label: str, limits: ReadLimits) -> CorpusError:
    """Refused at the first document past the limit: how many more the file holds is never read."""
    return CorpusError(
        f"{label} has more than {limits.max_documents} documents; the limit is {limits.max_documents} "
        "(adapt_max_documents): send a sample",
        code="too_many_documents",
        details={"documents": limits.max_documents + 1, "max_documents": limits.max_documents},
    )


def too_many(label: str, rows: int, limits: ReadLimits) -> CorpusError:
    return CorpusError(
        f"{label} has {rows} rows; the limit is {limits.max_documents} documents (adapt_max_documents): send a sample",
        code="too_many_documents",
        details={"documents": rows, "max_documents": limits.max_documents},
    )


def too_large(label: str, size: int, limits: ReadLimits, verb: str) -> CorpusError:
    return CorpusError(
        f"{label} {verb} {size} bytes of text; the limit is {limits.max_decoded_bytes} bytes of decoded text "
        "(adapt_max_upload_bytes, which bounds a corpus however it is sent): send a sample",
        code="payload_too_large",
        details={"decoded_bytes": size, "max_decoded_bytes": limits.max_decoded_bytes},
    )
