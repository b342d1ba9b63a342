"""`create_app(settings)`: the FastAPI application — routes, error table, the guard (`service.guard`), and a
lifespan that loads, warms and finally drains the models.

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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from opentelemetry.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from service.api.routes import SERVICE_VERSION, metrics_router, router
from service.api.tracking import RouteMetrics
from service.auth import ApiKeys
from service.backend.base import BackendFactory
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
from service.guard import COUNTED_ROUTES, BodyRefused, GuardMiddleware, Scope, route_template
from service.metrics import NO_MODEL, MetricsListener, ServiceMetrics
from service.observability import REQUEST, build_tracer, failed, loggable_path
from service.settings import ServiceSettings

log = logging.getLogger("service")

# What a browser page may read of a response besides the basic headers: the request id, the timings and version
# (`service.api.tracking`) and the hints of a refusal.
CORS_EXPOSED_HEADERS = [
    "x-request-id", "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-model-version",
    "retry-after", "www-authenticate",
]  # fmt: skip


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
        from service.adapt.api_router import ADAPT_ROUTES, build_adapt_router

        config = AdaptConfig(registry_dir=settings.registry_dir, cache_dir=settings.cache_dir, settings=settings.adapt)
        app.include_router(build_adapt_router(config, keys))
        metrics.register_routes(ADAPT_ROUTES)

    def _count(request: Request, kind: ErrorKind, *, tracked: bool = False) -> None:
        """Count a failure the framework or a handler answers: on an embedding route or /tokenize here, unless its
        tracking (`RouteMetrics.track`) already did (``tracked``); on another route by the guard, once answered."""
        if request.url.path not in COUNTED_ROUTES:
            if not failed(request.scope, kind):  # /health, /ready, /metrics: the guard lets them by
                metrics.failures.labels(route_template(request.scope, metrics), NO_MODEL, kind.code).inc()
        elif not tracked:
            context = request.scope.get("state", {}).get(REQUEST)  # None in an app run without the guard: not timed
            route_metrics.count_failure(request.url.path, NO_MODEL, kind, context.started if context else None)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, err: ServiceError) -> Response:
        _count(request, err.kind, tracked=True)
        return err.response()

    def _invalid_request(request: Request, message: str, param: str | None = None) -> Response:
        _count(request, ErrorKind.invalid_request)
        return error_response(ErrorKind.invalid_request, message, param=param)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, err: ClientDisconnect) -> Response:
        """The client closed its connection while its body was being read: counted as a client gone (no answer
        reaches it; the access log shows 499), not as a malformed request nor an internal error."""
        _count(request, ErrorKind.client_closed)
        return Response(status_code=ErrorKind.client_closed.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> Response:
        return _invalid_request(request, validation_message(err.errors()), validation_param(err.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == 400 and isinstance(err.__cause__, ClientDisconnect):  # FastAPI's, for a body cut off
            return await _client_gone(request, err.__cause__)
        if err.status_code == 400 and isinstance(err.__cause__, BodyRefused):
            # The guard refused the body as it streamed in: it answers and counts that refusal in place of this 400,
            # which no client sees and which is not counted beside it.
            return error_response(err.__cause__.kind, err.__cause__.message)
        if err.status_code == 400:
            # The framework's own 400 is a body it could not decode (bytes that are not UTF-8, a broken multipart
            # form): malformed like broken JSON, which is a 422 (`invalid_request`), so both get the same answer.
            message = f"invalid request: {err.detail}; send UTF-8 JSON (or a well-formed multipart upload to /adapt)"
            return _invalid_request(request, message)
        if err.status_code == 404:
            _count(request, ErrorKind.not_found)
            return error_response(ErrorKind.not_found, _not_found_message(app, request.scope))
        if err.status_code == 405:
            _count(request, ErrorKind.method_not_allowed)
            allowed = _allowed_methods(app, request.scope)
            message = f"{request.method} is not allowed on {request.url.path}; allowed: {allowed}"
            return error_response(ErrorKind.method_not_allowed, message, {"Allow": allowed})
        body = {"error": {"message": str(err.detail), "type": "invalid_request_error", "param": None,
                          "code": "http_error"}}
        return Response(orjson.dumps(body), status_code=err.status_code, media_type="application/json",
                        headers=err.headers)  # fmt: skip

    @app.exception_handler(Exception)
    async def _internal(request: Request, err: Exception) -> Response:
        _count(request, ErrorKind.internal, tracked=True)
        log.error("internal error on %s %s", request.method, loggable_path(request.url.path), exc_info=err)
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
