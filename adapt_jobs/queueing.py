"""Queueing a job: whether a request may be queued (its name, its base model), its typed spec, and the jobs it puts
in the store — the job itself and, in the same transaction, the one-time build of its base student when it asks for
a student not built yet.

A request refused here raises `JobRefused` with a stable ``code``; the API answers each code with its own status
(`service.adapt.api_state.REFUSALS`), the way `core.text.CorpusError.code` is answered. Torch-free and free of HTTP:
the API calls it in a thread, with its store.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from typing import Any

from adapt_jobs.jobs import Job, QueueFullError, audit_record, new_job_id
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.spec import ADAPT_METHOD, JobSpec, StudentBuildSpec, student_recipes
from adapt_jobs.store import JobStore
from adapt_jobs.store_core import CommitUnknown
from core import registry
from core.catalog import BUILTIN_MODELS

log = logging.getLogger(__name__)

QUEUE_FULL_RETRY_S = 60  # Retry-After of a request refused because the queue is full

# JobRefused.code: why a request was not queued.
INVALID_NAME, RESERVED_NAME, NAME_TAKEN = "invalid_name", "reserved_name", "name_taken"
MODEL_NOT_FOUND, QUEUE_FULL = "model_not_found", "queue_full"
REFUSAL_CODES = (INVALID_NAME, RESERVED_NAME, NAME_TAKEN, MODEL_NOT_FOUND, QUEUE_FULL)


class JobRefused(ValueError):
    """A request that cannot be queued; the message says what to send instead. ``code`` (one of `REFUSAL_CODES`)
    lets the API answer with a stable status; ``retry_after_s``: when trying again later can succeed (a full
    queue), how many seconds to wait."""

    def __init__(self, code: str, message: str, *, retry_after_s: int | None = None) -> None:
        if code not in REFUSAL_CODES:
            raise ValueError(f"unknown refusal code {code!r}: one of {REFUSAL_CODES}")
        super().__init__(message)
        self.code = code
        self.retry_after_s = retry_after_s


def check_name(config: AdaptConfig, name: str) -> None:
    """Refuse a name a job may not publish under: invalid, a base model's or a base student's, or a model the
    registry has that /adapt did not make."""
    try:
        registry.validate_name(name)
    except registry.RegistryError as err:
        raise JobRefused(INVALID_NAME, str(err)) from err
    if name in BUILTIN_MODELS or name in config.settings.base_models:
        raise JobRefused(
            RESERVED_NAME,
            f"model name {name!r} is a built-in base model and cannot be overwritten: choose another name",
        )
    if any(name.endswith(f"--{recipe}") for recipe in student_recipes()):
        raise JobRefused(
            RESERVED_NAME,
            f"model name {name!r} has the form <base>--<student recipe>, kept for the base students /adapt "
            "builds: choose another name",
        )
    versions = registry.list_versions(config.registry_dir, name)
    if versions:
        manifest = registry.read_manifest(config.registry_dir / name / versions[-1])
        method = (manifest.get("method") or {}).get("name")
        if method != ADAPT_METHOD:
            raise JobRefused(
                NAME_TAKEN,
                f"model {name!r} already exists in the registry and was not made by /adapt "
                f"(method {method!r}): choose a new name",
            )


def check_base_model(settings: AdaptSettings, base_model: str) -> None:
    """Refuse a base model that is neither built in nor configured (paths never come from clients)."""
    if base_model in BUILTIN_MODELS or base_model in settings.base_models:
        return
    allowed = sorted({*BUILTIN_MODELS, *settings.base_models})
    raise JobRefused(
        MODEL_NOT_FOUND,
        f"unknown base_model {base_model!r}: adapt one of {allowed} (operators add more with EMBED_ADAPT_BASE_MODELS)",
    )


def spec_for(settings: AdaptSettings, request: Mapping[str, Any], *, has_labels: bool, usable: int) -> JobSpec:
    """The job's typed recipe: the request's fields (`JobSpec.build`'s keywords) with the service's defaults filled
    in, validated once."""
    return JobSpec.build(settings, **request, has_labels=has_labels, usable=usable)


def audit(job: Job, action: str, actor: str | None) -> None:
    """Log an audit record of the API's (the store keeps the same record as the job's ``audit`` event)."""
    record = {"job_id": job.id, **audit_record(action, actor, job.params)}
    log.info("adapt audit: %s", json.dumps(record, sort_keys=True))


def queue_job(
    config: AdaptConfig,
    store: JobStore,
    spec: JobSpec,
    *,
    job_id: str,
    n_documents: int,
    created_by: str | None = None,
) -> Job:
    """Queue the job whose corpus was saved in its folder (``config.jobs_dir / job_id``) — with the build of its base
    student, in the same transaction, when it asks for a student the registry does not have yet; ``created_by``: the
    caller's key id, for the audit record. The caller deletes the folder when the job was not queued."""
    settings = config.settings
    build = student_build(config, spec) if spec.student is not None else None
    try:
        if build is not None:
            return _queue_after_build(config, store, spec, build, job_id, n_documents, created_by)
        return store.create(
            spec.to_params(),
            corpus_dir=config.jobs_dir / job_id,
            n_documents=n_documents,
            max_pending=settings.max_pending_jobs,
            max_attempts=settings.max_attempts,
            job_id=job_id,
            created_by=created_by,
        )
    except QueueFullError as err:
        raise _queue_full(err, build) from err


def student_build(config: AdaptConfig, spec: JobSpec) -> StudentBuildSpec | None:
    """The one-time build of the base student ``spec`` starts from, or None when the registry has that student."""
    if spec.student is None:
        raise ValueError("student_build needs a job spec with a student")
    build = StudentBuildSpec.build(config.settings, base_model=spec.base_model, recipe=spec.student.recipe)
    return None if registry.current_version(config.registry_dir, build.name) is not None else build


def _queue_after_build(
    config: AdaptConfig, store: JobStore, spec: JobSpec, build: StudentBuildSpec, job_id: str, n_documents: int,
    created_by: str | None,
) -> Job:  # fmt: skip
    """The job, waiting for the build of its base student: a build queued now, in the job's transaction, unless one is
    already queued or running (one build per student, however many replicas ask)."""
    settings = config.settings
    build_id = new_job_id()
    folder = config.jobs_dir / build_id
    folder.mkdir(parents=True, exist_ok=True)
    try:
        built, job = store.create_after_build(
            build.to_params(),
            spec.to_params(),
            build_dir=folder,
            corpus_dir=config.jobs_dir / job_id,
            n_documents=n_documents,
            max_pending=settings.max_pending_jobs,
            max_attempts=settings.max_attempts,
            build_id=build_id,
            job_id=job_id,
            created_by=created_by,
        )
    except CommitUnknown:
        raise  # the build may be queued: its folder stays (one that no job names is swept past the retention)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if built.id != build_id:  # another request queued it first
        shutil.rmtree(folder, ignore_errors=True)
    else:
        audit(built, "created", created_by)
    return job


def _queue_full(err: QueueFullError, build: StudentBuildSpec | None) -> JobRefused:
    """The refusal of a job the queue had no room for. A job whose student must be built first takes two places (the
    build and the job; refused with room for one, the build was new): when the queue holds fewer than two, asking
    again cannot help until the limit is raised, so the answer says so and gives no Retry-After."""
    if build is None or err.pending >= err.limit:
        return JobRefused(QUEUE_FULL, str(err), retry_after_s=QUEUE_FULL_RETRY_S)
    message = (
        f"the adapt queue has room for {err.limit - err.pending} more job(s) ({err.pending} pending, limit "
        f"{err.limit}) and this request needs 2: the job and the one-time build of its base student {build.name!r}"
    )
    if err.limit < 2:
        return JobRefused(QUEUE_FULL, f"{message}; raise EMBED_ADAPT_MAX_PENDING_JOBS to at least 2 to ask for a "
                          "student that is not built yet")  # fmt: skip
    return JobRefused(QUEUE_FULL, f"{message}; retry when a job has started", retry_after_s=QUEUE_FULL_RETRY_S)
