"""The API layer's bookkeeping of a request and the shaping of its answer: every embedding request runs inside
`RouteMetrics.track`, which counts it, times it and labels any failure with its `ErrorKind` code; the engine
(`service.engine.engine.Engine`) does the work in between; `shape_embeddings` and `to_base64` turn the matrix into
the response's shape.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from service.engine.engine import EmbedResult
from service.engine.served import ServedModel
from service.errors import ErrorKind, ServiceError
from service.metrics import NO_MODEL, ServiceMetrics, failure_outcome
from service.observability import RequestContext

log = logging.getLogger(__name__)

T = TypeVar("T")
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

class ClientGone(Exception):
    """The client closed its connection before its answer was ready: counted as `ErrorKind.client_closed`, answered
    with its status and no body (nobody reads it)."""


async def unless_client_leaves(receive: Receive, work: Coroutine[Any, Any, T]) -> T:
    """``work``'s result, or `ClientGone` once the client disconnects first — ``work`` is then cancelled, so texts
    still queued leave the queue unembedded (as TEI and infinity drop them). ``receive`` is the request's, its body
    already read: all it can still give is the disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and watcher.exception() is None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise ClientGone
        return await task
    finally:
        for pending in (task, watcher):
            pending.cancel()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass
class Track:
    """Per-request bookkeeping filled in as the request proceeds."""

    route: str
    started: float
    context: RequestContext | None = None
    model: str = NO_MODEL
    version: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def bind(self, model: ServedModel) -> None:
        """The request's model is known: its series are labelled with it, its version goes in the headers."""
        self.model = model.name
        self.version = model.info.version

    def record(self, result: EmbedResult) -> ServedModel:
        """The request's texts were embedded: their timings, and the version that embedded them (a newer one than
        `bind` saw when the model was promoted meanwhile), which the route then shapes the answer with."""
        self.timings.update(result.timings)
        self.bind(result.model)
        return result.model

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


class RouteMetrics:
    """The API layer's own series: requests, failures (by `ErrorKind`) and durations, by route and model."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    # ------------------------------------------------------------------------------------ tracking
    @asynccontextmanager
    async def track(self, route: str, context: RequestContext | None = None) -> AsyncIterator[Track]:
        """Count and time one request from its arrival (at the admission: its ``context``'s ticket; else at the guard,
        /tokenize's; now without a context: an app run without `service.guard.GuardMiddleware`); label a failure with
        its kind (unexpected errors become ``internal``) and time it too."""
        ticket = context.ticket if context is not None else None
        if ticket is not None:
            started = ticket.arrived
        else:
            started = context.started if context is not None else time.perf_counter()
        track = Track(route=route, started=started, context=context)
        try:
            yield track
        except ServiceError as err:
            self.count_failure(route, track.model, err.kind, track.started)
            raise
        except ClientGone:
            self.count_failure(route, track.model, ErrorKind.client_closed, track.started)
            raise
        except Exception:
            self.count_failure(route, track.model, ErrorKind.internal, track.started)
            raise
        else:
            self.metrics.requests.labels(route, track.model).inc()
            self.metrics.request_duration.labels(route, track.model).observe(time.perf_counter() - track.started)

    def count_failure(self, route: str, model: str, kind: ErrorKind, started: float | None) -> None:
        """Count a request of an embedding route or /tokenize that failed with ``kind``, and how long it took since it
        arrived at ``started`` (perf_counter(); None: unknown, not timed) under its outcome (`failure_outcome`)."""
        self.metrics.requests.labels(route, model).inc()
        self.metrics.failures.labels(route, model, kind.code).inc()
        if started is not None:
            self.metrics.failure_duration.labels(route, failure_outcome(kind)).observe(time.perf_counter() - started)


def check_dimensions(dimensions: int | None, dim: int) -> None:
    """422 for a Matryoshka ``dimensions`` wider than the model's ``dim`` (asked before any text is embedded)."""
    if dimensions is not None and dimensions > dim:
        raise ServiceError(
            ErrorKind.invalid_request, f"dimensions={dimensions} exceeds the model's {dim}; send at most {dim}"
        )


def shape_embeddings(
    embeddings: np.ndarray, *, dimensions: int | None, normalize: bool, already_normalized: bool
) -> np.ndarray:
    """Matryoshka truncation to ``dimensions`` and (re-)normalisation. Bundles usually normalise in the graph,
    so only truncation forces a new normalisation."""
    dim = embeddings.shape[1]
    check_dimensions(dimensions, dim)
    if dimensions is not None and dimensions < dim:
        embeddings = embeddings[:, :dimensions]
        already_normalized = False
    if normalize and not already_normalized:
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        embeddings = embeddings / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(embeddings, dtype=np.float32)


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 format: the raw little-endian float32 bytes."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
