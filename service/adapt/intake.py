"""Reading a POST /adapt request: the body is read under ``max_upload_bytes`` first, then parsed — JSON, or a
multipart form and the corpus file it carries — in a worker thread, so a 50 MB body never holds the event loop that
serves /v1/embeddings; an uploaded file is read under the corpus limits (`adapt.corpus.parse_upload`), so a small
compressed file cannot decode to gigabytes in this process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import Request
from pydantic import ValidationError
from python_multipart.multipart import File, create_form_parser

from adapt.corpus import CorpusTooLargeError, parse_upload
from adapt.settings import AdaptSettings
from service.adapt.schemas import AdaptRequest
from service.errors import ErrorKind, ServiceError, validation_message

MULTIPART_OVERHEAD = 64 * 1024  # a form's boundaries and small fields, on top of the file itself
MAX_FORM_FIELDS = 32

Parsed = tuple[AdaptRequest, list[str], list[str] | None]


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


async def parse_request(request: Request, settings: AdaptSettings) -> Parsed:
    """The request, its texts and labels; the parsing runs in a thread."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        body = await read_limited(request, settings.max_upload_bytes + MULTIPART_OVERHEAD)
        return await asyncio.to_thread(parse_multipart, content_type, body, settings)
    body = await read_limited(request, settings.max_upload_bytes)
    return await asyncio.to_thread(parse_json, body)


def parse_json(body: bytes) -> Parsed:
    try:
        payload = json.loads(body or b"null")
    except json.JSONDecodeError as err:
        raise _invalid(f"the body is not valid JSON ({err.msg}); send JSON or a multipart upload") from err
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
    count = 0

    def on_field(field: Any) -> None:
        nonlocal count
        count += 1
        if count > MAX_FORM_FIELDS:
            raise _invalid(f"the form has more than {MAX_FORM_FIELDS} fields")
        fields[_text(field.field_name)] = _text(field.value)

    def on_file(file: File) -> None:
        files.append(file)

    try:
        parser = create_form_parser(
            {"Content-Type": content_type.encode("latin-1")}, on_field, on_file,
            config={"MAX_MEMORY_FILE_SIZE": limit + 1},  # the body is in memory already: never spill to disk
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
