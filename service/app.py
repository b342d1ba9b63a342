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
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.api.routes import SERVICE_VERSION, metrics_router, router
from service.api.serving import TICKET, EmbeddingService
from service.backend.base import BackendFactory
from service.engine.models import ModelManager
from service.errors import INTERNAL_MESSAGE, ErrorKind, ServiceError, error_response, validation_message
from service.metrics import EMBEDDING_ROUTES, NO_MODEL, MetricsListener, ServiceMetrics
from service.settings import ServiceSettings

log = logging.getLogger("service")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Probes and scrapes keep answering while the server drains; everything else gets 503.
_ALWAYS_OPEN = frozenset({"/health", "/ready", "/metrics"})
_UPLOAD_PATHS = frozenset({"/adapt"})  # POST bodies that carry a corpus: capped by adapt_max_upload_bytes
UPLOAD_FRAMING_BYTES = 64 * 1024  # multipart boundaries, form fields and JSON keys around the corpus itself


class _BodyTooLarge(Exception):
    pass


class GuardMiddleware:
    """Pure ASGI (no per-request task like BaseHTTPMiddleware): rejects bodies over ``max_body_bytes`` with 413
    (by Content-Length, or while a chunked body streams in), answers 503 while draining, counts requests in flight.

    It is also where embedding requests meet the admission gate (`service.engine.admission`): over the server's
    bound a request waits in line or is refused with 429 before its body is read, parsed or validated, so a retry
    storm costs a header parse and a short answer per request, not a JSON decode. An admitted request carries its
    `Ticket` in ``scope["state"][TICKET]``; its clock starts at its arrival here, so the server's histograms include
    the time it waited in line and was read and parsed.

    ``POST /adapt`` carries a whole corpus, so it gets its own cap, ``upload_body_bytes`` (the adapt upload
    limit plus room for the multipart/JSON framing); the router then checks the corpus itself."""

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        *,
        state: Any,
        max_body_bytes: int,
        upload_body_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes
        self.upload_body_bytes = upload_body_bytes

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
        svc: EmbeddingService = self.state.embedding_service
        route = path if path in EMBEDDING_ROUTES else None
        if self.state.draining:
            if route:
                svc.count_failure(route, NO_MODEL, ErrorKind.shutting_down)
            await error_response(ErrorKind.shutting_down, "the server is shutting down; retry on another replica")(
                scope, receive, send
            )
            return
        limit, setting = self._limit(scope)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._too_large(route, svc, scope, receive, send, setting)
                return
        ticket = None
        if route is not None and scope["method"] == "POST":
            admitted = await svc.gate.enter()
            if isinstance(admitted, ServiceError):
                svc.count_failure(route, NO_MODEL, admitted.kind)
                await admitted.response()(scope, receive, send)
                return
            ticket = admitted
            svc.metrics.admission_wait.labels(route).observe(ticket.waited)
            scope.setdefault("state", {})[TICKET] = ticket
        received = 0
        too_large = False

        async def limited_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # The framework turns a failed body read into its own 400; answer 413 instead.
            if not too_large:
                await send(message)
            elif message["type"] == "http.response.start":
                await self._too_large(route, svc, scope, receive, send, setting)

        self.state.in_flight += 1
        try:
            await self.app(scope, limited_receive, guarded_send)
        except _BodyTooLarge:
            await self._too_large(route, svc, scope, receive, send, setting)
        finally:
            self.state.in_flight -= 1
            if ticket is not None:
                ticket.done()

    async def _too_large(self, route: str | None, svc: EmbeddingService, scope: Scope, receive: Receive,
                         send: Send, setting: str) -> None:  # fmt: skip
        if route:
            svc.count_failure(route, NO_MODEL, ErrorKind.payload_too_large)
        limit = self.max_body_bytes if setting == "max_body_bytes" else self.upload_body_bytes
        message = f"request body exceeds {setting}={limit}; send fewer or shorter texts"
        await error_response(ErrorKind.payload_too_large, message)(scope, receive, send)


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


def create_app(
    settings: ServiceSettings | None = None,
    *,
    backend_factory: BackendFactory | None = None,
    include_adapt: bool = True,
) -> FastAPI:
    """Build the service. ``backend_factory(bundle_dir, settings)`` loads one model (default: onnxruntime);
    tests pass a deterministic fake. ``include_adapt`` mounts the /adapt routes of ``service.adapt``. Raises
    ValueError for settings that would serve /adapt open beyond loopback (`ServiceSettings.open_adapt_error`)."""
    settings = settings or ServiceSettings()
    refusal = settings.open_adapt_error() if include_adapt else None
    if refusal is not None:
        raise ValueError(refusal)
    if backend_factory is None:
        from service.backend.onnx import onnx_backend_factory

        backend_factory = onnx_backend_factory
    metrics = ServiceMetrics()
    models = ModelManager(settings, backend_factory, metrics)
    embedding_service = EmbeddingService(settings, models, metrics)
    metrics_listener = MetricsListener(metrics.registry, settings.host, settings.metrics_port)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not embedding_service.keys.client_auth_enabled:
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
    app.state.embedding_service = embedding_service
    app.state.draining = False
    app.state.in_flight = 0
    app.include_router(router)
    if not settings.metrics_port:
        app.include_router(metrics_router)
    if include_adapt:
        from adapt.settings import AdaptConfig
        from service.adapt.api_router import build_adapt_router

        config = AdaptConfig(registry_dir=settings.registry_dir, cache_dir=settings.cache_dir, settings=settings.adapt)
        app.include_router(build_adapt_router(config, embedding_service.keys))

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, err: ServiceError) -> Response:
        return err.response()

    def _invalid_request(request: Request, message: str) -> Response:
        if request.url.path in EMBEDDING_ROUTES:
            embedding_service.count_failure(request.url.path, NO_MODEL, ErrorKind.invalid_request)
        return error_response(ErrorKind.invalid_request, message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> Response:
        return _invalid_request(request, validation_message(err.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 400:
            # The framework's own 400 is a body it could not decode (bytes that are not UTF-8, a broken multipart
            # form): malformed like broken JSON, which is a 422 (`invalid_request`), so both get the same answer.
            message = f"invalid request: {err.detail}; send UTF-8 JSON (or a well-formed multipart upload to /adapt)"
            return _invalid_request(request, message)
        if err.status_code == 404:
            return error_response(ErrorKind.not_found, f"no route {request.method} {request.url.path}; see /docs")
        if err.status_code == 405:
            allowed = _allowed_methods(app, request.scope)
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
            return error_response(ErrorKind.method_not_allowed, message, {"Allow": allowed})
        body = {"error": {"message": str(err.detail), "type": "invalid_request_error", "code": "http_error"}}
        return Response(orjson.dumps(body), status_code=err.status_code, media_type="application/json",
                        headers=err.headers)  # fmt: skip

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> Response:
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=err)
        return error_response(ErrorKind.internal, INTERNAL_MESSAGE)

    upload_body_bytes = None
    if include_adapt and settings.adapt.enabled:
        upload_body_bytes = max(settings.max_body_bytes, settings.adapt.max_upload_bytes + UPLOAD_FRAMING_BYTES)
    app.add_middleware(
        GuardMiddleware, state=app.state, max_body_bytes=settings.max_body_bytes, upload_body_bytes=upload_body_bytes
    )
    return app
