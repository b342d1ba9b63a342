"""`GuardMiddleware`: what every request meets before the routes — its id and caller, the browser's bounds, draining,
the key, the body's size, type and pace, and the admission — each answered at once and cheaply.

Pure ASGI, below the app (`service.app.create_app` adds it); nothing here imports torch or ``training``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry.trace import Tracer

from service.api.direct import direct_route
from service.api.direct import serve as serve_directly
from service.api.routes import MODEL_ROUTE_PREFIX
from service.api.tracking import RouteMetrics
from service.auth import ApiKeys
from service.engine.admission import Ticket
from service.errors import INTERNAL_MESSAGE, ErrorKind, ServiceError, error_response
from service.metrics import EMBEDDING_ROUTES, NO_MODEL, TOKENIZE_ROUTE, UNMATCHED, ServiceMetrics
from service.observability import (
    KEY_ID,
    REQUEST,
    REQUEST_ID,
    RequestContext,
    failed,
    loggable_path,
    record_stages,
    request_id,
    start_request_span,
)
from service.settings import ServiceSettings

log = logging.getLogger("service")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Probes and scrapes keep answering while the server drains; everything else gets 503.
_ALWAYS_OPEN = frozenset({"/health", "/ready", "/metrics"})
# a client key when keys are set: these and every model's card (MODEL_ROUTE_PREFIX + name)
CLIENT_ROUTES = frozenset({*EMBEDDING_ROUTES, TOKENIZE_ROUTE, "/v1/models", "/info"})
# the routes whose failures embed_request_failures_total counts (by route, model and kind)
COUNTED_ROUTES = frozenset({*EMBEDDING_ROUTES, TOKENIZE_ROUTE})
_UPLOAD_PATHS = frozenset({"/adapt"})  # POST bodies that carry a corpus: capped by adapt_max_upload_bytes


class BodyRefused(Exception):
    """The body broke a bound while it streamed in (too large, or too slow)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class GuardMiddleware:
    """Pure ASGI (no per-request task like BaseHTTPMiddleware): what every request meets before the routes, in
    this order, each answered at once and cheaply:

    1. **identity** — a request id (`service.observability.request_id`) and the caller (`ApiKeys.identify`),
       set as the log context and answered in ``x-request-id``;
    2. **the browser's bounds** — a Host header that names none of ``allowed_hosts`` (by default, on loopback,
       this machine's names) gets 400, and a request other than GET/HEAD/OPTIONS from a web page of an origin
       neither the server's own nor listed in ``cors_allow_origins`` gets 403: a page the user visits cannot drive
       a keyless server on loopback (DNS rebinding, a cross-site form post);
    3. **draining** — 503 while the server shuts down (probes and scrapes stay open);
    4. **the key** — a client route (embeddings, /tokenize, /v1/models and each model's card, /info) without a
       valid key, when keys are set, is answered 401 here: before it takes an admission slot or a byte of its body
       is read, so a stranger cannot hold capacity a keyed client needs;
    5. **size** — a body over ``max_body_bytes`` (``POST /adapt``: the upload limit plus framing) gets 413, by
       Content-Length or while a chunked body streams in; a compressed body (``Content-Encoding``) gets 415, and
       so does an embedding or /tokenize body not declared JSON (``Content-Type``);
    6. **admission** — an embedding request meets the admission (`service.engine.admission`) as its caller's
       key: over the bound it waits in line or is refused with 429 before its body is read, parsed or validated,
       so a retry storm costs a header parse and a short answer per request, not a JSON decode;
    7. **the body's pace** — the body must arrive within ``body_timeout_seconds`` plus one second per
       ``body_min_bytes_per_second`` received (Apache mod_reqtimeout's rule), or the request is answered 408 and
       its slot freed: a client that sends slowly cannot hold a slot for as long as it likes;
    8. **the route** — an embedding ``POST`` with a JSON body that validates runs its route function directly
       (`service.api.direct`); everything else, and every body that does not validate, goes through FastAPI.

    An admitted request carries its `RequestContext` in ``scope["state"]``; its clock starts at its arrival here,
    so the server's histograms include the time it waited in line and was read and parsed. With tracing on, the
    request is a span with a child per stage; with ``access_log`` on, it ends with one log line.

    Every failure is counted in ``embed_request_failures_total``: an embedding or /tokenize request's by its route's
    own bookkeeping (by model, `service.api.tracking.RouteMetrics`), any other request's here once it is answered,
    labelled by the route it matched as declared (``unmatched`` for a path no route has). An unexpected exception is
    answered 500 here, inside the request's context: its log record and its answer carry the request id."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        *,
        state: Any,
        max_body_bytes: int,
        upload_body_bytes: int | None = None,
        tracer: Tracer,
    ) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes
        self.upload_body_bytes = upload_body_bytes
        self.tracer = tracer
        settings: ServiceSettings = state.settings
        self.body_timeout = settings.body_timeout_seconds
        self.body_min_rate = settings.body_min_bytes_per_second
        self.access_log = settings.access_log
        self.host_names = settings.host_names()
        self.origins = frozenset(settings.cors_allow_origins)
        self.direct = True  # embedding requests skip FastAPI's routing when their body validates (service.api.direct)

    def _limit(self, scope: Scope) -> tuple[int, str]:
        if self.upload_body_bytes is not None and scope["path"] in _UPLOAD_PATHS and scope["method"] == "POST":
            return self.upload_body_bytes, "adapt_max_upload_bytes"
        return self.max_body_bytes, "max_body_bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in _ALWAYS_OPEN:
            await self.app(scope, receive, send)
            return
        svc: RouteMetrics = self.state.route_metrics
        keys: ApiKeys = self.state.keys
        headers = dict(scope.get("headers", ()))  # a repeated header's last value, for the headers read below
        # but the first Authorization header, as the routes read it (Starlette's Headers.get): one caller per request
        authorization = next((value for name, value in scope.get("headers", ()) if name == b"authorization"), None)
        context = RequestContext(
            request_id=request_id(headers.get(b"x-request-id")),
            caller=keys.identify(authorization.decode("latin-1") if authorization is not None else None),
        )
        scope.setdefault("state", {})[REQUEST] = context
        request_token = REQUEST_ID.set(context.request_id)
        key_token = KEY_ID.set(context.caller.key_id)
        route = path if path in COUNTED_ROUTES else None
        span = start_request_span(self.tracer, scope["method"], route or UNMATCHED, context)
        status = 500
        responded = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                status = message["status"]
                responded = True
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", context.request_id.encode())]
                if context.ticket is not None and "batch" in context.stages:
                    context.stage("response", context.stages["batch"][1], time.perf_counter())
            await send(message)

        started = time.perf_counter()
        try:
            try:
                await self._guard(scope, receive, send_with_id, context, route, svc)
            except Exception as err:  # what no handler answered: here, not outside, so the log and answer have the id
                if responded:
                    raise
                log.error("internal error on %s %s", scope["method"], loggable_path(path), exc_info=err)
                if route is None:
                    context.failure = ErrorKind.internal
                await error_response(ErrorKind.internal, INTERNAL_MESSAGE)(scope, receive, send_with_id)
        finally:
            if route is None:  # named by the route the app matched, as declared: a bounded set, whatever the path
                template = route_template(scope, svc.metrics)
                span.update_name(f"{scope['method']} {template}")
                span.set_attribute("http.route", template)
                if context.failure is not None:
                    svc.metrics.failures.labels(template, NO_MODEL, context.failure.code).inc()
            span.set_attribute("http.response.status_code", status)
            record_stages(self.tracer, span, context)
            span.end()
            if self.access_log:
                elapsed_ms = (time.perf_counter() - started) * 1000
                log.info("%s %s %d %.1f ms", scope["method"], loggable_path(path), status, elapsed_ms)
            REQUEST_ID.reset(request_token)
            KEY_ID.reset(key_token)

    async def _guard(
        self, scope: Scope, receive: Receive, send: Send, context: RequestContext, route: str | None,
        svc: RouteMetrics,
    ) -> None:  # fmt: skip
        headers = dict(scope.get("headers", ()))
        refusal = _foreign_host(headers, self.host_names) or _foreign_origin(scope["method"], headers, self.origins)
        if refusal is not None:
            await self._refuse(route, svc, scope, receive, send, refusal)
            return
        if self.state.draining:
            if route:
                svc.count_failure(route, NO_MODEL, ErrorKind.shutting_down, context.started)
            else:
                context.failure = ErrorKind.shutting_down
            await error_response(ErrorKind.shutting_down, "the server is shutting down; retry on another replica")(
                scope, receive, send
            )
            return
        if scope["path"] in CLIENT_ROUTES or scope["path"].startswith(MODEL_ROUTE_PREFIX):
            try:
                self.state.keys.check_client(context.caller)
            except ServiceError as err:
                if route:
                    svc.count_failure(route, NO_MODEL, err.kind, context.started)
                else:
                    context.failure = err.kind
                await err.response()(scope, receive, send)
                return
        limit, setting = self._limit(scope)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._refuse(route, svc, scope, receive, send, _too_large(limit, setting))
                return
            if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                await self._refuse(route, svc, scope, receive, send, _encoded(value))
                return
        if scope["method"] == "POST" and route is not None:
            media_type = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
            if media_type != b"application/json" and not media_type.endswith(b"+json"):
                await self._refuse(route, svc, scope, receive, send, _not_json(media_type))
                return
        if route in EMBEDDING_ROUTES and scope["method"] == "POST":
            admitted = await self.state.engine.admission.enter(context.caller.key_id)
            svc.metrics.admissions.labels(context.caller.key_id, _outcome(admitted)).inc()
            if isinstance(admitted, ServiceError):
                svc.count_failure(route, NO_MODEL, admitted.kind, context.started)
                await admitted.response()(scope, receive, send)
                return
            context.ticket = admitted
            context.stage("admission", admitted.arrived, admitted.arrived + admitted.waited)
            svc.metrics.admission_wait.labels(route).observe(admitted.waited)
        received = 0
        body_done = False
        refused: BodyRefused | None = None
        body_started = time.perf_counter()

        async def guarded_receive() -> Message:
            nonlocal received, body_done, refused
            if body_done:
                return await receive()
            deadline = body_started + self.body_timeout + received / self.body_min_rate
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.perf_counter(), 0.0))
            except TimeoutError:
                refused = _too_slow(received, self.body_timeout, self.body_min_rate)
                raise refused from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > limit:
                    refused = _too_large(limit, setting)
                    raise refused
            return message

        async def guarded_send(message: Message) -> None:
            # The framework turns a failed body read into its own 400; answer with the bound that was broken.
            if refused is None:
                await send(message)
            elif message["type"] == "http.response.start":
                await self._refuse(route, svc, scope, receive, send, refused)

        self.state.in_flight += 1
        direct = direct_route(scope) if self.direct else None
        try:
            if direct is not None:  # an embedding request with a JSON body: its route without FastAPI's machinery
                await serve_directly(direct, self.app, scope, guarded_receive, guarded_send)
            else:
                await self.app(scope, guarded_receive, guarded_send)
        except BodyRefused as err:
            await self._refuse(route, svc, scope, receive, send, err)
        finally:
            self.state.in_flight -= 1
            if context.ticket is not None:
                context.ticket.done()

    async def _refuse(self, route: str | None, svc: RouteMetrics, scope: Scope, receive: Receive, send: Send,
                      err: BodyRefused) -> None:  # fmt: skip
        if route:
            svc.count_failure(route, NO_MODEL, err.kind, scope["state"][REQUEST].started)
        else:
            failed(scope, err.kind)
        await error_response(err.kind, err.message)(scope, receive, send)


def route_template(scope: Scope, metrics: ServiceMetrics) -> str:
    """The route a request matched, as declared (``/adapt/{job_id}``), or `UNMATCHED`: a bounded set of labels, however
    many paths clients make up. A request refused before the app routed it is matched by its path
    (`ServiceMetrics.route_of`)."""
    return getattr(scope.get("route"), "path", None) or metrics.route_of(scope["path"])


def _encoded(encoding: bytes) -> BodyRefused:
    return BodyRefused(
        ErrorKind.unsupported_encoding,
        f"Content-Encoding {encoding.decode('latin-1')!r} is not accepted (the body's bounds hold for what is sent, "
        "not what it would inflate to): send the body uncompressed",
    )


def _not_json(media_type: bytes) -> BodyRefused:
    sent = f"Content-Type {media_type.decode('latin-1')!r}" if media_type else "no Content-Type"
    return BodyRefused(
        ErrorKind.unsupported_media_type,
        f"the body must be JSON and the request says {sent}: send 'Content-Type: application/json' (curl: "
        "-H 'Content-Type: application/json', or --json)",
    )


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: bytes) -> str:
    """The name of a Host header, lower-cased, without its port (``[::1]:8080`` → ``::1``)."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rpartition(":")[0] if text.count(":") == 1 else text


def _foreign_host(headers: dict[bytes, bytes], names: frozenset[str] | None) -> BodyRefused | None:
    """400 for a Host header that names none of ``names`` (`ServiceSettings.host_names`; None: any name)."""
    host = headers.get(b"host")
    if names is None or host is None:
        return None
    name = host_name(host)
    if name in names or (name.endswith(".localhost") and "localhost" in names):
        return None
    return BodyRefused(
        ErrorKind.host_not_allowed,
        f"this server does not answer to the host name {name!r}; call it by one of {', '.join(sorted(names))}, or "
        "list the name in allowed_hosts (EMBED_ALLOWED_HOSTS)",
    )


def _foreign_origin(method: str, headers: dict[bytes, bytes], origins: frozenset[str]) -> BodyRefused | None:
    """403 for a request other than GET/HEAD/OPTIONS sent by a web page of another origin than this server's that
    ``cors_allow_origins`` does not list. A browser sends such a request — a form post, or a fetch with a plain
    text or multipart body — without asking first, and a keyless server on loopback would act on it: this is what
    keeps a page the user merely visits from starting /adapt jobs or spending the CPU. Clients outside a browser
    send no Origin header and are not affected."""
    origin = headers.get(b"origin")
    if method in SAFE_METHODS or origin is None:
        return None
    text = origin.decode("latin-1").strip()
    if "*" in origins or text in origins:
        return None
    _, scheme_sep, authority = text.lower().partition("://")
    if scheme_sep and authority == headers.get(b"host", b"").decode("latin-1").strip().lower():
        return None  # the server's own origin: a page it served, or a same-origin proxy
    return BodyRefused(
        ErrorKind.cross_origin,
        f"a web page of origin {text!r} may not send {method} requests to this server; list the origin in "
        "cors_allow_origins (EMBED_CORS_ALLOW_ORIGINS) to let it",
    )


def _too_large(limit: int, setting: str) -> BodyRefused:
    return BodyRefused(
        ErrorKind.payload_too_large, f"request body exceeds {setting}={limit}; send fewer or shorter texts"
    )


def _too_slow(received: int, timeout: float, min_rate: int) -> BodyRefused:
    return BodyRefused(
        ErrorKind.body_timeout,
        f"the request body did not arrive in time ({received} bytes received; the bound is body_timeout_seconds="
        f"{timeout:g} plus 1 s per body_min_bytes_per_second={min_rate} bytes): send it without pauses",
    )


def _outcome(admitted: Ticket | ServiceError) -> str:
    return "refused" if isinstance(admitted, ServiceError) else "admitted"
