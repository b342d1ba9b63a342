"""What crosses from the API process to the worker: the /adapt configuration and each job's typed spec.

`AdaptConfig` is the /adapt part of the service configuration, one frozen object built from the service's
settings (``EMBED_ADAPT_*`` fields of ``service.settings.ServiceSettings``, the single source). `JobSpec` is
one job's full recipe — the request with those defaults filled in — validated once when the job is queued,
stored as JSON with the job, and read back by the worker as the same typed value (never as a dict read by
string keys). Torch-free: the service imports this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adapt.corpus import CorpusLimits

ADAPT_METHOD = "adapt"  # manifest method.name; /adapt publishes new versions only of models it made
# /adapt objective → (training objective, views): SimCSE is InfoNCE on dropout views (paper 000 §2).
OBJECTIVES = {"crop-infonce": ("infonce", "crop"), "sct": ("sct", "crop"), "simcse": ("simcse", "dropout")}
PROMOTE_POLICIES = ("auto", "never")
# The gate's "general" side: offline tasks unrelated to the customer's corpus (evaluation.tasks), of which a job scores
# those out-of-domain for its base model. Short technical text (documentation search, titles by subject) and whole
# news documents; chosen for cost: about 37 CPU-seconds per model on minilm-l6 (PyDocSummaryRetrieval 24,
# PyDocModuleClustering 10, LeeDocSTS 4), where BibleParaphraseRetrieval alone costs 47 and BBCNewsKNN over 100.
DEFAULT_GENERAL_TASKS = ("PyDocSummaryRetrieval", "PyDocModuleClustering", "LeeDocSTS")


class SpecError(ValueError):
    """A job spec that cannot run; the message names the field and what to send."""


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
    default_time_budget_s: float = 180.0
    default_train_last_layers: int = 2
    default_anchor_weight: float = 3.0
    default_batch_size: int = 32
    lr: float = 2e-5
    max_seq_length: int = 64
    gate_margin: float = 2.0  # points the general suite may drop
    worker_threads: int = 2
    worker_nice: int = 10
    worker_poll_s: float = 0.5
    events_poll_s: float = 0.25
    cache_dir: Path | None = None
    general_tasks: tuple[str, ...] = DEFAULT_GENERAL_TASKS
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
            default_anchor_weight=settings.adapt_anchor_weight,
            default_batch_size=settings.adapt_batch_size,
            max_seq_length=settings.adapt_max_seq_length,
            gate_margin=settings.adapt_gate_margin,
            worker_threads=settings.adapt_worker_threads,
            worker_nice=settings.adapt_worker_nice,
            lr=settings.adapt_lr,
            general_tasks=tuple(settings.adapt_general_tasks),
            cache_dir=settings.cache_dir,
        )


@dataclass(frozen=True)
class Hyperparameters:
    """How the job trains and is gated (the cropping paper's in-domain recipe, ``papers/000`` §2)."""

    objective: str = "crop-infonce"
    max_steps: int | None = 60
    time_budget_s: float | None = 180.0
    train_last_layers: int | None = 2  # None = every layer
    anchor_weight: float = 3.0  # MSE anchor to the base model's embeddings (training.config.TrainConfig)
    batch_size: int = 32
    lr: float = 2e-5
    max_seq_length: int = 64  # training crops only; the published bundle keeps the base model's limit
    seed: int = 0
    gate_margin: float = 2.0  # points each general task (and kNN) may drop
    general_tasks: tuple[str, ...] = DEFAULT_GENERAL_TASKS

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError(f"objective must be one of {sorted(OBJECTIVES)}, got {self.objective!r}")
        if self.max_steps is None and self.time_budget_s is None:
            raise SpecError("give max_steps, time_budget_s or both: a job needs an end")
        if self.batch_size < 2:
            raise SpecError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if self.anchor_weight < 0:
            raise SpecError(f"anchor_weight must be >= 0 (0 = no anchor), got {self.anchor_weight}")


@dataclass(frozen=True)
class JobSpec:
    """One job's recipe: what to adapt, to which name, and how."""

    base_model: str
    name: str
    hyperparameters: Hyperparameters
    promote: str = "auto"
    has_labels: bool = False
    usable_documents_estimate: int = 0

    def __post_init__(self) -> None:
        if self.promote not in PROMOTE_POLICIES:
            raise SpecError(f"promote must be one of {PROMOTE_POLICIES}, got {self.promote!r}")

    @classmethod
    def build(
        cls,
        config: AdaptConfig,
        *,
        base_model: str,
        name: str,
        objective: str = "crop-infonce",
        max_steps: int | None = None,
        time_budget_s: float | None = None,
        train_last_layers: int | None = None,
        anchor_weight: float | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        promote: str = "auto",
        has_labels: bool = False,
        usable: int = 0,
    ) -> JobSpec:
        """A request's fields with the service's defaults filled in, so the job records exactly what it ran."""
        if max_steps is None and time_budget_s is None:
            max_steps, time_budget_s = config.default_max_steps, config.default_time_budget_s
        train_last = config.default_train_last_layers if train_last_layers is None else train_last_layers
        hyperparameters = Hyperparameters(
            objective=objective,
            max_steps=max_steps,
            time_budget_s=time_budget_s,
            train_last_layers=train_last or None,
            anchor_weight=config.default_anchor_weight if anchor_weight is None else anchor_weight,
            batch_size=batch_size or config.default_batch_size,
            lr=config.lr,
            max_seq_length=config.max_seq_length,
            seed=seed,
            gate_margin=config.gate_margin,
            general_tasks=config.general_tasks,
        )
        return cls(base_model, name, hyperparameters, promote, has_labels, usable)

    def to_params(self) -> dict[str, Any]:
        """The JSON stored with the job (and shown by ``GET /adapt/{id}``)."""
        return {
            "base_model": self.base_model,
            "name": self.name,
            "promote": self.promote,
            "hyperparameters": asdict(self.hyperparameters)
            | {"general_tasks": list(self.hyperparameters.general_tasks)},
            "corpus": {"has_labels": self.has_labels, "usable_documents_estimate": self.usable_documents_estimate},
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> JobSpec:
        """Read a stored job's spec back, validated; a job stored by an older service gets today's defaults
        for fields it lacks."""
        try:
            hp = dict(params["hyperparameters"])
            hp["general_tasks"] = tuple(hp.get("general_tasks", DEFAULT_GENERAL_TASKS))
            corpus = params.get("corpus", {})
            return cls(
                base_model=params["base_model"],
                name=params["name"],
                hyperparameters=Hyperparameters(**hp),
                promote=params.get("promote", "auto"),
                has_labels=bool(corpus.get("has_labels", False)),
                usable_documents_estimate=int(corpus.get("usable_documents_estimate", 0)),
            )
        except (KeyError, TypeError) as err:
            raise SpecError(f"stored job spec is incomplete or malformed: {err}") from err
