"""What the embedding routes do between parsing and rendering: limits, tokenisation, queueing, metrics.

`EmbeddingService.embed` is shared by ``/v1/embeddings``, ``/embed`` and ``/similarity``; each route
only turns its request shape into a list of texts and the resulting matrix into its response shape.
Every request runs inside `EmbeddingService.track`, which counts it, times it and labels any failure
with its `ErrorKind` code.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np

from service.auth import ANONYMOUS, ApiKeys
from service.engine.admission import AdmissionGate
from service.engine.models import ModelManager, ServedModel
from service.errors import ErrorKind, ServiceError
from service.metrics import NO_MODEL, ServiceMetrics
from service.observability import RequestContext
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

REQUEST = "embed_request"  # key in the ASGI scope's "state": the request's `RequestContext` (guard middleware)
INLINE_TOKENIZE_CHARS = 4096  # smaller requests tokenise on the event loop: a thread hop costs more than the work


@dataclass
class Track:
    """Per-request bookkeeping filled in as the request proceeds."""

    route: str
    started: float
    context: RequestContext | None = None
    model: str = NO_MODEL
    version: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def headers(self) -> dict[str, str]:
        """TEI-style timing headers in milliseconds."""
        total = time.perf_counter() - self.started
        out = {"x-total-time": f"{total * 1000:.3f}"}
        if self.version is not None:
            out["x-model-version"] = self.version
        for key in ("tokenization", "queue", "inference"):
            if key in self.timings:
                out[f"x-{key}-time"] = f"{self.timings[key] * 1000:.3f}"
        return out


@dataclass
class EmbedResult:
    model: ServedModel
    embeddings: np.ndarray  # (n, dim) float32
    tokens: int


class EmbeddingService:
    """Shared state of the embedding routes."""

    def __init__(self, settings: ServiceSettings, models: ModelManager, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.models = models
        self.metrics = metrics
        self.keys = ApiKeys.from_settings(settings)
        metrics.register_keys(self.keys.key_ids())
        self.gate = AdmissionGate(
            self.room, hold_seconds=settings.overload_hold_seconds, max_waiting=settings.max_concurrent_requests
        )
        models.on_room = self.gate.wake

    # ------------------------------------------------------------------------------------ admission
    def room(self, tenant: str = ANONYMOUS) -> ServiceError | None:
        """The gate's question for a request of key ``tenant``, asked before its body is read: None if it may go
        on; else the 429 for ``max_concurrent_requests`` requests in flight, or for every served model over its
        bound for that key (`Batcher.refusal`). Which model a request wants is in its body, so with several models
        only a state that refuses any request is refused here; the rest is checked again once the body names its
        model."""
        limit = self.settings.max_concurrent_requests
        models = self.models.models()
        if self.gate.in_flight >= limit:
            retry = min((m.batcher.retry_after() for m in models), default=1)
            return ServiceError(
                ErrorKind.overloaded,
                f"the server is overloaded: {self.gate.in_flight} requests in flight, limit max_concurrent_requests="
                f"{limit}; retry after the number of seconds in Retry-After",
                headers={"Retry-After": str(retry)},
            )
        refusals = []
        for model in models:
            err = model.batcher.refusal(1, tenant)
            if err is None or err.kind is not ErrorKind.overloaded:
                return None
            refusals.append(err)
        return min(refusals, key=lambda err: int(err.headers["Retry-After"]), default=None)

    # ------------------------------------------------------------------------------------ tracking
    @asynccontextmanager
    async def track(self, route: str, context: RequestContext | None = None) -> AsyncIterator[Track]:
        """Count and time one request from its arrival at the gate (its ``context``'s ticket; now without one: an
        app run without `service.app.GuardMiddleware`); label a failure with its kind (unexpected errors become
        ``internal``)."""
        ticket = context.ticket if context is not None else None
        started = time.perf_counter() if ticket is None else ticket.arrived
        track = Track(route=route, started=started, context=context)
        try:
            yield track
        except ServiceError as err:
            self.count_failure(route, track.model, err.kind)
            raise
        except Exception:
            self.count_failure(route, track.model, ErrorKind.internal)
            raise
        else:
            self.metrics.requests.labels(route, track.model).inc()
            self.metrics.request_duration.labels(route, track.model).observe(time.perf_counter() - track.started)

    def count_failure(self, route: str, model: str, kind: ErrorKind) -> None:
        self.metrics.requests.labels(route, model).inc()
        self.metrics.failures.labels(route, model, kind.code).inc()

    # ------------------------------------------------------------------------------------ embedding
    def resolve(self, track: Track, model_name: str | None) -> ServedModel:
        model = self.models.get(model_name)
        track.model = model.name
        track.version = model.info.version
        return model

    def check_texts(self, texts: list[str], field_name: str) -> None:
        """Per-request limits, checked before any tokenisation or queueing."""
        if not texts:
            raise ServiceError(ErrorKind.invalid_request, f"{field_name} is empty: send at least one text")
        limit = self.settings.max_client_batch_size
        if len(texts) > limit:
            raise ServiceError(
                ErrorKind.invalid_request,
                f"{field_name} has {len(texts)} texts, more than max_client_batch_size={limit}; split the request",
            )
        max_chars = self.settings.max_input_chars
        for index, text in enumerate(texts):
            if not text:
                raise ServiceError(
                    ErrorKind.invalid_request, f"{field_name}[{index}] is an empty string: every text needs content"
                )
            if len(text) > max_chars:
                raise ServiceError(
                    ErrorKind.invalid_request,
                    f"{field_name}[{index}] has {len(text)} characters, more than max_input_chars={max_chars}",
                )

    async def embed(
        self, track: Track, model: ServedModel, texts: list[str], *, truncate: bool, field_name: str
    ) -> EmbedResult:
        """Tokenise, queue and await the embeddings of ``texts`` (limits already checked)."""
        backend = model.backend
        context = track.context
        ticket = context.ticket if context is not None else None
        tenant = ticket.tenant if ticket is not None else ANONYMOUS
        model.batcher.check_admission(len(texts), tenant)  # again in submit; here a flood's 429s cost no tokenising
        started = time.perf_counter()
        if sum(map(len, texts)) <= INLINE_TOKENIZE_CHARS:
            tokens = backend.tokenize(texts)
        else:
            tokens = await asyncio.to_thread(backend.tokenize, texts)
        tokenized = time.perf_counter()
        track.timings["tokenization"] = tokenized - started
        self.metrics.tokenization_time.labels(model.name).observe(track.timings["tokenization"])
        if not truncate:
            for index, item in enumerate(tokens):
                if item.truncated:
                    count = await asyncio.to_thread(backend.count_tokens, texts[index])
                    limit = backend.info.max_seq_length
                    raise ServiceError(
                        ErrorKind.input_too_long,
                        f"{field_name}[{index}] has {count} tokens, more than model {model.name!r} accepts "
                        f"({limit}); shorten it or send truncate=true",
                    )
        job = model.batcher.submit(tokens, tenant)
        if ticket is not None:
            ticket.queued()
        await job.future
        if context is not None:
            context.stage("tokenization", started, tokenized)
            context.stage("queue", job.enqueued_at, job.started_at)
            context.stage("batch", job.started_at, job.finished_at)
        track.timings["queue"] = job.queue_time
        track.timings["inference"] = job.inference_time
        n_tokens = 0
        input_length = self.metrics.input_length.labels(model.name)
        for item in tokens:
            n_tokens += item.n_tokens
            input_length.observe(item.n_tokens)
        self.metrics.queue_time.labels(model.name).observe(job.queue_time)
        self.metrics.tokens.labels(model.name).inc(n_tokens)
        self.metrics.embeddings.labels(model.name).inc(len(tokens))
        return EmbedResult(model=model, embeddings=job.out, tokens=n_tokens)


def shape_embeddings(
    embeddings: np.ndarray, *, dimensions: int | None, normalize: bool, already_normalized: bool
) -> np.ndarray:
    """Matryoshka truncation to ``dimensions`` and (re-)normalisation. Bundles usually normalise in the graph,
    so only truncation forces a new normalisation."""
    dim = embeddings.shape[1]
    if dimensions is not None:
        if dimensions > dim:
            raise ServiceError(
                ErrorKind.invalid_request, f"dimensions={dimensions} exceeds the model's {dim}; send at most {dim}"
            )
        if dimensions < dim:
            embeddings = embeddings[:, :dimensions]
            already_normalized = False
    if normalize and not already_normalized:
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(embeddings, dtype=np.float32)


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 format: the raw little-endian float32 bytes."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
