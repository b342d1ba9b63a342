"""The /adapt part of the service configuration, as one frozen object built from `ServiceSettings`.

The service's settings object (``EMBED_ADAPT_*`` fields of ``service.settings.ServiceSettings``)
is the single source; `AdaptConfig.from_settings` copies the fields /adapt uses so the routes, the
supervisor and the tests work with one small typed value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.adapt.corpus import CorpusLimits

# The catalog's built-in names (core.catalog.BUILTIN_MODELS; mirrored because the API process
# must not import training — tests/adapt check the two stay equal). Adapted models may not take them.
BUILTIN_MODEL_NAMES = ("minilm-l6", "minilm-l3", "mpnet-base")


@dataclass(frozen=True)
class AdaptConfig:
    registry_dir: Path
    data_dir: Path  # jobs.sqlite3 and jobs/<id>/ (uploads, training scratch)
    enabled: bool = True
    supervise_worker: bool = True  # False: workers run elsewhere (e.g. a Kubernetes Job on a shared volume)
    max_concurrent_jobs: int = 1
    max_pending_jobs: int = 8
    limits: CorpusLimits = field(default_factory=CorpusLimits)
    keep_uploads: bool = False
    base_models: dict[str, str] = field(default_factory=dict)  # extra name → HF folder allowed as base_model
    # Job defaults (a request may override each): the speed-by-design recipe, see docs/ADAPT.md.
    default_max_steps: int = 60
    default_time_budget_s: float = 150.0
    default_train_last_layers: int = 2
    default_batch_size: int = 32
    lr: float = 2e-5
    max_seq_length: int = 64
    gate_margin: float = 2.0  # points the general suite may drop
    worker_threads: int = 2
    worker_nice: int = 10
    worker_poll_s: float = 0.5
    events_poll_s: float = 0.25
    cache_dir: Path | None = None
    general_tasks: tuple[str, ...] | None = None  # None: the worker's default general suite
    general_fast: bool = False  # tests only: a few documents per general task

    @property
    def db_path(self) -> Path:
        return self.data_dir / "jobs.sqlite3"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @classmethod
    def from_settings(cls, settings: Any) -> AdaptConfig:
        """Read the ``adapt_*`` fields of the service's settings."""
        registry_dir = Path(settings.registry_dir)
        data_dir = settings.adapt_dir or registry_dir.absolute().parent / "adapt-jobs"
        return cls(
            registry_dir=registry_dir,
            data_dir=Path(data_dir),
            enabled=settings.adapt_enabled,
            supervise_worker=settings.adapt_supervise_worker,
            max_concurrent_jobs=settings.adapt_max_concurrent_jobs,
            max_pending_jobs=settings.adapt_max_pending_jobs,
            limits=CorpusLimits(
                max_documents=settings.adapt_max_documents,
                max_document_chars=settings.adapt_max_document_chars,
                max_upload_bytes=settings.adapt_max_upload_bytes,
                min_documents=settings.adapt_min_documents,
            ),
            keep_uploads=settings.adapt_keep_uploads,
            base_models=dict(settings.adapt_base_models),
            default_max_steps=settings.adapt_max_steps,
            default_time_budget_s=settings.adapt_time_budget_s,
            default_train_last_layers=settings.adapt_train_last_layers,
            default_batch_size=settings.adapt_batch_size,
            max_seq_length=settings.adapt_max_seq_length,
            gate_margin=settings.adapt_gate_margin,
            worker_threads=settings.adapt_worker_threads,
            worker_nice=settings.adapt_worker_nice,
            lr=settings.adapt_lr,
            general_tasks=tuple(settings.adapt_general_tasks),
            cache_dir=settings.cache_dir,
        )
