"""What the /adapt routes do, behind the thin handlers of `service.adapt.api_router`: the shared state (`AdaptAPI`:
config, job store, supervisor, the rescuer), request parsing and checks, queueing a job, the event stream, and the
job gauges on /metrics. Torch-free, like the rest of the service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from adapt_jobs.jobs import (
    JOB_KIND_STUDENT_BUILD,
    TERMINAL_STATES,
    Job,
    JobNotFound,
    QueueFullError,
    StoreUnavailable,
    audit_record,
    new_job_id,
)
from adapt_jobs.retention import prune_expired, release_orphans
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import ADAPT_METHOD, JobSpec, StudentBuildSpec, student_recipes
from adapt_jobs.store import JobStore
from core import registry
from core.catalog import BUILTIN_MODELS
from service.adapt.intake import Intake, UploadReader
from service.adapt.schemas import AdaptJob, AdaptRequest
from service.adapt.supervisor import WorkerSupervisor
from service.auth import ApiKeys, bearer_token, key_id
from service.errors import ErrorKind, ServiceError
from service.metrics import NO_MODEL, ServiceMetrics

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
_RETRY = {"Retry-After": "5"}
T = TypeVar("T")


class AdaptCollector:
    """Prometheus collector read at scrape time: jobs by state, worker restarts."""

    def __init__(self, api: AdaptAPI) -> None:
        self.api = api

    def describe(self) -> list[Any]:
        return []  # collected lazily: the store may not be open when the collector is registered

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.api.store is None:
            return
        try:
            counts = self.api.store.count_by_state()
        except StoreUnavailable:  # a scrape must not fail because the job store is down: the gauge is left out
            return
        jobs = GaugeMetricFamily("embed_adapt_jobs", "Adapt jobs by state.", labels=["state"])
        for state, count in counts.items():
            jobs.add_metric([state], count)
        yield jobs
        if self.api.supervisor is not None:
            restarts = CounterMetricFamily("embed_adapt_worker_restarts", "Adapt workers restarted after exiting.")
            restarts.add_metric([], self.api.supervisor.restarts)
            yield restarts


# CorpusError.code → the error kind it is answered with.
CORPUS_ERRORS = {
    kind.code: kind
    for kind in (
        ErrorKind.invalid_corpus, ErrorKind.too_many_documents, ErrorKind.document_too_long,
        ErrorKind.corpus_too_small, ErrorKind.payload_too_large,
    )
}  # fmt: skip


class AdaptAPI:
    """State shared by the routes: the config, the job store and (single-machine mode) the supervisor."""

    def __init__(self, config: AdaptConfig, keys: ApiKeys) -> None:
        self.config = config
        self.keys = keys
        self.store: JobStore | None = None
        self.supervisor: WorkerSupervisor | None = None
        self.metrics: ServiceMetrics | None = None  # the service's, when mounted in it: failures are counted there
        self.holder = f"{socket.gethostname()}-{os.getpid()}"  # this replica, for the store's prune lease
        self.uploads = UploadReader()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.config.jobs_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.store = await asyncio.to_thread(self.open_store)
        except StoreUnavailable as err:
            log.warning("adapt: the job store is unavailable, retrying in the background: %s", err)
        else:
            await self._started()
        self._task = asyncio.create_task(self._maintain(), name="adapt-store")

    def open_store(self) -> JobStore:
        """The job store; it deletes an ended job's folder unless ``keep_uploads``."""
        return JobStore(self.config.store_url, keep_uploads=self.config.settings.keep_uploads)

    async def _started(self) -> None:
        assert self.store is not None
        log.info("adapt: job store %s", self.store.describe())
        settings = self.config.settings
        if settings.enabled and settings.supervise_worker:
            self.supervisor = WorkerSupervisor(self.config, self.store)
            await self.supervisor.start()

    async def _maintain(self) -> None:
        """Open the store if it was unavailable at start, then every heartbeat: rescue lapsed leases, fail the jobs
        whose dependency did not succeed, and — when this replica holds the store's prune lease — prune ended jobs
        past their retention (`adapt_jobs.retention`)."""
        every = self.config.settings.heartbeat_seconds
        while True:
            try:
                if self.store is None:
                    self.store = await asyncio.to_thread(self.open_store)
                    await self._started()
                await asyncio.to_thread(self.upkeep, self.store)
            except StoreUnavailable as err:
                log.warning("adapt: the job store is unavailable: %s", err)
            except Exception:  # one failed round (a folder that cannot be deleted) must not end the rescuer
                log.exception("adapt: the rescuer's round failed; it runs again in %.1f s", every)
            await asyncio.sleep(every)

    def upkeep(self, store: JobStore) -> None:
        """One round of the rescuer (in a thread: it deletes folders)."""
        ended = store.rescue_expired()
        if ended:
            log.warning("adapt: took back %d job(s) whose worker stopped renewing its lease: %s", len(ended),
                        ", ".join(f"{e.job_id} -> {e.state}" for e in ended))  # fmt: skip
        release_orphans(store)
        prune_expired(store, self.config, self.holder)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.supervisor is not None:
            await self.supervisor.stop()
            self.supervisor = None
        self.uploads.close()
        if self.store is not None:
            self.store.close()

    def jobs(self) -> JobStore:
        if self.store is None:
            raise ServiceError(
                ErrorKind.adapt_not_ready, "the adapt job store is not open yet; retry shortly", headers=_RETRY
            )
        return self.store

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store method off the event loop; an unreachable store answers 503 with Retry-After."""
        try:
            return await run_in_threadpool(method, *args, **kwargs)
        except StoreUnavailable as err:
            log.warning("adapt: %s", err)
            raise ServiceError(
                ErrorKind.adapt_not_ready, "the adapt job store is unavailable; retry shortly", headers=_RETRY
            ) from err

    def fail(self, request: Request, err: ServiceError) -> Response:
        """Count the failure like the embedding routes' (route template, error kind) and render it."""
        if self.metrics is not None:
            route = getattr(request.scope.get("route"), "path", request.url.path)
            self.metrics.failures.labels(route, NO_MODEL, err.kind.code).inc()
        return err.response()

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        self.keys.check_admin(request.headers.get("authorization"))

    def caller(self, request: Request) -> str | None:
        """The key id of an authorized caller (`service.auth.key_id`), for audit records; None on a server without
        keys, where any caller is anonymous."""
        if not self.keys.admin_auth_enabled:
            return None
        token = bearer_token(request.headers.get("authorization"))
        return key_id(token) if token is not None else None

    def check_name(self, name: str) -> None:
        try:
            registry.validate_name(name)
        except registry.RegistryError as err:
            raise ServiceError(ErrorKind.invalid_name, str(err)) from err
        if name in BUILTIN_MODELS or name in self.config.settings.base_models:
            raise ServiceError(
                ErrorKind.reserved_name,
                f"model name {name!r} is a built-in base model and cannot be overwritten: choose another name",
            )
        if any(name.endswith(f"--{recipe}") for recipe in student_recipes()):
            raise ServiceError(
                ErrorKind.reserved_name,
                f"model name {name!r} has the form <base>--<student recipe>, kept for the base students /adapt "
                "builds: choose another name",
            )
        versions = registry.list_versions(self.config.registry_dir, name)
        if versions:
            manifest = registry.read_manifest(self.config.registry_dir / name / versions[-1])
            method = (manifest.get("method") or {}).get("name")
            if method != ADAPT_METHOD:
                raise ServiceError(
                    ErrorKind.name_taken,
                    f"model {name!r} already exists in the registry and was not made by /adapt "
                    f"(method {method!r}): choose a new name",
                )

    def check_base_model(self, base_model: str) -> None:
        if base_model in BUILTIN_MODELS or base_model in self.config.settings.base_models:
            return
        allowed = sorted({*BUILTIN_MODELS, *self.config.settings.base_models})
        raise ServiceError(
            ErrorKind.model_not_found,
            f"unknown base_model {base_model!r}: adapt one of {allowed} "
            "(operators add more with EMBED_ADAPT_BASE_MODELS)",
        )

    def spec_for(self, req: AdaptRequest, *, has_labels: bool, usable: int) -> JobSpec:
        """The job's typed recipe: the request with the service's defaults filled in, validated once."""
        return JobSpec.build(
            self.config.settings,
            base_model=req.base_model,
            name=req.name,
            objective=req.objective,
            max_steps=req.max_steps,
            time_budget_s=req.time_budget_s,
            train_last_layers=req.train_last_layers,
            anchor_weight=req.anchor_weight,
            batch_size=req.batch_size,
            seed=req.seed,
            promote=req.promote,
            has_labels=has_labels,
            usable=usable,
            student=req.student,
        )


def _sse(event_id: int | None, event: str, data: dict[str, Any]) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


def get_or_404(store: JobStore, job_id: str) -> Any:
    try:
        return store.get(job_id)
    except JobNotFound as err:
        raise ServiceError(ErrorKind.job_not_found, str(err)) from err


def audit(job: Job, action: str, actor: str | None) -> None:
    """Log an audit record of the API's (the store keeps the same record as the job's ``audit`` event)."""
    record = {"job_id": job.id, **audit_record(action, actor, job.params)}
    log.info("adapt audit: %s", json.dumps(record, sort_keys=True))


def queue_job(api: AdaptAPI, store: JobStore, intake: Intake, job_id: str, created_by: str | None = None) -> Job:
    """Queue the job whose corpus ``intake`` saved in its folder (after its base student's build when it asks for a
    student); ``created_by``: the caller's key id, for the audit record. The caller deletes the folder on failure."""
    req = intake.request
    spec = api.spec_for(req, has_labels=intake.has_labels, usable=intake.usable)
    settings = api.config.settings
    try:
        after = queue_student_build(api, store, spec, created_by) if spec.student is not None else None
        return store.create(
            spec.to_params(),
            corpus_dir=api.config.jobs_dir / job_id,
            n_documents=intake.n_documents,
            max_pending=settings.max_pending_jobs,
            max_attempts=settings.max_attempts,
            job_id=job_id,
            after_job=after,
            created_by=created_by,
        )
    except QueueFullError as err:
        raise ServiceError(ErrorKind.overloaded, str(err), headers={"Retry-After": "60"}) from err


def queue_student_build(api: AdaptAPI, store: JobStore, spec: JobSpec, created_by: str | None = None) -> str | None:
    """The id of the job that builds the base student ``spec`` starts from — queued now unless one is already
    queued or running (one build per student, however many replicas ask) — or None when the registry has it."""
    if spec.student is None:
        raise ValueError("queue_student_build needs a job spec with a student")
    settings = api.config.settings
    build = StudentBuildSpec.build(settings, base_model=spec.base_model, recipe=spec.student.recipe)
    if registry.current_version(api.config.registry_dir, build.name) is not None:
        return None
    build_id = new_job_id()
    folder = api.config.jobs_dir / build_id
    folder.mkdir(parents=True, exist_ok=True)
    try:
        job = store.create(
            build.to_params(),
            corpus_dir=folder,
            n_documents=0,
            max_pending=settings.max_pending_jobs,
            max_attempts=settings.max_attempts,
            job_id=build_id,
            kind=JOB_KIND_STUDENT_BUILD,
            reuse_active=True,
            created_by=created_by,
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if job.id != build_id:  # another request queued it first
        shutil.rmtree(folder, ignore_errors=True)
    else:
        audit(job, "created", created_by)
    return job.id


async def stream_events(
    request: Request, store: JobStore, job_id: str, after_id: int, poll_s: float
) -> AsyncIterator[str]:
    last_sent = time.monotonic()
    loop = asyncio.get_running_loop()
    while True:
        wake = asyncio.Event()  # armed before the read, so an event committed meanwhile does not wait for the poll
        disarm = store.wake_on_event(job_id, lambda wake=wake: loop.call_soon_threadsafe(wake.set))
        try:
            try:
                events = await run_in_threadpool(store.events, job_id, after_id=after_id)
            except StoreUnavailable:  # a database restart: keep the stream open and read on when it is back
                events = []
            for event in events:
                after_id = event.id
                yield _sse(event.id, event.type, {"job_id": job_id, "created_at": event.created_at, **event.data})
                last_sent = time.monotonic()
                if event.type == "state" and event.data.get("state") in TERMINAL_STATES:
                    with contextlib.suppress(StoreUnavailable):
                        job = await run_in_threadpool(store.get, job_id)
                        yield _sse(None, "done", AdaptJob.from_job(job).model_dump(mode="json"))
                    return
            if not events:
                if await request.is_disconnected():
                    return
                if time.monotonic() - last_sent > KEEPALIVE_S:
                    yield ": keep-alive\n\n"
                    last_sent = time.monotonic()
                with contextlib.suppress(TimeoutError):  # woken when the store notifies (PostgreSQL), else the poll
                    await asyncio.wait_for(wake.wait(), poll_s)
        finally:
            disarm()
