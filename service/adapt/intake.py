"""Taking in a POST /adapt corpus without hurting serving: the body is read under ``max_upload_bytes`` first, then
parsed (JSON, or a multipart form and the file it carries), checked (`check_corpus`) and saved into the
job's folder away from the event loop that serves /v1/embeddings — a small JSON body in a thread; a large one, and
any uploaded file, in a child process at a lower priority, because decoding 50 MB of JSON is one call that holds
the interpreter's lock for a quarter of a second (it would stall every request on the replica). Only the body's
bytes and a summary cross the process boundary. An uploaded file is read under the corpus limits
(`adapt_jobs.corpus.parse_upload`), so a small compressed file cannot decode to gigabytes."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from pydantic import ValidationError
from python_multipart.multipart import File, create_form_parser

from adapt_jobs.corpus import CorpusError, CorpusTooLargeError, check_corpus, parse_upload
from adapt_jobs.settings import AdaptSettings
from service.adapt.schemas import AdaptRequest
from service.errors import ErrorKind, ServiceError, validation_message

log = logging.getLogger(__name__)

UPLOAD_FRAMING_BYTES = 64 * 1024  # multipart boundaries, form fields and JSON keys around the corpus itself
MAX_FORM_FIELDS = 32
# JSON bodies up to this size are parsed in a thread: json.loads holds the interpreter's lock ~5 ms per MB.
INLINE_BYTES = 1024 * 1024
READER_NICE = 10  # the reader's scheduling niceness: serving gets the cores first (like adapt_worker_nice's default)

Parsed = tuple[AdaptRequest, list[str], list[str] | None]


@dataclass(frozen=True)
class Intake:
    """A corpus checked and saved in its job's folder, and the request without its texts — or, in ``refused``, why
    the corpus was refused (nothing saved), for the caller to answer once the request's other fields are checked."""

    request: AdaptRequest
    n_documents: int
    usable: int
    has_labels: bool
    refused: CorpusError | None = None


def take_in(content_type: str, body: bytes, settings: AdaptSettings, folder: Path) -> Intake:
    """Parse the body, check its corpus against ``settings`` and save it as ``folder/corpus.jsonl`` (in a thread, or
    in the reader process for a large body). A body over the upload bounds raises as it is read; a corpus that
    parses but fails `check_corpus` comes back as ``refused``."""
    multipart = content_type.startswith("multipart/form-data")
    req, texts, labels = parse_multipart(content_type, body, settings) if multipart else parse_json(body)
    summary = req.model_copy(update={"texts": None, "labels": None})
    try:
        corpus = check_corpus(texts, labels, settings)
    except CorpusError as err:
        return Intake(summary, n_documents=len(texts or ()), usable=0, has_labels=labels is not None, refused=err)
    corpus.save(folder)
    return Intake(summary, n_documents=len(corpus.texts), usable=corpus.usable, has_labels=corpus.labels is not None)


def _reader_started() -> None:
    """The reader process yields the cores to serving whenever both want them, and loads its readers at once."""
    os.nice(READER_NICE)
    import pyarrow.parquet  # noqa: F401


class UploadReader:
    """Where bodies are parsed: a thread for a small JSON body; one child process for a large one and for every
    uploaded file (a few compressed bytes can decode to 50 MB of text). The process starts at the first such body
    and reads one body at a time, so at most one large corpus is being decoded per replica."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def take_in(self, content_type: str, body: bytes, settings: AdaptSettings, folder: Path) -> Intake:
        if len(body) <= INLINE_BYTES and not content_type.startswith("multipart/form-data"):
            return await asyncio.to_thread(take_in, content_type, body, settings, folder)
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_reader_started
            )
        try:
            return await loop.run_in_executor(self._pool, take_in, content_type, body, settings, folder)
        except BrokenProcessPool as err:
            log.warning("adapt: the process reading an upload stopped (%s); starting another for the next one", err)
            self.close()
            raise ServiceError(
                ErrorKind.invalid_corpus,
                "the upload could not be read: the process reading it stopped (out of memory?); send a smaller corpus",
            ) from err

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _invalid(message: str) -> ServiceError:
    return ServiceError(ErrorKind.invalid_request, message)


async def read_limited(request: Request, limit: int) -> bytes:
    """The whole body, refused (413) as soon as it is over ``limit`` bytes, whatever Content-Length claims."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise CorpusTooLargeError(f"the request body is {int(declared)} bytes; the limit is {limit}: send less text")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise CorpusTooLargeError(f"the request body is over the {limit}-byte limit: send less text")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, settings: AdaptSettings) -> tuple[str, bytes]:
    """The content type and the body, read under the upload limit plus the framing around the corpus (a form's
    boundaries and fields, or the JSON's keys, quotes and escapes)."""
    content_type = request.headers.get("content-type", "")
    return content_type, await read_limited(request, settings.max_upload_bytes + UPLOAD_FRAMING_BYTES)


def parse_json(body: bytes) -> Parsed:
    """The request and its corpus from a JSON body; a body that is not UTF-8 JSON is an invalid request (422), as
    for every other JSON route."""
    try:
        payload = json.loads(body or b"null")
    except json.JSONDecodeError as err:
        raise _invalid(f"the body is not valid JSON ({err.msg}); send JSON or a multipart upload") from err
    except UnicodeDecodeError as err:  # json.loads decodes bytes itself, and raises this rather than JSONDecodeError
        raise _invalid(
            f"the body is not valid JSON (not UTF-8 text: {err.reason} at byte {err.start}); send UTF-8 JSON"
        ) from err
    except RecursionError as err:  # the parser recurses once per level: thousands of "[" exhaust the stack
        raise _invalid(
            "the body's JSON is nested too deeply to read; send an object with base_model, name and texts"
        ) from err
    if not isinstance(payload, dict):
        raise _invalid("the body must be a JSON object with base_model, name and texts")
    try:
        req = AdaptRequest.model_validate(payload)
    except ValidationError as err:
        raise _invalid(validation_message(err.errors(), "/adapt request")) from err
    if req.texts is None:
        raise _invalid("no corpus: send 'texts' (a list of documents) or upload a JSONL/text 'file'")
    labels = [str(x) for x in req.labels] if req.labels is not None else None
    return req, list(req.texts), labels


def parse_multipart(content_type: str, body: bytes, settings: AdaptSettings) -> Parsed:
    limit = settings.max_upload_bytes
    fields: dict[str, str] = {}
    files: list[File] = []

    def on_field(field: Any) -> None:
        if len(fields) >= MAX_FORM_FIELDS:
            raise _invalid(f"the form has more than {MAX_FORM_FIELDS} fields")
        fields[_text(field.field_name)] = _text(field.value)

    def on_file(file: File) -> None:
        files.append(file)

    try:
        parser = create_form_parser(
            {"Content-Type": content_type.encode("latin-1")}, on_field, on_file,
            # The body is in memory already: never spill to disk (a file part may be as large as the whole body).
            config={"MAX_MEMORY_FILE_SIZE": len(body) + 1},
        )  # fmt: skip
        parser.write(body)
        parser.finalize()
    except ServiceError:
        raise
    except Exception as err:  # python-multipart raises several types for a malformed form
        raise _invalid(f"the multipart form could not be read ({err}): send one 'file' part and text fields") from err
    uploads = [f for f in files if _text(f.field_name) == "file"]
    if len(files) != 1 or not uploads:
        raise _invalid("multipart /adapt needs exactly one 'file' part holding the corpus (JSONL, text or Parquet)")
    upload = uploads[0]
    upload.file_object.seek(0)
    data = upload.file_object.read(limit + 1)
    if len(data) > limit:
        raise CorpusTooLargeError(f"the uploaded corpus is over the {limit}-byte limit: send a sample")
    filename = _text(upload.file_name) if upload.file_name else None
    texts, labels = parse_upload(data, filename, settings)
    fields.pop("file", None)
    try:
        req = AdaptRequest.model_validate(fields, strict=False)
    except ValidationError as err:
        raise _invalid(validation_message(err.errors(), "/adapt request")) from err
    if req.texts is not None:
        raise _invalid("send the corpus either as 'texts' or as an uploaded 'file', not both")
    return req, texts, labels


def _text(value: bytes | None) -> str:
    try:
        return (value or b"").decode("utf-8")
    except UnicodeDecodeError as err:
        raise _invalid("a form field is not UTF-8 text") from err
