"""`create_app(settings)`: the FastAPI application — routes, error table, guards, and a lifespan that loads,
warms and finally drains the models.

Layers (STYLE.md §8): ``service.api`` (HTTP shapes and routes) → ``service.engine`` (batching queues,
served models, hot reload) → ``service.backend`` (onnxruntime over an exported bundle). Nothing
here imports torch or ``training``.

The /adapt routes (``service.adapt``) are built by their own package; `create_app` includes them
with ``include_adapt=True`` (the default) through ``service.adapt.api_router.build_adapt_router``,
whose router lifespan FastAPI merges into the app's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from opentelemetry.trace import Tracer, TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match

from service.api.direct import direct_route
from service.api.direct import serve as serve_directly
from service.api.routes import MODEL_ROUTE_PREFIX, SERVICE_VERSION, metrics_router, router
from service.api.tracking import RouteMetrics
from service.auth import ApiKeys
from service.backend.base import BackendFactory
from service.engine.admission import Ticket
from service.engine.engine import Engine
from service.engine.served import ModelManager
from service.errors import (
    INTERNAL_MESSAGE,
    ErrorKind,
    ServiceError,
    error_response,
    validation_message,
    validation_param,
)
from service.metrics import EMBEDDING_ROUTES, NO_MODEL, TOKENIZE_ROUTE, MetricsListener, ServiceMetrics
from service.observability import (
    KEY_ID,
    REQUEST,
    REQUEST_ID,
    RequestContext,
    build_tracer,
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
UNMATCHED = "unmatched"  # a span's route when no route of the app matched the path
_UPLOAD_PATHS = frozenset({"/adapt"})  # POST bodies that carry a corpus: capped by adapt_max_upload_bytes
# What a browser page may read of a response besides the basic headers: the request id, the timings and version
# (`service.api.tracking`) and the hints of a refusal.
CORS_EXPOSED_HEADERS = [
    "x-request-id", "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-model-version",
    "retry-after", "www-authenticate",
]  # fmt: skip


class _BodyRefused(Exception):
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
    request is a span with a child per stage; with ``access_log`` on, it ends with one log line."""

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
        headers = dict(scope.get("headers", ()))
        authorization = headers.get(b"authorization")
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

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), (b"x-request-id", context.request_id.encode())]
                if context.ticket is not None and "batch" in context.stages:
                    context.stage("response", context.stages["batch"][1], time.perf_counter())
            await send(message)

        started = time.perf_counter()
        try:
            await self._guard(scope, receive, send_with_id, context, route, svc)
        finally:
            if route is None:  # named by the route the app matched, as declared: a bounded set, whatever the path
                template = getattr(scope.get("route"), "path", UNMATCHED)
                span.update_name(f"{scope['method']} {template}")
                span.set_attribute("http.route", template)
            span.set_attribute("http.response.status_code", status)
            record_stages(self.tracer, span, context)
            span.end()
            if self.access_log:
                log.info("%s %s %d %.1f ms", scope["method"], path, status, (time.perf_counter() - started) * 1000)
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
                svc.count_failure(route, NO_MODEL, ErrorKind.shutting_down)
            await error_response(ErrorKind.shutting_down, "the server is shutting down; retry on another replica")(
                scope, receive, send
            )
            return
        if scope["path"] in CLIENT_ROUTES or scope["path"].startswith(MODEL_ROUTE_PREFIX):
            try:
                self.state.keys.check_client(context.caller)
            except ServiceError as err:
                if route:
                    svc.count_failure(route, NO_MODEL, err.kind)
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
                svc.count_failure(route, NO_MODEL, admitted.kind)
                await admitted.response()(scope, receive, send)
                return
            context.ticket = admitted
            context.stage("admission", admitted.arrived, admitted.arrived + admitted.waited)
            svc.metrics.admission_wait.labels(route).observe(admitted.waited)
        received = 0
        body_done = False
        refused: _BodyRefused | None = None
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
        except _BodyRefused as err:
            await self._refuse(route, svc, scope, receive, send, err)
        finally:
            self.state.in_flight -= 1
            if context.ticket is not None:
                context.ticket.done()

    async def _refuse(self, route: str | None, svc: RouteMetrics, scope: Scope, receive: Receive, send: Send,
                      err: _BodyRefused) -> None:  # fmt: skip
        if route:
            svc.count_failure(route, NO_MODEL, err.kind)
        await error_response(err.kind, err.message)(scope, receive, send)


def _encoded(encoding: bytes) -> _BodyRefused:
    return _BodyRefused(
        ErrorKind.unsupported_encoding,
        f"Content-Encoding {encoding.decode('latin-1')!r} is not accepted (the body's bounds hold for what is sent, "
        "not what it would inflate to): send the body uncompressed",
    )


def _not_json(media_type: bytes) -> _BodyRefused:
    sent = f"Content-Type {media_type.decode('latin-1')!r}" if media_type else "no Content-Type"
    return _BodyRefused(
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


def _foreign_host(headers: dict[bytes, bytes], names: frozenset[str] | None) -> _BodyRefused | None:
    """400 for a Host header that names none of ``names`` (`ServiceSettings.host_names`; None: any name)."""
    host = headers.get(b"host")
    if names is None or host is None:
        return None
    name = host_name(host)
    if name in names or (name.endswith(".localhost") and "localhost" in names):
        return None
    return _BodyRefused(
        ErrorKind.host_not_allowed,
        f"this server does not answer to the host name {name!r}; call it by one of {', '.join(sorted(names))}, or "
        "list the name in allowed_hosts (EMBED_ALLOWED_HOSTS)",
    )


def _foreign_origin(method: str, headers: dict[bytes, bytes], origins: frozenset[str]) -> _BodyRefused | None:
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
    return _BodyRefused(
        ErrorKind.cross_origin,
        f"a web page of origin {text!r} may not send {method} requests to this server; list the origin in "
        "cors_allow_origins (EMBED_CORS_ALLOW_ORIGINS) to let it",
    )


def _too_large(limit: int, setting: str) -> _BodyRefused:
    return _BodyRefused(
        ErrorKind.payload_too_large, f"request body exceeds {setting}={limit}; send fewer or shorter texts"
    )


def _too_slow(received: int, timeout: float, min_rate: int) -> _BodyRefused:
    return _BodyRefused(
        ErrorKind.body_timeout,
        f"the request body did not arrive in time ({received} bytes received; the bound is body_timeout_seconds="
        f"{timeout:g} plus 1 s per body_min_bytes_per_second={min_rate} bytes): send it without pauses",
    )


def _outcome(admitted: Ticket | ServiceError) -> str:
    return "refused" if isinstance(admitted, ServiceError) else "admitted"


_HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _allowed_methods(app: FastAPI, scope: Scope) -> str:
    """The ``Allow`` header of a 405: every method some route serves on the path (Starlette's own header names
    only the first route that matched, so ``DELETE /adapt`` would list POST but not GET)."""
    allowed = [
        method
        for method in _HTTP_METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in app.router.routes)
    ]
    return ", ".join(allowed)


def _not_found_message(app: FastAPI, scope: Scope) -> str:
    """A 404's message; where the path is one of the OpenAI routes without its ``/v1`` (an OpenAI client whose base
    URL lacks it: ``http://host:8080`` instead of ``http://host:8080/v1``), it says so."""
    message = f"no route {scope['method']} {scope['path']}; see /docs"
    prefixed = {**scope, "path": "/v1" + scope["path"]}
    if any(route.matches(prefixed)[0] is Match.FULL for route in app.router.routes):
        message += f"; {scope['method']} /v1{scope['path']} exists (an OpenAI client's base URL ends in /v1)"
    return message


def create_app(
    settings: ServiceSettings | None = None,
    *,
    backend_factory: BackendFactory | None = None,
    include_adapt: bool = True,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """Build the service. ``backend_factory(bundle_dir, settings)`` loads one model (default: onnxruntime);
    tests pass a deterministic fake. ``include_adapt`` mounts the /adapt routes of ``service.adapt``.
    ``tracer_provider`` replaces the OTLP exporter of ``otel_exporter_otlp_endpoint`` (tests: an in-memory one).
    Raises ValueError for settings that would serve /adapt open beyond loopback (`ServiceSettings.open_adapt_error`)."""
    settings = settings or ServiceSettings()
    refusal = settings.open_adapt_error() if include_adapt else None
    if refusal is not None:
        raise ValueError(refusal)
    if backend_factory is None:
        from service.backend.onnx import onnx_backend_factory

        backend_factory = onnx_backend_factory
    metrics = ServiceMetrics()
    models = ModelManager(settings, backend_factory, metrics)
    engine = Engine(settings, models, metrics)
    route_metrics = RouteMetrics(metrics)
    keys = ApiKeys.from_settings(settings)
    metrics.register_keys(keys.key_ids())
    metrics_listener = MetricsListener(metrics.registry, settings.host, settings.metrics_port)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not keys.client_auth_enabled:
            log.warning(
                "no API keys configured (EMBED_API_KEYS): the embedding routes are open to anyone who can reach "
                "%s:%s", settings.host, settings.port,
            )  # fmt: skip
        if settings.metrics_port:  # first: scrapes answer while the models load, as on the main port
            metrics_listener.start()
            log.info("metrics: /metrics on %s:%d", settings.host, settings.metrics_port)
        try:
            await models.start()
            log.info("ready: serving %s (default %s)", ", ".join(models.names), settings.default_model)
            try:
                yield
            finally:
                app.state.draining = True
                await models.stop(settings.shutdown_grace_seconds)
                log.info("stopped")
        finally:
            await asyncio.to_thread(metrics_listener.stop)

    app = FastAPI(
        title="embedder",
        version=SERVICE_VERSION,
        summary="Sentence embeddings over ONNX bundles: OpenAI- and TEI-compatible routes.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.route_metrics = route_metrics
    app.state.keys = keys
    app.state.metrics = metrics
    app.state.draining = False
    app.state.in_flight = 0
    app.include_router(router)
    if not settings.metrics_port:
        app.include_router(metrics_router)
    if include_adapt:
        from adapt_jobs.settings import AdaptConfig
        from service.adapt.api_router import build_adapt_router

        config = AdaptConfig(registry_dir=settings.registry_dir, cache_dir=settings.cache_dir, settings=settings.adapt)
        app.include_router(build_adapt_router(config, keys))

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, err: ServiceError) -> Response:
        return err.response()

    def _invalid_request(request: Request, message: str, param: str | None = None) -> Response:
        if request.url.path in COUNTED_ROUTES:
            route_metrics.count_failure(request.url.path, NO_MODEL, ErrorKind.invalid_request)
        return error_response(ErrorKind.invalid_request, message, param=param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> Response:
        return _invalid_request(request, validation_message(err.errors()), validation_param(err.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 400:
            # The framework's own 400 is a body it could not decode (bytes that are not UTF-8, a broken multipart
            # form): malformed like broken JSON, which is a 422 (`invalid_request`), so both get the same answer.
            message = f"invalid request: {err.detail}; send UTF-8 JSON (or a well-formed multipart upload to /adapt)"
            return _invalid_request(request, message)
        if err.status_code == 404:
            return error_response(ErrorKind.not_found, _not_found_message(app, request.scope))
        if err.status_code == 405:
            allowed = _allowed_methods(app, request.scope)
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
            return error_response(ErrorKind.method_not_allowed, message, {"Allow": allowed})
        body = {"error": {"message": str(err.detail), "type": "invalid_request_error", "param": None,
                          "code": "http_error"}}
        return Response(orjson.dumps(body), status_code=err.status_code, media_type="application/json",
                        headers=err.headers)  # fmt: skip

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> Response:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=err)
        return error_response(ErrorKind.internal, INTERNAL_MESSAGE)

    upload_body_bytes = None
    if include_adapt and settings.adapt.enabled:
        from service.adapt.intake import UPLOAD_FRAMING_BYTES

        upload_body_bytes = max(settings.max_body_bytes, settings.adapt.max_upload_bytes + UPLOAD_FRAMING_BYTES)
    app.add_middleware(
        GuardMiddleware, state=app.state, max_body_bytes=settings.max_body_bytes, upload_body_bytes=upload_body_bytes,
        tracer=build_tracer(settings.otel_exporter_otlp_endpoint, tracer_provider),
    )  # fmt: skip
    if settings.cors_allow_origins:  # outside the guard: a preflight carries no key and is answered here
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_allow_origins, allow_methods=["GET", "HEAD", "POST"],
            allow_headers=["authorization", "content-type"], expose_headers=CORS_EXPOSED_HEADERS, max_age=600,
        )  # fmt: skip
    return app
