"""Thin HTTP routes: parse → `Engine` (service.engine.engine) → render. See docs/API.md for every shape and error."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api.protocol import (
    ErrorResponse,
    Info,
    Limits,
    ModelCard,
    ModelList,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    SimpleToken,
    TEIEmbedRequest,
    TEISimilarityRequest,
    TEITokenizeRequest,
)
from service.api.tracking import (
    ClientGone,
    RouteMetrics,
    check_dimensions,
    shape_embeddings,
    to_base64,
    unless_client_leaves,
)
from service.engine.engine import Engine
from service.engine.served import ServedModel
from service.errors import ErrorKind, error_response
from service.metrics import TOKENIZE_ROUTE
from service.observability import REQUEST, RequestContext

router = APIRouter()
# Mounted on the main port unless metrics_port gives the metrics a listener of their own (service.metrics).
metrics_router = APIRouter()

try:
    SERVICE_VERSION = version("embedder")
except PackageNotFoundError:  # running from a source tree that was never installed
    SERVICE_VERSION = "0+unknown"

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "a Host header this server does not answer to (allowed_hosts)",
        401: "missing or wrong API key",
        403: "a browser page of an origin not in cors_allow_origins",
        404: "unknown model (the message lists the served ones)",
        408: "the body did not arrive within body_timeout_seconds (plus 1 s per body_min_bytes_per_second)",
        413: "body larger than max_body_bytes",
        415: "a compressed body (Content-Encoding other than identity), or a body not declared JSON",
        422: "invalid input: empty, too many texts, too long, bad dimensions",
        429: "over the admission bound (refused after waiting overload_hold_seconds); retry after Retry-After seconds",
        500: "an unexpected error (the message says only 'internal error'; the log has the traceback)",
        503: "model not ready or server shutting down",
    }.items()
}


def _engine(request: Request) -> Engine:
    return request.app.state.engine


def _tracked(request: Request) -> RouteMetrics:
    return request.app.state.route_metrics


def _context(request: Request) -> RequestContext | None:
    """The request's id, caller and admission ticket (None when the app runs without
    `service.guard.GuardMiddleware`, which also checked the caller's key)."""
    return request.scope.get("state", {}).get(REQUEST)


def _json(payload: Any, headers: dict[str, str]) -> Response:
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json",
                    headers=headers)  # fmt: skip


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


Route = Callable[[Any, Request], Awaitable[Response]]


def _client_may_leave(route: Route) -> Route:
    """An embedding route whose client may close its connection while its texts wait (`unless_client_leaves`): the
    route's tracking counted it, and the answer nobody reads is an empty 499."""

    @functools.wraps(route)
    async def answered(body: Any, request: Request) -> Response:
        try:
            return await route(body, request)
        except ClientGone:
            return Response(status_code=ErrorKind.client_closed.status)

    return answered


@router.post(
    "/v1/embeddings",
    response_model=OpenAIEmbeddingResponse,
    responses=_ERRORS,
    summary="OpenAI-compatible embeddings",
    tags=["embeddings"],
)
@_client_may_leave
async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """Texts longer than the model's max_seq_length are truncated (OpenAI clients have no truncate flag)."""
    engine, context = _engine(request), _context(request)
    async with _tracked(request).track("/v1/embeddings", context) as track:
        model = engine.resolve(body.model)
        track.bind(model)
        check_dimensions(body.dimensions, model.info.dim)
        result = await unless_client_leaves(request.receive, engine.embed(
            model, _as_list(body.input), truncate=True, field_name="input", prompt_name=body.prompt_name,
            context=context,
        ))  # fmt: skip
        model = track.record(result)
        vectors = shape_embeddings(
            result.embeddings, dimensions=body.dimensions, normalize=True,
            already_normalized=model.info.normalized,
        )  # fmt: skip
        encode = to_base64 if body.encoding_format == "base64" else _identity
        payload = {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": encode(row)} for i, row in enumerate(vectors)],
            "model": model.name,
            "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        }
        return _json(payload, track.headers())


def _identity(row: np.ndarray) -> np.ndarray:
    return row


@router.post("/embed", response_model=list[list[float]], responses=_ERRORS, summary="TEI embed", tags=["embeddings"])
@_client_may_leave
async def tei_embed(body: TEIEmbedRequest, request: Request) -> Response:
    return await _tei_embed(body, request, "/embed")


@router.post(
    "/", response_model=list[list[float]], responses=_ERRORS, summary="TEI embed at the root", tags=["embeddings"]
)
@_client_may_leave
async def tei_root(body: TEIEmbedRequest, request: Request) -> Response:
    """What TEI answers on ``POST /`` for an embedding model: the same as ``/embed``. ``huggingface_hub``'s
    ``InferenceClient(base_url=...).feature_extraction(...)`` posts here."""
    return await _tei_embed(body, request, "/")


async def _tei_embed(body: TEIEmbedRequest, request: Request, route: str) -> Response:
    engine, context = _engine(request), _context(request)
    async with _tracked(request).track(route, context) as track:
        model = engine.resolve(body.model)
        track.bind(model)
        check_dimensions(body.dimensions, model.info.dim)
        texts = _as_list(body.inputs)
        result = await unless_client_leaves(request.receive, engine.embed(
            model, texts, truncate=body.truncate, field_name="inputs", prompt_name=body.prompt_name,
            truncation_direction=body.truncation_direction.lower(), context=context,
        ))  # fmt: skip
        model = track.record(result)
        vectors = shape_embeddings(
            result.embeddings, dimensions=body.dimensions, normalize=body.normalize,
            already_normalized=model.info.normalized,
        )  # fmt: skip
        return _json(vectors, track.headers())


@router.post(
    "/similarity", response_model=list[float], responses=_ERRORS, summary="TEI sentence similarity", tags=["embeddings"]
)
@_client_may_leave
async def tei_similarity(body: TEISimilarityRequest, request: Request) -> Response:
    """Cosine similarity of each of ``sentences`` with ``source_sentence``."""
    engine, context = _engine(request), _context(request)
    async with _tracked(request).track("/similarity", context) as track:
        model = engine.resolve(body.model)
        track.bind(model)
        engine.check_texts(body.inputs.sentences, "inputs.sentences")  # the bound counts the sentences alone
        texts = [body.inputs.source_sentence, *body.inputs.sentences]
        names = ["inputs.source_sentence", *(f"inputs.sentences[{i}]" for i in range(len(body.inputs.sentences)))]
        result = await unless_client_leaves(request.receive, engine.embed(
            model, texts, truncate=body.truncate, field_name="inputs", names=names, uncounted=1,
            prompt_name=body.prompt_name,
            truncation_direction=body.truncation_direction.lower(), context=context,
        ))  # fmt: skip
        model = track.record(result)
        unit = shape_embeddings(result.embeddings, dimensions=None, normalize=True, already_normalized=False)
        scores = unit[1:] @ unit[0]
        return _json(scores.astype(np.float32), track.headers())


@router.post(
    TOKENIZE_ROUTE, response_model=list[list[SimpleToken]], responses=_ERRORS, summary="TEI tokenize", tags=["tokens"]
)
async def tei_tokenize(body: TEITokenizeRequest, request: Request) -> Response:
    """Every token of each text after the prompt, none cut: count tokens against the model's ``max_seq_length``
    before sending, or chunk a document at token boundaries."""
    engine, context = _engine(request), _context(request)
    async with _tracked(request).track(TOKENIZE_ROUTE, context) as track:
        model = engine.resolve(body.model)
        track.bind(model)
        result = await engine.tokens(
            model, _as_list(body.inputs), add_special_tokens=body.add_special_tokens, prompt_name=body.prompt_name,
            field_name="inputs", context=context,
        )  # fmt: skip
        track.timings.update(result.timings)
        return _json([[token._asdict() for token in text] for text in result.tokens], track.headers())


_QUANTIZATION = {"int8": "int8", "bf16": "bf16"}  # an engine's precision -> the card's quantization (else none)


def _int8_check(choice: dict[str, Any]) -> dict[str, Any] | None:
    """The int8 graph's trial from the engine choice, with the CPU (what the card showed before engines)."""
    trial = next((t for t in choice.get("trials", []) if t["engine"] == "onnxruntime-int8"), None)
    if trial is None:
        return None
    figures = ("status", "reason", "mean_cosine", "min_cosine")
    return {key: trial[key] for key in figures} | {"cpu": choice["cpu"]}


def _card(model: ServedModel) -> ModelCard:
    manifest = model.info.manifest
    choice = model.info.engine
    return ModelCard(
        id=model.name,
        created=int(model.loaded_at),
        version=model.info.version,
        dim=model.info.dim,
        max_seq_length=model.info.max_seq_length,
        pooling=manifest.get("pooling"),
        normalized=model.info.normalized,
        quantization=_QUANTIZATION.get(choice.get("precision", model.info.variant), "none"),
        engine=choice.get("engine"),
        engine_choice=choice or None,
        int8_check=_int8_check(choice),
        base_model=manifest.get("base_model"),
        method=(manifest.get("method") or {}).get("name"),
        prompts=dict(model.info.prompts.texts),
        default_prompt_name=model.info.prompts.default,
    )


@router.get("/v1/models", response_model=ModelList, responses=_ERRORS, tags=["models"])
async def list_models(request: Request) -> ModelList:
    return ModelList(data=[_card(model) for model in _engine(request).models.models()])


MODEL_ROUTE_PREFIX = "/v1/models/"  # + a served model's name: its card


@router.get(f"{MODEL_ROUTE_PREFIX}{{model}}", response_model=ModelCard, responses=_ERRORS, tags=["models"])
async def retrieve_model(model: str, request: Request) -> ModelCard:
    """One served model's card (OpenAI's ``GET /v1/models/{model}``); 404 names the served models."""
    return _card(_engine(request).models.get(model))


@router.get("/info", response_model=Info, responses=_ERRORS, tags=["models"])
async def info(request: Request) -> Info:
    engine = _engine(request)
    s = engine.settings
    return Info(
        version=SERVICE_VERSION,
        default_model=s.default_model,
        models=[_card(model) for model in engine.models.models()],
        limits=Limits(
            max_client_batch_size=s.max_client_batch_size,
            max_input_chars=s.max_input_chars,
            max_body_bytes=s.max_body_bytes,
            max_batch_tokens=s.max_batch_tokens,
            max_batch_size=s.max_batch_size,
            max_queue_size=s.max_queue_size,
            max_queue_wait_seconds=s.max_queue_wait_seconds,
            queue_wait_min_requests=s.queue_wait_min_requests,
            overload_hold_seconds=s.overload_hold_seconds,
            max_concurrent_requests=s.max_concurrent_requests,
        ),
        auth=request.app.state.keys.client_auth_enabled,
    )


@router.get("/health", tags=["operations"])
async def health() -> dict[str, str]:
    """Liveness: the process answers (no model needed)."""
    return {"status": "ok"}


@router.get("/ready", tags=["operations"], responses={503: {"model": ErrorResponse}})
async def ready(request: Request) -> Response:
    """Readiness: every model loaded and warmed, and not shutting down."""
    models = _engine(request).models
    if models.ready and not request.app.state.draining:
        return _json({"status": "ready", "models": models.names}, {})
    if request.app.state.draining:
        return error_response(ErrorKind.shutting_down, "not ready: shutting down")
    return error_response(ErrorKind.model_not_ready, "not ready: models are loading")


for _probe in (health, ready):  # HEAD on the probes (load balancers' checks send it), kept out of the schema
    router.add_api_route(f"/{_probe.__name__}", _probe, methods=["HEAD"], include_in_schema=False)


@metrics_router.get(
    "/metrics",
    tags=["operations"],
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition format", "content": {"text/plain": {}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus text format (not JSON). Collected in a worker thread: a collector may query the adapt job store
    (`service.adapt.api_state.AdaptCollector`), and a store slow to answer must not hold the event loop every other
    request is served on."""
    return Response(await _collected(request.app.state), media_type=CONTENT_TYPE_LATEST)


def _collected(state: Any) -> Awaitable[bytes]:
    """The exposition of the app's registry, collected in one worker thread at a time: scrapes that arrive while a
    collection runs are answered with its result. That thread is one of the event loop's default executor, which
    tokenises large requests and loads models; a store slow to answer (up to its 30 s timeout) would otherwise hold
    one thread per scrape until every one of them waited on it. Shielded: a scrape whose client left does not cancel
    the collection the others wait for."""
    running: asyncio.Future[bytes] | None = getattr(state, "metrics_collection", None)
    if running is None or running.done():
        running = asyncio.ensure_future(asyncio.to_thread(generate_latest, state.metrics.registry))
        running.add_done_callback(lambda done: done.cancelled() or done.exception())  # retrieved, if no one waits
        state.metrics_collection = running
    return asyncio.shield(running)
