"""Who did what: request ids, key ids, structured logs and OpenTelemetry traces of a request.

* Every HTTP request gets an id: the client's ``x-request-id`` when it is a short token of safe characters (so a
  proxy's id carries through), else a new one; the response carries it back in ``x-request-id``.
* Log records carry the id and the caller's key id (`service.auth.key_id`, never the key) of the request being
  handled (context variables set by `service.guard.GuardMiddleware`): appended in the text format (the default),
  as fields in the JSON format (``log_format=json``, one object per line).
* With ``otel_exporter_otlp_endpoint`` set, each embedding request is a server span with a child span per stage —
  admission, tokenization, queue, batch, response — exported over OTLP/HTTP by the OpenTelemetry SDK; each carries
  the request id and key id. Without it the tracer is the API's no-op one (nothing recorded, nothing sent).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Tracer

from service.auth import Caller
from service.engine.admission import Ticket
from service.errors import ErrorKind

REQUEST = "embed_request"  # key in the ASGI scope's "state": the request's `RequestContext` (guard middleware)
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)
KEY_ID: ContextVar[str | None] = ContextVar("key_id", default=None)
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
TRACER_NAME = "embedder.service"


def request_id(given: bytes | None) -> str:
    """The id of a request: the client's ``x-request-id`` if it is 1-64 characters of ``[A-Za-z0-9._:-]``, else a
    new random one (so a log line can never be forged by a header)."""
    if given is not None:
        text = given.decode("latin-1")
        if _CLIENT_REQUEST_ID.fullmatch(text):
            return text
    return uuid.uuid4().hex


def loggable_path(path: str) -> str:
    """A request's path as a log line may carry it: percent-encoded as a client sends it. The server hands routes the
    path decoded, so ``%0a`` or ``%1b`` in a URL would otherwise write a newline (a forged record on a line of its own)
    or a terminal's escape into the log."""
    return quote(path, safe="/:@!$&'()*+,;=")


@dataclass
class RequestContext:
    """One request as the guard middleware sees it: its id, its caller, when it arrived (perf_counter()), its
    admission ticket (embedding routes), the perf_counter() interval of each stage the engine records (`stage`), for
    its trace, and the kind of error it was answered with on a route whose failures the guard counts (`failed`)."""

    request_id: str
    caller: Caller
    started: float = field(default_factory=time.perf_counter)
    ticket: Ticket | None = None
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    failure: ErrorKind | None = None

    def stage(self, name: str, start: float, end: float) -> None:
        self.stages[name] = (start, end)


def failed(scope: MutableMapping[str, Any], kind: ErrorKind) -> bool:
    """Note that the request of ``scope`` is answered with an error of ``kind``: the guard counts it once the answer is
    sent, labelled by the route the request matched (`service.guard.GuardMiddleware`). For the routes other than the
    embedding routes and /tokenize, whose own bookkeeping counts their failures by model (`service.api.tracking`).
    False when the request has no context (a path the guard lets by): the caller counts it then."""
    context = scope.get("state", {}).get(REQUEST)
    if context is None:
        return False
    context.failure = kind
    return True


class RequestContextFilter(logging.Filter):
    """Adds ``request_id`` and ``key_id`` (None outside a request) to every record, and ``context``: the two as
    `` [request=… key=…]`` for the text format, empty outside a request."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        record.key_id = KEY_ID.get()
        record.context = f" [request={record.request_id} key={record.key_id}]" if record.request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, key_id (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "key_id": getattr(record, "key_id", None),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


JsonFormatter.converter = time.gmtime  # type: ignore[assignment]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s"


def configure_logging(level: str, log_format: str) -> None:
    """The process's root handler: ``text`` (the default) or ``json``, every record with its request context."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def build_tracer(endpoint: str, provider: trace.TracerProvider | None = None) -> Tracer:
    """The app's tracer: from ``provider`` when given (tests pass one with an in-memory exporter), else an SDK
    provider exporting over OTLP/HTTP to ``endpoint`` (``<endpoint>/v1/traces``, as OTEL_EXPORTER_OTLP_ENDPOINT
    means), else the no-op tracer."""
    if provider is None and endpoint:
        exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")
        sdk_provider = TracerProvider(resource=Resource.create({"service.name": "embedder"}))
        sdk_provider.add_span_processor(BatchSpanProcessor(exporter))
        provider = sdk_provider
    if provider is None:
        return trace.NoOpTracer()
    return provider.get_tracer(TRACER_NAME)


def start_request_span(tracer: Tracer, method: str, route: str, context: RequestContext) -> Span:
    """The server span of one request (ended by the caller)."""
    return tracer.start_span(
        f"{method} {route}",
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": method,
            "http.route": route,
            "embedder.request_id": context.request_id,
            "embedder.key_id": context.caller.key_id,
        },
    )


def record_stages(tracer: Tracer, parent: Span, context: RequestContext) -> None:
    """A child span of ``parent`` for each recorded stage, at the times it ran (perf_counter → epoch ns)."""
    if not parent.is_recording():
        return
    offset_ns = time.time_ns() - time.perf_counter_ns()
    parent_context = trace.set_span_in_context(parent)
    attributes = {"embedder.request_id": context.request_id, "embedder.key_id": context.caller.key_id}
    for name, (start, end) in context.stages.items():
        span = tracer.start_span(
            name, context=parent_context, start_time=offset_ns + int(start * 1e9), attributes=attributes
        )
        span.end(end_time=offset_ns + int(end * 1e9))
