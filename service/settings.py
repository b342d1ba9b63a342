"""The service's one typed configuration object (``EMBED_`` environment variables).

Every field is also a flag of ``embedder serve`` (``--max-batch-tokens`` for ``max_batch_tokens``)
and a key of the Helm chart's ConfigMap (``EMBED_MAX_BATCH_TOKENS``); the descriptions below are
the help text, so each one says what the knob trades off. The /adapt settings are their own object,
`adapt_jobs.settings.AdaptSettings`, nested as ``adapt`` (``EMBED_ADAPT_MAX_STEPS``, ``--adapt-max-steps``, the chart's
``config.adapt_max_steps``). Keep the field names stable: the chart and its test map them one to one. No other
service module reads ``os.environ``.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from adapt_jobs.settings import AdaptSettings
from core.settings import DEFAULT_CACHE_DIR, DEFAULT_REGISTRY_DIR, split_csv

DEFAULT_MODEL = "minilm-l6"  # the built-in model served when the settings name none
ADAPT_PREFIX = "adapt_"  # flat names of the nested adapt settings: adapt_max_steps is EMBED_ADAPT_MAX_STEPS


class ServiceSettings(BaseSettings):
    """Settings of ``embedder serve`` (one object per process, built once, passed to ``create_app``)."""

    model_config = SettingsConfigDict(env_prefix="EMBED_", extra="ignore", frozen=True)

    # --- network -------------------------------------------------------------------------------
    host: str = Field(
        default="127.0.0.1",
        description="Interface to bind. 127.0.0.1 keeps the server private to this machine; 0.0.0.0 "
        "exposes it (needed in a container). Any interface but loopback needs admin_api_keys while /adapt is on "
        "(the server refuses to start otherwise); whether embedding needs api_keys is yours to choose.",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port to listen on (0 = any free port).")
    metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Serve /metrics on this port of the same interface instead of the main one (0 = on the main "
        "port, as /metrics; set: the main port answers 404 there). Lets a network policy open the metrics to the "
        "scraper without opening the API to it.",
    )

    # --- models ----------------------------------------------------------------------------------
    registry_dir: Path = Field(
        default=DEFAULT_REGISTRY_DIR,
        description="Root of the bundle registry (<registry>/<name>/<version>/, <name>/current). Shared with "
        "`embedder export` and the adapt worker; a shared volume when several replicas serve it.",
    )
    cache_dir: Path = Field(
        default=DEFAULT_CACHE_DIR,
        description="Where built-in models are unpacked when the default bundle has to be created on first "
        "start (a few hundred MB with mpnet-base; only the export subprocess uses it).",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Names of promoted bundles to serve (comma-separated), or Hugging Face model folders (a path: "
        "served under the folder's name, exported at start when the registry has no bundle of that name made from "
        "the folder's current files: weights, configs, tokenizer, modules). Empty = every promoted model in the "
        "registry, including ones promoted later; a fixed list bounds memory but ignores new names.",
    )
    default_model: str = Field(
        default=DEFAULT_MODEL,
        description="Model used when a request names none; unset, minilm-l6, or the first of models when they "
        "leave it out. Created from the built-in model of that name on first start if the registry has no promoted "
        "model at all (a built-in name in models is created likewise).",
    )
    registry_poll_seconds: float = Field(
        default=2.0,
        ge=0.0,
        description="How often the registry is checked for newly promoted versions (0 = never). Shorter "
        "picks up new models sooner at the cost of a few stat() calls per model per poll.",
    )

    serve_int8: bool = Field(
        default=True,
        description="Let the engine choice serve a bundle's int8 graphs (onnxruntime's, OpenVINO's) where they keep "
        "the parity bars (cosine to fp32 ≥ 0.99 mean, 0.97 min on the bundle's probes) on this CPU, checked at load "
        "(shown in /v1/models and embed_model_int8). Off: no int8 graph is served; the choice is among the other "
        "engines.",
    )
    engine: Literal[
        "auto", "onnxruntime-int8", "openvino-bf16", "openvino-int8", "openvino-f32", "onnxruntime-fp32"
    ] = Field(
        default="auto",
        description="Which engine runs each model. Default auto: at load, every candidate (onnxruntime int8 and fp32, "
        "OpenVINO bf16 where the CPU has bf16 units, OpenVINO int8 where the bundle has its graph, OpenVINO f32) is "
        "checked against the bundle's fp32 reference embeddings on this CPU and the passing ones timed on batches of "
        "1 (after idle), 4, 16, 32 short, 4 long texts; the served batches nearest each of these (texts and padded "
        "length) run on onnxruntime int8 unless another engine is 1.15x faster on it (1.3x on 1-16 texts), so close "
        "candidates leave int8 in place (on a Xeon with AMX, OpenVINO bf16 or int8 took the long batches, 1.4-2.3x "
        "faster there, OpenVINO int8 16-64 short texts, int8 one and four texts; on an AVX2-only EPYC, int8 every "
        "batch size; on an EPYC with AVX-512 VNNI, OpenVINO "
        "int8 the larger batches; docs/BENCHMARKS.md). A text alone may thus be embedded by another engine than "
        "inside a large batch, both within the parity bars. The first load of a model takes longer and more memory "
        "(minilm-l6: 14-23 s and about 1.05 GiB at peak on a busy 2-core Xeon, against about 1 s pinned); a later "
        "version of the same architecture (a new /adapt version found by the registry poll) reuses that process's "
        "timings and checks only the engines they chose (about 2 s). A name pins that engine (still parity-checked: "
        "fp32 on onnxruntime where it misses); onnxruntime-int8 is the int8 graph where it keeps the bars, else fp32. "
        "/v1/models (engine_choice.routes), embed_model_engine and embed_model_engine_route say which engine runs "
        "which batches and why.",
    )

    # --- onnxruntime threads -----------------------------------------------------------------------
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="Threads one inference may use (0 = number of CPU cores). More cuts latency of large "
        "batches but competes with the event loop and other models on a shared machine.",
    )
    inter_op_threads: int = Field(
        default=1,
        ge=1,
        description="Threads running independent graph nodes in parallel. 1 suits these sequential encoder "
        "graphs; more only adds contention.",
    )
    ort_spinning: Literal["never", "during-runs", "always"] = Field(  # core.runtime.SPINNING
        default="during-runs",
        description="What onnxruntime's idle intra-op threads do. during-runs (default): busy-wait while a batch "
        "runs, so its operators do not wake them one by one, and sleep once it returns, leaving the cores to the "
        "event loop between batches; never: sleep at once; always: busy-wait between batches too, which takes the "
        "core the event loop needs on a small machine. On a 2-core AVX2 EPYC, during-runs served one short text "
        "1.1-1.7 ms sooner than never (p50 5.1-5.9 against 6.3-7.5 ms) at the same concurrent throughput "
        "(1.02-1.09x); always had made an idle short text's p50 15 against 9-10 ms (docs/BENCHMARKS.md).",
    )

    # --- batching --------------------------------------------------------------------------------
    max_batch_tokens: int = Field(
        default=4096,
        ge=1,
        description="Token budget of one forward pass (sum of padded lengths): about 20 paragraphs of 200 tokens, "
        "while short texts still fill max_batch_size. On CPU a batch of 20 long texts runs about as fast per text as "
        "one of 64, and the queue's length-sorted window cut into smaller batches pads far less, so long texts are "
        "served faster than with TEI's 16384 (docs/BENCHMARKS.md, Peers). Larger: fewer, longer forward passes, more "
        "padding and memory. At least every served model's max_seq_length (one text alone is a batch of that "
        "many tokens): a model longer than it is refused at start, or not loaded when promoted later, naming both.",
    )
    max_batch_size: int = Field(
        default=64,
        ge=1,
        description="Most texts in one forward pass, whatever their length. Caps latency for short texts "
        "under load; too small wastes throughput.",
    )

    # --- admission and limits ----------------------------------------------------------------------
    max_client_batch_size: int = Field(
        default=512,
        ge=1,
        description="Most inputs one request may carry (422 above). Bigger lets clients send fewer requests "
        "but lets one client hold the queue longer.",
    )
    max_input_chars: int = Field(
        default=100_000,
        ge=1,
        description="Longest accepted input in characters (422 above), checked before tokenising so huge "
        "strings cannot stall the tokenizer. Texts are truncated to the model's max_seq_length anyway.",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Largest accepted request body in bytes (413 above); bounds memory spent on one request "
        "before any validation runs.",
    )
    max_queue_size: int = Field(
        default=4096,
        ge=1,
        description="Most texts waiting per model before new requests get 429 with Retry-After. Smaller "
        "sheds load sooner (bounded latency); larger absorbs bursts but lets queueing delay grow.",
    )
    max_queue_wait_seconds: float = Field(
        default=2.0,
        ge=0.0,
        description="Longest estimated wait (the tokens queued ahead over the recent tokens/s) before new "
        "requests get 429 with Retry-After, once at least queue_wait_min_requests requests are queued ahead (0 = "
        "off: max_queue_size alone). Bounds the latency of accepted requests under a flood; lower sheds more of a "
        "burst, higher lets accepted requests wait longer.",
    )
    queue_wait_min_requests: int = Field(
        default=16,
        ge=1,
        description="Requests a model's queue may hold before max_queue_wait_seconds applies: up to this many "
        "concurrent clients are never refused by the wait bound, however large their requests and however slow the "
        "CPU (each waits behind at most this many requests of the others). Higher serves more bulk clients whole; "
        "lower bounds latency sooner when requests are large.",
    )
    overload_hold_seconds: float = Field(
        default=1.0,
        ge=0.0,
        description="How long a request that finds the server over its bound waits, body unread, for room before "
        "it is refused with 429 (0 = refuse at once). Waiting requests are let in in arrival order the moment there "
        "is room. Longer: fewer refusals, and a client that retries a 429 at once costs at most one refusal per "
        "hold, so a retry storm cannot take the CPU from inference; shorter: a refused client hears sooner that it "
        "should go elsewhere.",
    )
    max_concurrent_requests: int = Field(
        default=512,
        ge=1,
        description="Embedding requests the server handles at once, all models together (TEI's flag of the same "
        "name and default); more wait at the gate like any request over the bound (at most this many wait; beyond "
        "that 429 at once). Bounds the memory held by requests in flight; the per-model bounds usually hold a "
        "flood back first.",
    )

    # --- auth ------------------------------------------------------------------------------------
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Accepted bearer tokens for the embedding routes (comma-separated). Empty = open "
        "server (a warning is logged at start). Compared in constant time; never logged.",
    )
    admin_api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Bearer tokens for administrative routes (/adapt); they also work on the embedding routes. "
        "Empty = /adapt answers 403 to client keys (unless EMBED_ADAPT_ALLOW_CLIENT_KEYS), and is open only when no "
        "api_keys are set either — on loopback only: bound elsewhere, the server refuses to start without a key that "
        "may use /adapt.",
    )

    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins whose web pages may call the API from a browser (comma-separated, e.g. "
        "https://app.example.com; * for any): answered with CORS headers, preflight included. Empty = no CORS "
        "headers, so browsers keep pages of other origins from reading any response. Keys are still checked.",
    )

    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names a request's Host header may carry besides this machine's own (localhost, "
        "127.0.0.1, ::1, *.localhost); comma-separated, * for any. Empty = this machine's names only while the "
        "server is bound to loopback, any name otherwise. Other names are answered 400, so a web page whose own "
        "name was made to resolve to 127.0.0.1 (DNS rebinding) cannot use a loopback server as its own origin; "
        "behind a proxy that keeps the client's Host, list the names it serves. /health, /ready and /metrics "
        "answer any name (probes call the pod by its address).",
    )

    body_timeout_seconds: float = Field(
        default=10.0,
        gt=0.0,
        description="How long a request's body may take to arrive, plus 1 s per body_min_bytes_per_second received "
        "(Apache mod_reqtimeout's rule); slower, it is answered 408 and its admission slot freed. Bounds how long a "
        "client that sends slowly holds capacity; raise it for clients on slow links.",
    )
    body_min_bytes_per_second: int = Field(
        default=65536,
        ge=1,
        description="The pace that earns a body more time than body_timeout_seconds: each this many bytes received "
        "add one second (64 KiB/s: a 50 MB /adapt upload may take 13 minutes). Lower admits slower links; higher "
        "frees slots held by slow senders sooner.",
    )

    # --- operations ------------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Log verbosity. debug logs every batch (size, tokens, timings) and costs throughput.",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text: one readable line per record; json: one JSON object per line (time, level, logger, "
        "message, request_id, key_id) for a log pipeline. Either way a record written while a request is handled "
        "carries its request id and the caller's key id (a short hash, never the key).",
    )
    access_log: bool = Field(
        default=False,
        description="Log one line per request (method, path, status, milliseconds, with its request id and key "
        "id). Off by default: at thousands of small requests a second the lines cost CPU the model could use.",
    )
    otel_exporter_otlp_endpoint: str = Field(
        default="",
        description="OpenTelemetry collector to send traces to over OTLP/HTTP (e.g. http://otel-collector:4318; "
        "also read from OTEL_EXPORTER_OTLP_ENDPOINT). Set: each embedding request is a trace with spans for "
        "admission, tokenization, queue, batch and response. Empty: no tracing, no cost.",
    )
    warmup: bool = Field(
        default=True,
        description="Run a few forward passes per model before /ready turns true, so the first real request "
        "is not slowed by onnxruntime's lazy initialisation. Off only for fast tests.",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        ge=0.0,
        description="How long in-flight requests may take to finish on shutdown; new requests get 503 meanwhile.",
    )

    # --- /adapt (domain-adaptation jobs; EMBED_ADAPT_*, see docs/ADAPT.md) ---------------------------
    adapt: AdaptSettings = Field(
        default_factory=AdaptSettings,
        description="The /adapt job queue, its workers and each job's defaults: AdaptSettings, read "
        "from EMBED_ADAPT_* (one flag per field: --adapt-<field>).",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_among_models(cls, values: Any) -> Any:
        """Told which models to serve and not which is the default, a server whose list leaves out minilm-l6
        defaults to the first of them (``embedder serve --models minilm-l3`` needs no second flag)."""
        if isinstance(values, dict) and not values.get("default_model"):
            models = split_csv(values.get("models") or [])
            if isinstance(models, list) and models and DEFAULT_MODEL not in models:
                values = {**values, "default_model": models[0]}
        return values

    @model_validator(mode="before")
    @classmethod
    def _otel_standard_variable(cls, values: Any) -> Any:
        """OpenTelemetry's own variable counts too (what collectors' docs and operators set), unless
        EMBED_OTEL_EXPORTER_OTLP_ENDPOINT or the flag says otherwise."""
        if isinstance(values, dict) and not values.get("otel_exporter_otlp_endpoint"):  # unset or "" (the chart's)
            values = {**values, "otel_exporter_otlp_endpoint": os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")}
        return values

    @field_validator("models", "api_keys", "admin_api_keys", "cors_allow_origins", "allowed_hosts", mode="before")
    @classmethod
    def _lists_from_csv(cls, value: object) -> object:
        return split_csv(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_limits(self) -> ServiceSettings:
        if self.max_batch_size > self.max_batch_tokens:
            raise ValueError(
                f"max_batch_size ({self.max_batch_size}) exceeds max_batch_tokens ({self.max_batch_tokens}); "
                "raise max_batch_tokens or lower max_batch_size"
            )
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(
                f"metrics_port ({self.metrics_port}) equals port: give /metrics its own port, or 0 to serve it on "
                "the main port"
            )
        if self.max_client_batch_size > self.max_queue_size:
            raise ValueError(
                f"max_client_batch_size ({self.max_client_batch_size}) exceeds max_queue_size "
                f"({self.max_queue_size}): such a request could never be queued; raise max_queue_size"
            )
        return self

    @classmethod
    def flat_fields(cls) -> dict[str, FieldInfo]:
        """Every setting under its flat name — the flag (``--adapt-max-steps``), the environment variable without
        its prefix (``EMBED_ADAPT_MAX_STEPS``) and the chart's ``config`` key: the service's own fields, then
        ``adapt_<field>`` for each field of the nested `AdaptSettings`."""
        flat = {name: field for name, field in cls.model_fields.items() if name != "adapt"}
        flat.update({f"{ADAPT_PREFIX}{name}": field for name, field in AdaptSettings.model_fields.items()})
        return flat

    @classmethod
    def from_flat(cls, **values: Any) -> ServiceSettings:
        """Settings from flat names (see `flat_fields`) over the environment, e.g. ``from_flat(port=0,
        adapt_max_steps=5)``."""
        unknown = sorted(set(values) - set(cls.flat_fields()))
        if unknown:
            raise ValueError(f"unknown settings {unknown}: see `embedder serve --help`")
        adapt = {k.removeprefix(ADAPT_PREFIX): v for k, v in values.items() if k.startswith(ADAPT_PREFIX)}
        service = {k: v for k, v in values.items() if not k.startswith(ADAPT_PREFIX)}
        if adapt:
            service["adapt"] = AdaptSettings(**adapt)
        return cls(**service)

    def open_adapt_error(self) -> str | None:
        """Why this server must not start, or None: bound to an interface other hosts reach, with /adapt on and no
        key that may use it. /adapt trains for minutes and publishes into the shared registry; anyone who reaches
        the port could do both. On loopback (``scripts/serve.sh``) a keyless server is one user's own."""
        if not self.adapt.enabled or is_loopback(self.host):
            return None
        if self.admin_api_keys or (self.adapt.allow_client_keys and self.api_keys):
            return None
        return (
            f"refusing to serve /adapt on {self.host} with no key that may use it: anyone who reaches the port could "
            "start training jobs and publish models. Set EMBED_ADMIN_API_KEYS (--admin-api-keys) to the admin keys "
            "for /adapt, or EMBED_ADAPT_ENABLED=false (--no-adapt-enabled) to serve embeddings only, or bind "
            "127.0.0.1 (EMBED_HOST)"
        )

    def api_key_values(self) -> list[str]:
        """Plain key values for the auth check (kept out of repr and logs by SecretStr)."""
        return [key.get_secret_value() for key in self.api_keys]

    def admin_key_values(self) -> list[str]:
        """Keys for admin routes (no fallback to the client keys: see ``AdaptSettings.allow_client_keys``)."""
        return [key.get_secret_value() for key in self.admin_api_keys]


    def host_names(self) -> frozenset[str] | None:
        """The names `allowed_hosts` lets a Host header carry, lower-cased (None: any)."""
        names = {name.strip().lower().strip("[]") for name in self.allowed_hosts}
        if "*" in names or (not names and not is_loopback(self.host)):
            return None
        return LOOPBACK_NAMES | names


# and every *.localhost, which RFC 6761 keeps on this machine
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only: ``localhost``, 127.0.0.0/8 or ::1 (``[::1]`` too)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False
