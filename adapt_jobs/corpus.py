"""Corpus intake for /adapt, checked in the API process before a job is queued (torch-free).

A corpus arrives as ``texts`` (+ optional ``labels``) in the JSON body, or as an uploaded file read by the
project's one corpus reader, `core.corpus_files` (the one `embedder train` reads files with): JSONL (one JSON
string, or one object with ``text`` and optional ``label``, per line), a JSON array, Parquet, or plain text
(documents separated by blank lines; one per line when the file has no blank line). It is stored per job as
``corpus.jsonl`` and deleted when the job ends unless the service is told to keep uploads.

Whether a document can feed crop pairs is `core.text.can_crop`: the most permissive rule the worker's
`core.text.choose_crop_rule` may fall back to (two sentences, or two halves of a long enough document —
cropping paper ``papers/000`` §2 takes two consecutive sentences), so a corpus that cannot work is refused
with a 422 at once instead of failing minutes later in the worker. The worker chooses the exact rule, holds
out only documents that rule can crop, and reports its yield.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.settings import AdaptSettings
from core.corpus_files import read_corpus_bytes
from core.corpus_limits import ReadLimits
from core.durable import replacing, sync_folder
from core.text import MIN_WORDS_PER_HALF, CorpusError, can_crop, not_unicode

CORPUS_FILE = "corpus.jsonl"


class CorpusTooLargeError(CorpusError):
    """Upload size over the limit (HTTP 413)."""


@dataclass(frozen=True)
class Corpus:
    texts: list[str]
    labels: list[str] | None
    usable: int

    def save(self, folder: Path) -> Path:
        """Write ``corpus.jsonl`` into ``folder`` (one object per document), whole and on disk when this returns: the
        job is queued next, in a store that outlives a power loss, and its worker must find every document."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / CORPUS_FILE
        # the customer's documents: readable by the service's own user only, whatever the umask
        with replacing(path, mode=0o600) as out:
            for i, text in enumerate(self.texts):
                record: dict[str, Any] = {"text": text}
                if self.labels is not None:
                    record["label"] = self.labels[i]
                out.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        sync_folder(folder.parent)  # the job's folder itself
        return path


def upload_limits(limits: AdaptSettings) -> ReadLimits:
    """The corpus limits a file is read under: a compressed upload may decode to no more text than a JSON body may
    carry (``max_upload_bytes``)."""
    return ReadLimits(
        max_documents=limits.max_documents,
        max_document_chars=limits.max_document_chars,
        max_decoded_bytes=limits.max_upload_bytes,
    )


def parse_upload(
    data: bytes, filename: str | None = None, limits: AdaptSettings | None = None
) -> tuple[list[str], list[str] | None]:
    """Parse an uploaded corpus with the project's one corpus reader (`core.corpus_files`): JSONL (strings or
    ``{"text", "label"}`` objects), a JSON array, Parquet, or text whose documents are separated by blank lines
    (one per line when the file has no blank line). With ``limits``, a file that would decode past them is refused
    before it is decoded."""
    corpus = read_corpus_bytes(data, filename, upload_limits(limits) if limits is not None else None)
    return corpus.texts, corpus.labels


def check_corpus(texts: list[str], labels: list[str] | None, limits: AdaptSettings) -> Corpus:
    """Apply the corpus limits of ``limits`` and the crop-yield check; raise :class:`CorpusError` saying what to fix."""
    texts = [t.strip() for t in texts]
    if labels is not None and len(labels) != len(texts):
        raise CorpusError(f"got {len(labels)} labels for {len(texts)} texts: give one label per text")
    if len(texts) > limits.max_documents:
        raise CorpusError(
            f"the corpus has {len(texts)} documents; the limit is {limits.max_documents}: send a sample",
            code="too_many_documents",
            details={"documents": len(texts), "max_documents": limits.max_documents},
        )
    too_long = [i for i, t in enumerate(texts) if len(t) > limits.max_document_chars]
    if too_long:
        raise CorpusError(
            f"{len(too_long)} documents are longer than {limits.max_document_chars} characters "
            f"(first: index {too_long[0]}, {len(texts[too_long[0]])} chars): split them into sections",
            code="document_too_long",
            details={"indices": too_long[:20], "max_document_chars": limits.max_document_chars},
        )
    for kind, values in (("texts", texts), ("labels", labels or [])):
        for index, value in enumerate(values):
            if (problem := not_unicode(value)) is not None:
                raise CorpusError(f"{kind}[{index}] {problem}; send the text as UTF-8")
    keep = [i for i, t in enumerate(texts) if t]
    texts = [texts[i] for i in keep]
    labels = [labels[i] for i in keep] if labels is not None else None
    usable = sum(can_crop(t) for t in texts)
    if usable < limits.min_documents:
        raise CorpusError(
            f"found {usable} usable documents out of {len(texts)}; adaptation needs at least "
            f"{limits.min_documents} documents with two or more sentences (or at least "
            f"{2 * MIN_WORDS_PER_HALF} words) to cut training crops from: send more or longer documents",
            code="corpus_too_small",
            details={"documents": len(texts), "usable_documents": usable, "min_documents": limits.min_documents},
        )
    return Corpus(texts=texts, labels=labels, usable=usable)


def read_job_corpus(folder: Path) -> tuple[list[str], list[str] | None]:
    """Read a job's ``corpus.jsonl`` back (the worker side)."""
    texts: list[str] = []
    labels: list[str] = []
    with (Path(folder) / CORPUS_FILE).open(encoding="utf-8") as src:
        for line in src:
            record = json.loads(line)
            texts.append(record["text"])
            if "label" in record:
                labels.append(record["label"])
    return texts, (labels if labels else None)
