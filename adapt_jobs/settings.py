"""What every /adapt process reads: one frozen settings object, owned here, written out once.

`AdaptSettings` holds every ``EMBED_ADAPT_*`` setting — the job store, the queue's limits, the corpus limits, the
job defaults and how workers run. The service nests it (``ServiceSettings.adapt``); a worker reads the same object,
from the service's settings file when the service started it (`AdaptConfig.write` / `AdaptConfig.read`), or from
its own environment when it runs as its own workload (a Kubernetes pod built from the same ConfigMap). A job's spec
takes its defaults from it (`adapt_jobs.spec.JobSpec.build`), so a default is written once, here.

`AdaptConfig` is what a process needs around those settings: the registry the jobs publish into and the cache of
built-in models, and the paths and store URL derived from them. Torch-free: the service imports this module.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, SerializationInfo, field_serializer, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.settings import Settings, split_csv

# The gate's "general" side: offline tasks unrelated to the customer's corpus (evaluation.tasks), of which a job scores
# those out-of-domain for its base model. Short technical text (documentation search, titles by subject) and whole
# news documents; chosen for cost: about 37 CPU-seconds per model on minilm-l6 (PyDocSummaryRetrieval 24,
# PyDocModuleClustering 10, LeeDocSTS 4), where BibleParaphraseRetrieval alone costs 47 and BBCNewsKNN over 100.
DEFAULT_GENERAL_TASKS = ("PyDocSummaryRetrieval", "PyDocModuleClustering", "LeeDocSTS")
STORE_FILE = "jobs.sqlite3"


class AdaptSettings(BaseSettings):
    """``EMBED_ADAPT_*``: the /adapt job queue, its workers and each job's defaults (docs/ADAPT.md)."""

    model_config = SettingsConfigDict(env_prefix="EMBED_ADAPT_", extra="ignore", frozen=True)

    # --- the queue and its store ---------------------------------------------------------------------
    enabled: bool = Field(default=True, description="Serve /adapt. Off: its routes answer 503, no worker runs.")
    dir: Path | None = Field(
        default=None,
        description="Per-job scratch (uploads, training output) and, without store_url, the SQLite job store "
        "(jobs.sqlite3). Default: <registry_dir>/../adapt-jobs. Must be a volume every replica and worker shares.",
    )
    store_url: SecretStr | None = Field(
        default=None,
        description="Job store shared by every replica and worker: postgresql://user:password@host/db when scaled "
        "out (claims with FOR UPDATE SKIP LOCKED), or empty for the embedded SQLite file in dir (one machine; "
        "SQLite's locks are not safe on network filesystems). A secret: it may carry a password.",
    )
    supervise_worker: bool = Field(
        default=True,
        description="Start and supervise `embedder adapt-worker` processes here (single machine). Off when workers "
        "run as their own workload (the chart's adapt worker ScaledJob) sharing the store, dir and registry_dir.",
    )
    max_concurrent_jobs: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Jobs training at once across every worker sharing the store. Each takes worker_threads cores.",
    )
    max_pending_jobs: int = Field(
        default=8, ge=1, description="Queued jobs beyond which POST /adapt answers 429 with Retry-After."
    )
    max_attempts: int = Field(
        default=2,
        ge=1,
        le=10,
        description="Attempts of a job whose worker died (lease lapsed): it is retried from scratch until this many "
        "attempts were interrupted, then fails with reason 'interrupted'. A job handed back by a stopping worker "
        "(drain) does not use an attempt.",
    )
    lease_seconds: float = Field(
        default=30.0,
        ge=2.0,
        le=3600.0,
        description="How long a worker's claim on a job lasts unless renewed (its heartbeat renews it every third "
        "of this). Shorter retries a dead worker's job sooner; longer survives longer store outages and pauses.",
    )
    poll_seconds: float = Field(
        default=0.5,
        gt=0.0,
        le=60.0,
        description="How often idle workers look for queued jobs and event streams look for new events; on "
        "PostgreSQL they are also woken at once by LISTEN/NOTIFY and this is the fallback. Shorter starts jobs "
        "sooner at the cost of more store queries.",
    )

    # --- corpus limits -------------------------------------------------------------------------------
    max_documents: int = Field(default=20_000, ge=1, description="Most documents in one corpus (422 above).")
    max_document_chars: int = Field(
        default=20_000, ge=100, description="Longest accepted document in characters (422 above)."
    )
    max_upload_bytes: int = Field(
        default=50 * 1024 * 1024, ge=1024, description="Largest corpus body or upload in bytes (413 above)."
    )
    min_documents: int = Field(
        default=64,
        ge=2,
        description="Fewest documents that yield two crops (422 below). Fewer leaves too little to train on "
        "and too small a held-out set to trust the gate.",
    )
    keep_uploads: bool = Field(
        default=False,
        description="Keep each job's corpus after it ends, until job_retention (default: deleted with the job's "
        "scratch when the job ends).",
    )
    job_retention: timedelta = Field(
        default=timedelta(days=7),
        gt=timedelta(0),
        description="How long an ended job (succeeded, failed or cancelled) is kept with its events, audit records "
        "and any folder left of it before it is pruned (ISO 8601 duration such as P7D or PT12H, or seconds); one "
        "replica at a time prunes, under a lease in the job store. Longer keeps finished jobs, their results and "
        "who created, cancelled or promoted them readable through GET /adapt for longer; shorter frees the shared "
        "volume and the job tables sooner.",
    )
    base_models: dict[str, str] = Field(
        default_factory=dict,
        description='Extra base models jobs may adapt, as JSON {"name": "/path/to/hf-folder"}; the built-in '
        "catalog names are always allowed. Paths never come from clients.",
    )
    allow_client_keys: bool = Field(
        default=False,
        description="Let every api_keys key start and read /adapt jobs when no admin_api_keys are set. Saves "
        "managing a second key on a single-tenant server, but any client that may embed can then start training "
        "jobs that take CPU from /embed and publish models. Off: /adapt answers 403 to client keys.",
    )

    # --- job defaults (a request may override the first five) ---------------------------------------
    max_steps: int = Field(
        default=60, ge=1, description="Default training steps of a job; most of the gain comes within ~100 batches."
    )
    time_budget_s: float = Field(
        default=180.0, gt=0, description="Default training time budget of a job (whichever of steps/time ends first)."
    )
    train_last_layers: int = Field(
        default=2,
        ge=0,
        description="Default number of top layers trained (0 = all). Fewer is faster and forgets less general "
        "quality; all layers gain most in-domain.",
    )
    anchor_weight: float = Field(
        default=3.0,
        ge=0,
        description="Default weight of the MSE anchor to the base model's embeddings while adapting (0 = none). "
        "Higher forgets less off the customer's domain and gains less on it.",
    )
    batch_size: int = Field(
        default=32, ge=2, description="Default batch (in-batch negatives). Larger is a harder task but slower per step."
    )
    max_seq_length: int = Field(
        default=64,
        ge=16,
        description="Token limit of training crops (two sentences fit). The published model keeps the base limit.",
    )
    gate_margin: float = Field(
        default=2.0, ge=0.0, description="Points the general offline suite may drop and still promote an adapted model."
    )
    lr: float = Field(
        default=2e-5, gt=0, description="Peak learning rate of a job (the cropping paper's 2e-5); higher forgets more."
    )
    general_tasks: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_GENERAL_TASKS),
        description="Offline tasks (evaluation.tasks) of the gate's general side (comma-separated); a job scores "
        "those out-of-domain for its base model (a task drawn from text the base was trained on is left out). More "
        "tasks guard general quality better; each costs evaluation time per job (the base model's scores are "
        "cached; the default costs about 37 CPU-seconds on minilm-l6, BibleParaphraseRetrieval would add 47, "
        "BBCNewsKNN over 100).",
    )
    general_fast: bool = Field(
        default=False,
        description="Score only a few documents per general task. For tests of the job machinery only: the scores "
        "are not comparable and the gate means little.",
    )

    # --- compact students (a request's "student" field) ----------------------------------------------
    student_max_steps: int = Field(
        default=0,
        ge=0,
        description="Distillation steps of the adapted model into its student (batch of the student's recipe) before "
        "the crop step; 0 = none, the crop step starts from the base student (on IMDB distilling first gained 0.4 "
        "points in domain and lost 0.65 more out of domain, for 114 s: docs/BENCHMARKS.md).",
    )
    student_time_budget_s: float = Field(
        default=120.0, gt=0, description="Distillation time budget (whichever of steps/time ends first)."
    )
    student_general_texts: int = Field(
        default=4000,
        ge=0,
        description="General texts (a seeded sample of the texts the base student was built on) the student keeps "
        "its view of off the customer's domain: rehearsed in the crop step and distilled beside the customer's texts; "
        "0 = none.",
    )
    student_general_targets: Literal["adapted_teacher", "base_student", "base_teacher"] = Field(
        default="base_student",
        description="Whose view of the general texts the student keeps: the crop step's rehearsal holds that model's "
        "similarities of them, a distillation its embeddings (the adapted teacher's are computed when first drawn, "
        "inside the time budget; a frozen model's before the clock starts and kept in the cache): the base student "
        "itself, the base teacher or the adapted teacher. With the default base_student and no distillation the job "
        "does not adapt the teacher at all (nothing would learn from it). On IMDB, two seeds, the base student's own "
        "view kept 0.4-0.5 more points out of domain than the adapted teacher's at the same in-domain score "
        "(docs/BENCHMARKS.md).",
    )
    student_adapt_steps: int = Field(
        default=120,
        ge=0,
        description="Steps of the job's own recipe (crop InfoNCE with the MSE anchor) on the student, every layer "
        "trained, with the rehearsal of the general texts; 0 = distillation only.",
    )
    student_adapt_lr: float = Field(
        default=2e-4, gt=0, description="Peak learning rate of that step (a 2-layer student takes more than 2e-5)."
    )
    student_adapt_time_budget_s: float = Field(
        default=360.0,
        gt=0,
        description="Time budget of that step (whichever of steps/time ends first). The 120 steps take ~220 s on 2 "
        "AVX-512 VNNI cores and ~1.4x that on 2 AVX2 cores; 360 s lets the slower CPU run them all too and keeps the "
        "whole job within 8 minutes there (docs/BENCHMARKS.md).",
    )
    student_rehearsal_weight: float = Field(
        default=1.0,
        ge=0,
        description="Weight of the crop step's similarity rehearsal: each step 64 general texts keep the similarities "
        "the general-targets model gives them (SCT's KL between similarity distributions, papers/001 §3.4); 0 = none.",
    )
    student_rehearsal_temperature: float = Field(
        default=0.2,
        gt=0,
        description="Temperature of that rehearsal's similarity distributions: lower holds each general text's nearest "
        "neighbours, higher its coarser relations to all the others. On IMDB, three seeds, 0.2 and 0.05 kept as much "
        "out of domain on average (-0.84, -0.87 points) and 0.2 scored 0.2 points more in domain (docs/BENCHMARKS.md).",
    )
    student_rehearsal_position_weight: float = Field(
        default=10.0,
        ge=0,
        description="Weight of the rehearsal's position term: each general text's normalised embedding is also held to "
        "the general-targets model's (mean squared distance; that model must have the student's width: the "
        "base student, or a teacher as wide); 0 = relations only. On IMDB, five seeds, weight 10 kept more of "
        "the out-of-domain average on every seed (+0.31 points on average with BBC clustering averaged over "
        "its seeds; -0.94 instead of -1.12 as reported) for 0.35 points in domain (docs/BENCHMARKS.md).",
    )
    student_build_max_steps: int = Field(
        default=0,
        ge=0,
        description="Steps of the one-time build of a base student; 0 = its recipe's own (sct-tiny: 300, ~28 min on "
        "2 AVX2 cores, the teacher's pass included). Fewer builds sooner and a weaker student.",
    )
    student_build_max_documents: int = Field(
        default=0, ge=0, description="Documents the base-student build reads; 0 = its recipe's own."
    )

    # --- how workers run -----------------------------------------------------------------------------
    worker_threads: int = Field(
        default=2,
        ge=1,
        description="torch threads of a worker. Both cores make a job fastest but raise /embed latency while it runs.",
    )
    worker_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Scheduling niceness of worker processes (0 = same priority as the server). Higher leaves "
        "/embed the cores first whenever both want them; the job then takes longer on a busy server.",
    )

    @field_validator("job_retention", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        """A number of seconds written as text (an environment variable, a flag) is a duration too."""
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    @field_validator("general_tasks", mode="before")
    @classmethod
    def _tasks_from_csv(cls, value: object) -> object:
        return split_csv(value)

    @field_serializer("store_url", when_used="json")
    def _store_url_json(self, value: SecretStr | None, info: SerializationInfo) -> str | None:
        """Masked in JSON unless the caller asks to reveal it (only `AdaptConfig.write`, to an owner-only file)."""
        if value is None:
            return None
        return value.get_secret_value() if (info.context or {}).get("reveal") else str(value)

    @property
    def heartbeat_seconds(self) -> float:
        """A worker renews its lease this often: three renewals fit in one lease."""
        return self.lease_seconds / 3


class AdaptConfig(BaseModel):
    """The settings plus where this deployment keeps things: the registry jobs publish into, the cache of
    built-in models. Built once per process; handed to a supervised worker whole, as one file."""

    model_config = ConfigDict(frozen=True)

    registry_dir: Path
    cache_dir: Path
    settings: AdaptSettings = Field(default_factory=AdaptSettings)

    @classmethod
    def from_env(cls) -> AdaptConfig:
        """A worker started on its own (another pod): ``EMBED_REGISTRY_DIR``, ``EMBED_CACHE_DIR``, ``EMBED_ADAPT_*``."""
        tools = Settings()
        return cls(registry_dir=tools.registry_dir, cache_dir=tools.cache_dir, settings=AdaptSettings())

    @property
    def data_dir(self) -> Path:
        return Path(self.settings.dir or self.registry_dir.absolute().parent / "adapt-jobs")

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def store_url(self) -> str:
        """The store's SQLAlchemy URL: the configured one, or the embedded SQLite file in ``data_dir``."""
        if self.settings.store_url is not None and self.settings.store_url.get_secret_value():
            return self.settings.store_url.get_secret_value()
        return f"sqlite:///{(self.data_dir / STORE_FILE).absolute()}"

    def write(self, folder: Path) -> Path:
        """Write this config (the store URL included) to a new owner-only file in ``folder``; returns its path."""
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="adapt-config-", suffix=".json", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600, the URL may carry a password
            out.write(self.model_dump_json(context={"reveal": True}))
        return Path(name)

    @classmethod
    def read(cls, path: Path) -> AdaptConfig:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
