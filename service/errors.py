"""One table maps every error kind to its HTTP status, OpenAI error ``type`` and ``code``.

The engine and the routes raise `ServiceError(kind, message)`; one handler renders
``{"error": {"message", "type", "param", "code"}}`` (OpenAI's shape) and counts the failure by kind.
Unexpected exceptions become ``internal`` with the message "internal error"; the traceback goes to
the log only, never to the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

import orjson
from starlette.responses import Response


class ErrorKind(Enum):
    """(HTTP status, OpenAI error type, code). The value's code doubles as the metrics label."""

    invalid_request = (422, "invalid_request_error", "invalid_request")
    input_too_long = (422, "invalid_request_error", "input_too_long")
    model_not_found = (404, "invalid_request_error", "model_not_found")
    not_found = (404, "invalid_request_error", "not_found")
    method_not_allowed = (405, "invalid_request_error", "method_not_allowed")
    payload_too_large = (413, "invalid_request_error", "payload_too_large")
    unsupported_encoding = (415, "invalid_request_error", "unsupported_content_encoding")
    unsupported_media_type = (415, "invalid_request_error", "unsupported_media_type")
    host_not_allowed = (400, "invalid_request_error", "host_not_allowed")
    cross_origin = (403, "permission_error", "cross_origin")
    body_timeout = (408, "invalid_request_error", "body_timeout")
    overloaded = (429, "overloaded_error", "queue_full")
    unauthorized = (401, "authentication_error", "invalid_api_key")
    forbidden = (403, "permission_error", "forbidden")
    model_not_ready = (503, "unavailable_error", "model_not_ready")
    shutting_down = (503, "unavailable_error", "shutting_down")
    internal = (500, "server_error", "internal_error")
    # a client that closed its connection before its answer was ready: the status is the access log's (nginx's 499)
    # and the code the failure counter's label; no answer is sent to a client that is gone
    client_closed = (499, "invalid_request_error", "client_closed")
    # /adapt
    invalid_name = (422, "invalid_request_error", "invalid_name")
    reserved_name = (422, "invalid_request_error", "reserved_name")
    name_taken = (409, "invalid_request_error", "name_taken")
    invalid_corpus = (422, "invalid_request_error", "invalid_corpus")
    too_many_documents = (422, "invalid_request_error", "too_many_documents")
    document_too_long = (422, "invalid_request_error", "document_too_long")
    corpus_too_small = (422, "invalid_request_error", "corpus_too_small")
    job_not_found = (404, "invalid_request_error", "job_not_found")
    adapt_disabled = (503, "unavailable_error", "disabled")
    adapt_not_ready = (503, "unavailable_error", "not_ready")

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def type(self) -> str:
        return self.value[1]

    @property
    def code(self) -> str:
        return self.value[2]


class ServiceError(Exception):
    """An error a client caused or should know about; ``message`` says what to change."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.details = details  # structured facts about the failure (e.g. which documents), sent with the message

    def __reduce__(self) -> tuple[Any, ...]:
        # the kind, headers and details survive a process boundary (an upload read in another process)
        return (_service_error, (self.kind, self.message, self.headers, self.details))

    def body(self) -> dict[str, Any]:
        return error_body(self.kind, self.message, self.details)

    def response(self) -> Response:
        """The JSON error response (status, headers and body from the table)."""
        return error_response(self.kind, self.message, self.headers, self.details)


def _service_error(
    kind: ErrorKind, message: str, headers: dict[str, str], details: dict[str, Any] | None
) -> ServiceError:
    return ServiceError(kind, message, headers=headers, details=details)


# Longest message (and text in ``details``) an error carries. A message quotes what the client sent — a model name, a
# field name, a job id — and a body may hold megabytes of it (50 MB on /adapt): quoted whole, one bad field would
# come back as a response of the same size. Its start and its end stay (what was wrong, and what to send instead).
MAX_MESSAGE_CHARS = 2000


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text``, or its start and end with how much was left out between them when it is over ``limit`` characters."""
    if len(text) <= limit:
        return text
    keep = limit - len(f" …[{len(text)} characters left out]… ")  # the count is at most len(text) long
    marker = f" …[{len(text) - keep} characters left out]… "
    head = keep * 3 // 4
    return text[:head] + marker + text[len(text) - (keep - head) :]


def error_body(
    kind: ErrorKind, message: str, details: dict[str, Any] | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object: ``message``, ``type``, ``param`` (the request field at fault, or null) and ``code``;
    ``details`` beside them when the failure has structured facts. Text is clipped to `MAX_MESSAGE_CHARS`."""
    error: dict[str, Any] = {"message": clip(message), "type": kind.type, "param": param, "code": kind.code}
    if details:
        error["details"] = {key: clip(v) if isinstance(v, str) else v for key, v in details.items()}
    return {"error": error}


def error_response(
    kind: ErrorKind, message: str, headers: dict[str, str] | None = None, details: dict[str, Any] | None = None,
    param: str | None = None,
) -> Response:  # fmt: skip
    return Response(
        orjson.dumps(error_body(kind, message, details, param)), status_code=kind.status,
        media_type="application/json", headers=headers or None,
    )  # fmt: skip


INTERNAL_MESSAGE = "internal error"


def validation_message(errors: Sequence[Mapping[str, Any]], what: str = "request", limit: int = 3) -> str:
    """One line from pydantic's validation errors: where and what, for the first ``limit`` of them."""
    token_field = _token_ids(errors)
    if token_field is not None:
        return (
            f"invalid {what}: {token_field} holds token ids; this server embeds text, so send strings (a client that "
            "tokenises for OpenAI, such as LangChain's OpenAIEmbeddings, needs check_embedding_ctx_length=False)"
        )
    parts = []
    for error in list(errors)[:limit]:
        if error.get("type") == "json_invalid":  # FastAPI's: loc ("body", character offset), ctx {"error": why}
            at = error.get("loc", ())[-1:]
            where = f" at character {at[0]}" if at and type(at[0]) is int else ""
            why = (error.get("ctx") or {}).get("error", "decode error")
            parts.append(f"the body is not valid JSON ({why}{where})")
            continue
        loc = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{loc or 'body'}: {error.get('msg', 'invalid')}")
    return f"invalid {what}: " + "; ".join(parts)


def validation_param(errors: Sequence[Mapping[str, Any]]) -> str | None:
    """The top-level request field the first of pydantic's validation errors is about (OpenAI's ``param``: ``input``
    for a bad item of it too), or None for the body as a whole (not JSON, not an object)."""
    for error in list(errors)[:1]:
        loc = [p for p in error.get("loc", ()) if p != "body"]
        if loc and isinstance(loc[0], str) and error.get("type") != "json_invalid":
            return loc[0]
    return None


def _token_ids(errors: Sequence[Mapping[str, Any]]) -> str | None:
    """The text field (``input``/``inputs``) that was sent numbers, as a client that tokenises for OpenAI does."""
    for error in errors:
        loc = [p for p in error.get("loc", ()) if p != "body"]
        value = error.get("input")
        values = value if isinstance(value, list) and value else [value]
        if loc and loc[0] in ("input", "inputs") and all(type(v) is int for v in values):
            return str(loc[0])
    return None
