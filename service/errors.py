"""One table maps every error kind to its HTTP status, OpenAI error ``type`` and ``code``.

The engine and the routes raise `ServiceError(kind, message)`; one handler renders
``{"error": {"message", "type", "code"}}`` (OpenAI's shape) and counts the failure by kind.
Unexpected exceptions become ``internal`` with the message "internal error"; the traceback goes to
the log only, never to the client.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class ErrorKind(Enum):
    """(HTTP status, OpenAI error type, code). The value's code doubles as the metrics label."""

    invalid_request = (422, "invalid_request_error", "invalid_request")
    input_too_long = (422, "invalid_request_error", "input_too_long")
    model_not_found = (404, "invalid_request_error", "model_not_found")
    not_found = (404, "invalid_request_error", "not_found")
    method_not_allowed = (405, "invalid_request_error", "method_not_allowed")
    payload_too_large = (413, "invalid_request_error", "payload_too_large")
    overloaded = (429, "overloaded_error", "queue_full")
    unauthorized = (401, "authentication_error", "invalid_api_key")
    forbidden = (403, "permission_error", "forbidden")
    model_not_ready = (503, "unavailable_error", "model_not_ready")
    shutting_down = (503, "unavailable_error", "shutting_down")
    internal = (500, "server_error", "internal_error")

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

    def __init__(self, kind: ErrorKind, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.kind, self.message)


def error_body(kind: ErrorKind, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind.type, "code": kind.code}}


INTERNAL_MESSAGE = "internal error"
