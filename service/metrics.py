"""Prometheus metrics of one app instance, pre-registered so every series exists before the first request.

Each app gets its own `CollectorRegistry` (tests build several apps in one process). Label sets:
``route`` is the route template (``unmatched`` for a path no route has), ``model`` the served model name (``-``
before a model is resolved, so unknown names sent by clients cannot blow up the series count), ``error_type`` an
`ErrorKind` code, ``outcome`` the class of a failed request's answer (`failure_outcome`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from service.errors import ErrorKind

EMBEDDING_ROUTES = ("/v1/embeddings", "/embed", "/", "/similarity")  # "/" is TEI's root alias of /embed
TOKENIZE_ROUTE = "/tokenize"  # counted and timed like them; no admission (it runs no graph)
NO_MODEL = "-"
UNMATCHED = "unmatched"  # the route of a request whose path no route of the app has: made-up paths add no series
# The app's other routes, as declared: their failures are counted too (model "-"), by the guard (service.guard).
OTHER_ROUTES = (
    "/v1/models", "/v1/models/{model}", "/info", "/health", "/ready", "/metrics", "/openapi.json", "/docs",
    "/docs/oauth2-redirect", "/redoc", UNMATCHED,
)  # fmt: skip

# Seconds: fine where an idle request lands (ms), and to a minute for bulk requests that wait their turn under load.
_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0,
    20.0, 30.0, 60.0,
)  # fmt: skip
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# Tokens, powers of two: a batch's padded tokens, and a text's length — common limits (128 to 8192 tokens, up to
# 32768 for long-context models; any Hugging Face folder may be served) fall on a bucket's bound, so the texts a model
# cut at its max_seq_length are all in that bucket and none is lost in +Inf.
_TOKEN_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

# How a failed request ended, by its answer's status: a bounded label for the failures' latency, so the time a 429 was
# held or a request ran before its 503, 500 or 499 shows apart from the quick refusals of bad requests.
FAILURE_OUTCOMES = ("client_error", "overloaded", "client_closed", "unavailable", "server_error")
_OUTCOME_BY_STATUS = {429: "overloaded", 499: "client_closed", 503: "unavailable"}


def failure_outcome(kind: ErrorKind) -> str:
    """The ``outcome`` label of a request that failed with ``kind``: ``overloaded`` (429), ``client_closed`` (499),
    ``unavailable`` (503), ``server_error`` (any other 5xx), ``client_error`` (any other 4xx)."""
    return _OUTCOME_BY_STATUS.get(kind.status, "server_error" if kind.status >= 500 else "client_error")


class ServiceMetrics:
    """All series of the service (names follow Prometheus conventions: seconds, ``_total`` counters)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "embed_requests", "Requests received, by route and model.", ["route", "model"], registry=r
        )
        self.failures = Counter(
            "embed_request_failures",
            "Requests that ended in an error, by route, model and error type (ErrorKind code).",
            ["route", "model", "error_type"],
            registry=r,
        )
        self.request_duration = Histogram(
            "embed_request_duration_seconds",
            "Time from the request's arrival to the response body being ready, of requests that succeeded.",
            ["route", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.failure_duration = Histogram(
            "embed_request_failure_duration_seconds",
            "Time from the request's arrival to its error being answered (a 429's hold, a request's run before its "
            "503, 500 or 499), by route and outcome (the answer's status class).",
            ["route", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.admission_wait = Histogram(
            "embed_admission_wait_seconds",
            "Time an admitted request waited at the admission, body unread, for room (0 for most).",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "embed_queue_seconds",
            "Wait from enqueue until the request's last batch started.",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokenization_time = Histogram(
            "embed_tokenization_seconds",
            "Tokenisation time per request (embedding routes and /tokenize).",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_time = Histogram(
            "embed_inference_seconds",
            "Forward-pass time per batch (padding included).",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "embed_batch_size", "Texts per forward pass.", ["model"], buckets=_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "embed_batch_tokens",
            "Padded tokens per forward pass (what max_batch_tokens bounds).",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.input_length = Histogram(
            "embed_input_length_tokens",
            "Tokens per input text after truncation.",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.tokenize_length = Histogram(
            "embed_tokenize_input_length_tokens",
            "Tokens per text of a /tokenize request (every token, none cut: it may exceed the model's limit).",
            ["model"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("embed_queue_depth", "Texts waiting for a batch.", ["model"], registry=r)
        self.models_loaded = Gauge("embed_models_loaded", "Models loaded and warmed.", registry=r)
        self.model_int8 = Gauge(
            "embed_model_int8",
            "1 if the model's largest batches run an int8 graph (onnxruntime's or OpenVINO's; it passed the probe "
            "check on this CPU), else 0.",
            ["model"],
            registry=r,
        )
        self.admissions = Counter(
            "embed_admissions",
            "Embedding requests at the admission by caller (key id, or 'anonymous') and outcome (admitted, or "
            "refused with 429): how the capacity was shared between keys under overload.",
            ["key_id", "outcome"],
            registry=r,
        )
        self.model_engine = Gauge(
            "embed_model_engine",
            "1 for the engine and precision serving the model's largest batches (chosen at load on this CPU, or "
            "pinned; /v1/models says why).",
            ["model", "engine", "precision"],
            registry=r,
        )
        self.model_engine_route = Gauge(
            "embed_model_engine_route",
            "1 for each engine serving the model and the timing batches (texts x padded length) whose nearest "
            "batches it runs: shapes 'all' for a lone engine (chosen at load on this CPU, per batch shape; "
            "/v1/models engine_choice.routes says why).",
            ["model", "engine", "precision", "shapes"],
            registry=r,
        )
        self.tokens = Counter("embed_tokens", "Tokens embedded.", ["model"], registry=r)
        self.embeddings = Counter("embed_embeddings", "Embeddings returned.", ["model"], registry=r)
        self._routes: list[tuple[re.Pattern[str], str]] = []
        for route in (*EMBEDDING_ROUTES, TOKENIZE_ROUTE):
            for outcome in FAILURE_OUTCOMES:
                self.failure_duration.labels(route, outcome)
        self.register_model(NO_MODEL)
        self.register_routes(OTHER_ROUTES)

    def register_routes(self, routes: Iterable[str]) -> None:
        """Create the failure series of routes other than the embedding routes and /tokenize at zero, for every
        error kind (model ``-``: they serve no model); `route_of` then knows their paths."""
        for route in routes:
            for kind in ErrorKind:
                self.failures.labels(route, NO_MODEL, kind.code)
            if route != UNMATCHED:  # a {param} of the template: one path segment
                pattern = "[^/]+".join(re.escape(part) for part in re.split(r"\{[^/}]*\}", route))
                self._routes.append((re.compile(pattern), route))

    def route_of(self, path: str) -> str:
        """The registered route whose template ``path`` fits (``/adapt/{job_id}`` for ``/adapt/j1``), or `UNMATCHED`:
        the label of a request refused before the app routed it."""
        return next((route for pattern, route in self._routes if pattern.fullmatch(path)), UNMATCHED)

    def register_keys(self, key_ids: Iterable[str]) -> None:
        """Create the per-key series at zero for every configured key (and 'anonymous')."""
        for key in key_ids:
            for outcome in ("admitted", "refused"):
                self.admissions.labels(key, outcome)

    def register_model(self, model: str) -> None:
        """Create every labelled series of ``model`` at zero (Prometheus shows a series only once it exists)."""
        for route in (*EMBEDDING_ROUTES, TOKENIZE_ROUTE):
            if model == NO_MODEL and route != TOKENIZE_ROUTE:
                self.admission_wait.labels(route)
            self.requests.labels(route, model)
            self.request_duration.labels(route, model)
            for kind in ErrorKind:
                self.failures.labels(route, model, kind.code)
        if model == NO_MODEL:
            return
        for histogram in (
            self.queue_time,
            self.tokenization_time,
            self.inference_time,
            self.batch_size,
            self.batch_tokens,
            self.input_length,
            self.tokenize_length,
        ):
            histogram.labels(model)
        self.queue_depth.labels(model)
        self.tokens.labels(model)
        self.embeddings.labels(model)


class MetricsListener:
    """``/metrics`` on a port of its own (``metrics_port``), so a network policy can open the metrics to the scraper
    without opening the API to it.

    prometheus_client's own exposition server: a small WSGI server in a daemon thread, serving the app's registry
    with the library's content negotiation (text or OpenMetrics, gzip). No second uvicorn: two uvicorn servers in one
    process would fight over the exit signals, and a thread of its own keeps scrapes off the request path's event
    loop — they answer while the server loads models and while it drains, as /metrics on the main port does."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)

    def stop(self) -> None:
        if self._server is None or self._thread is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None
