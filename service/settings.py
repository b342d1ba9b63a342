"""The service's one typed configuration object (``EMBED_`` environment variables).

Every field is also a flag of ``embedder serve`` (``--max-batch-tokens`` for ``max_batch_tokens``)
and a key of the Helm chart's ConfigMap (``EMBED_MAX_BATCH_TOKENS``); the descriptions below are
the help text, so each one says what the knob trades off. Keep the field names stable: the chart
and its test map them one to one. No other service module reads ``os.environ``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from adapt.spec import DEFAULT_GENERAL_TASKS


def _default_cache_dir() -> Path:
    return Path.home() / ".cache" / "embedder"


def _split_csv(value: object) -> object:
    """Environment variables hold lists as ``a,b,c`` (JSON lists are accepted too)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


class ServiceSettings(BaseSettings):
    """Settings of ``embedder serve`` (one object per process, built once, passed to ``create_app``)."""

    model_config = SettingsConfigDict(env_prefix="EMBED_", extra="ignore", frozen=True)

    # --- network -------------------------------------------------------------------------------
    host: str = Field(
        default="127.0.0.1",
        description="Interface to bind. 127.0.0.1 keeps the server private to this machine; 0.0.0.0 "
        "exposes it (needed in a container) and should come with api_keys.",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port to listen on (0 = any free port).")

    # --- models ----------------------------------------------------------------------------------
    registry_dir: Path = Field(
        default=Path("registry"),
        description="Root of the bundle registry (<registry>/<name>/<version>/, <name>/current). Shared with "
        "`embedder export` and the adapt worker; a shared volume when several replicas serve it.",
    )
    cache_dir: Path = Field(
        default_factory=_default_cache_dir,
        description="Where built-in models are unpacked when the default bundle has to be created on first "
        "start (a few hundred MB with mpnet-base; only the export subprocess uses it).",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Names of promoted bundles to serve (comma-separated). Empty = every promoted model in "
        "the registry, including ones promoted later; a fixed list bounds memory but ignores new names.",
    )
    default_model: str = Field(
        default="minilm-l6",
        description="Model used when a request names none. Created from the built-in minilm-l6 on first "
        "start if the registry has no promoted model at all.",
    )
    registry_poll_seconds: float = Field(
        default=2.0,
        ge=0.0,
        description="How often the registry is checked for newly promoted versions (0 = never). Shorter "
        "picks up new models sooner at the cost of a few stat() calls per model per poll.",
    )

    serve_int8: bool = Field(
        default=True,
        description="Serve a bundle's int8 graph when it keeps the parity bars (cosine to fp32 ≥ 0.99 mean, 0.97 "
        "min on the bundle's probes) on this CPU, checked at load; else its fp32 graph (logged, shown in /v1/models "
        "and embed_model_int8). int8 is 1.3-2x faster on CPU. Off: always fp32.",
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
    ort_allow_spinning: bool = Field(
        default=False,
        description="Let onnxruntime's idle intra-op threads busy-wait for the next batch. Off (default): idle "
        "threads sleep and leave the cores to the event loop; on 2 cores this cut one short text's p50 from 15 "
        "to 9-10 ms at the same loaded throughput (docs/BENCHMARKS.md). On may help on machines with cores to "
        "spare.",
    )

    # --- batching --------------------------------------------------------------------------------
    max_batch_tokens: int = Field(
        default=4096,
        ge=1,
        description="Token budget of one forward pass (sum of padded lengths): about 20 paragraphs of 200 tokens, "
        "while short texts still fill max_batch_size. On CPU a batch of 20 long texts runs about as fast per text as "
        "one of 64, and the queue's length-sorted window cut into smaller batches pads far less, so long texts are "
        "served faster than with TEI's 16384 (docs/BENCHMARKS.md, Peers). Larger: fewer, longer forward passes, more "
        "padding and memory.",
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
        "Empty = /adapt answers 403 to client keys (unless adapt_allow_client_keys), and is open only when no "
        "api_keys are set either.",
    )
    adapt_allow_client_keys: bool = Field(
        default=False,
        description="Let every api_keys key start and read /adapt jobs when no admin_api_keys are set. Saves "
        "managing a second key on a single-tenant server, but any client that may embed can then start training "
        "jobs that take CPU from /embed and publish models. Off: /adapt answers 403 to client keys.",
    )

    # --- operations ------------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Log verbosity. debug logs every batch (size, tokens, timings) and costs throughput.",
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

    # --- /adapt (domain-adaptation jobs; see docs/ADAPT.md) ---------------------------------------
    adapt_enabled: bool = Field(default=True, description="Serve /adapt. Off: its routes answer 503, no worker runs.")
    adapt_dir: Path | None = Field(
        default=None,
        description="Job store (jobs.sqlite3) and per-job scratch (uploads, training output). Default: "
        "<registry_dir>/../adapt-jobs. Must be on the same volume as the workers when they run elsewhere.",
    )
    adapt_supervise_worker: bool = Field(
        default=True,
        description="Start and supervise `embedder adapt-worker` processes here (single machine). Off when workers "
        "run as separate Jobs sharing adapt_dir and registry_dir.",
    )
    adapt_max_concurrent_jobs: int = Field(
        default=1, ge=1, le=16, description="Jobs training at once. Each takes adapt_worker_threads cores from /embed."
    )
    adapt_max_pending_jobs: int = Field(
        default=8, ge=1, description="Queued jobs beyond which POST /adapt answers 429 with Retry-After."
    )
    adapt_max_documents: int = Field(default=20_000, ge=1, description="Most documents in one corpus (422 above).")
    adapt_max_document_chars: int = Field(
        default=20_000, ge=100, description="Longest accepted document in characters (422 above)."
    )
    adapt_max_upload_bytes: int = Field(
        default=50 * 1024 * 1024, ge=1024, description="Largest corpus body or upload in bytes (413 above)."
    )
    adapt_min_documents: int = Field(
        default=64,
        ge=2,
        description="Fewest documents that yield two crops (422 below). Fewer leaves too little to train on "
        "and too small a held-out set to trust the gate.",
    )
    adapt_keep_uploads: bool = Field(
        default=False, description="Keep each job's corpus after it ends (default: deleted with the job's scratch)."
    )
    adapt_base_models: dict[str, str] = Field(
        default_factory=dict,
        description='Extra base models jobs may adapt, as JSON {"name": "/path/to/hf-folder"}; the built-in '
        "catalog names are always allowed. Paths never come from clients.",
    )
    adapt_max_steps: int = Field(
        default=60, ge=1, description="Default training steps of a job; most of the gain comes within ~100 batches."
    )
    adapt_time_budget_s: float = Field(
        default=180.0, gt=0, description="Default training time budget of a job (whichever of steps/time ends first)."
    )
    adapt_train_last_layers: int = Field(
        default=2,
        ge=0,
        description="Default number of top layers trained (0 = all). Fewer is faster and forgets less general "
        "quality; all layers gain most in-domain.",
    )
    adapt_anchor_weight: float = Field(
        default=3.0,
        ge=0,
        description="Default weight of the MSE anchor to the base model's embeddings while adapting (0 = none). "
        "Higher forgets less off the customer's domain and gains less on it.",
    )
    adapt_batch_size: int = Field(
        default=32, ge=2, description="Default batch (in-batch negatives). Larger is a harder task but slower per step."
    )
    adapt_max_seq_length: int = Field(
        default=64,
        ge=16,
        description="Token limit of training crops (two sentences fit). The published model keeps the base limit.",
    )
    adapt_gate_margin: float = Field(
        default=2.0, ge=0.0, description="Points the general offline suite may drop and still promote an adapted model."
    )
    adapt_worker_threads: int = Field(
        default=2,
        ge=1,
        description="torch threads of a worker. Both cores make a job fastest but raise /embed latency while it runs.",
    )
    adapt_worker_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Scheduling niceness of worker processes (0 = same priority as the server). Higher leaves "
        "/embed the cores first whenever both want them; the job then takes longer on a busy server.",
    )
    adapt_lr: float = Field(
        default=2e-5, gt=0, description="Peak learning rate of a job (the cropping paper's 2e-5); higher forgets more."
    )
    adapt_general_tasks: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_GENERAL_TASKS),
        description="Offline tasks (evaluation.tasks) of the gate's general side (comma-separated); a job scores "
        "those out-of-domain for its base model (a task drawn from text the base was trained on is left out). More "
        "tasks guard general quality better; each costs evaluation time per job (the base model's scores are "
        "cached; the default costs about 37 CPU-seconds on minilm-l6, BibleParaphraseRetrieval would add 47, "
        "BBCNewsKNN over 100).",
    )

    @field_validator("adapt_general_tasks", mode="before")
    @classmethod
    def _adapt_tasks_from_csv(cls, value: object) -> object:
        return _split_csv(value)

    @field_validator("models", "api_keys", "admin_api_keys", mode="before")
    @classmethod
    def _lists_from_csv(cls, value: object) -> object:
        return _split_csv(value)

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
        if self.max_client_batch_size > self.max_queue_size:
            raise ValueError(
                f"max_client_batch_size ({self.max_client_batch_size}) exceeds max_queue_size "
                f"({self.max_queue_size}): such a request could never be queued; raise max_queue_size"
            )
        return self

    def api_key_values(self) -> list[str]:
        """Plain key values for the auth check (kept out of repr and logs by SecretStr)."""
        return [key.get_secret_value() for key in self.api_keys]

    def admin_key_values(self) -> list[str]:
        """Keys for admin routes (no fallback to the client keys: see ``adapt_allow_client_keys``)."""
        return [key.get_secret_value() for key in self.admin_api_keys]
