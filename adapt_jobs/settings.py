"""What every /adapt process reads: one frozen settings object, owned here, written out once.

`AdaptSettings` holds every ``EMBED_ADAPT_*`` setting — the job store, the queue's limits, the corpus limits, the
job defaults and how workers run. The service nests it (``ServiceSettings.adapt``); a worker reads the same object,
from the service's settings file when the service started it (`AdaptConfig.write` / `AdaptConfig.read`), or from
its own environment when it runs as its own workload (a Kubernetes pod built from the same ConfigMap). A job's spec
takes its defaults from it (`adapt_jobs.spec.JobSpec.build`); those per-job fields are declared once, with their
bounds and what a request may override, in `adapt_jobs.knobs` (the base `JobKnobDefaults` is made from them).

`AdaptConfig` is what a process needs around those settings: the registry the jobs publish into and the cache of
built-in models, and the paths and store URL derived from them. Torch-free: the service imports this module.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializationInfo,
    create_model,
    field_serializer,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.exc import ArgumentError

from adapt_jobs.jobs import JobStoreError
from adapt_jobs.knobs import setting_fields
from adapt_jobs.store_db import engine_url
from core.registry import RegistryError, validate_name
from core.settings import Settings

STORE_FILE = "jobs.sqlite3"


# The service's default of every per-job knob (`adapt_jobs.knobs`): EMBED_ADAPT_MAX_STEPS, EMBED_ADAPT_LR, ...
JobKnobDefaults = create_model("JobKnobDefaults", __base__=BaseSettings, **setting_fields())


class AdaptSettings(JobKnobDefaults):
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
        "(drain) does not use an attempt; one whose last attempt had begun publishing gets one more, to end with the "
        "version it published.",
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
        description="How often idle workers look for queued jobs, and how often one read of the event counters of "
        "every job streamed from a process wakes its event streams. On PostgreSQL both are also woken at once by "
        "LISTEN/NOTIFY, and this interval is the fallback (a connection pooler in transaction mode drops LISTEN). "
        "Shorter starts jobs sooner at the cost of more store queries.",
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

    # --- the gate (each job's defaults are the fields of JobKnobDefaults, from adapt_jobs.knobs) -------
    general_fast: bool = Field(
        default=False,
        description="Score only a few documents per general task. For tests of the job machinery only: the scores "
        "are not comparable and the gate means little.",
    )

    # --- how workers run -----------------------------------------------------------------------------
    publish_int8: bool = Field(
        default=True,
        description="Publish each job's bundle with an int8 graph where a setting keeps the parity bars on the "
        "worker's CPU (else fp32 only), as the default model's bundle: replicas serve it where it passes on their "
        "own CPU, so an adapted model runs at its base's int8 speed (the job scores the fp32 graph, as the base's). "
        "Off: fp32 only, 10-25 s less export per job, served at fp32 speed.",
    )
    keep_versions: int = Field(
        default=0,
        ge=0,
        description="Versions of a model name kept in the registry after a job publishes one: the worker then removes "
        "the older ones (as `embedder registry prune NAME --keep N` does; never the served version, one being "
        "published, or one published in the last 5 minutes). 0 = every version is kept (prune by hand). Each "
        "version of a base-size model takes about 130 MB of the shared volume.",
    )
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

    @field_validator("base_models")
    @classmethod
    def _base_model_names(cls, value: dict[str, str]) -> dict[str, str]:
        """Every name a model name of the registry's, and every base student /adapt would build from it
        (``<name>--<recipe>``) one too — checked as the settings are read, so the operator who wrote the map hears
        of a name no job can use, not the client whose request names it."""
        from adapt_jobs.spec import student_recipes  # the spec imports this module

        for name in value:
            try:
                validate_name(name)
            except RegistryError as err:
                raise ValueError(f"base model {name!r}: {err}") from None
            for recipe in student_recipes():
                try:
                    validate_name(f"{name}--{recipe}")
                except RegistryError:
                    raise ValueError(
                        f"base model {name!r} is too long: the student /adapt builds from it is named "
                        f"'{name}--{recipe}', and a model name has at most 64 characters"
                    ) from None
        return value

    @field_validator("store_url")
    @classmethod
    def _openable_store(cls, value: SecretStr | None) -> SecretStr | None:
        """A store URL the job store can open, checked as the settings are read — not after the models have loaded,
        when /adapt first opens the store. The message never repeats the URL: it may carry a password."""
        if value is None or not value.get_secret_value():
            return value
        try:
            engine_url(value.get_secret_value())
        except JobStoreError as err:
            raise ValueError(str(err)) from None
        except ArgumentError:
            raise ValueError(
                "not a URL: use postgresql://user:password@host/db or sqlite:////absolute/path/jobs.sqlite3"
            ) from None
        return value

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
