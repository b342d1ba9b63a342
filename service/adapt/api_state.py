"""What the /adapt routes share, behind the thin handlers of `service.adapt.api_router`: the state (`AdaptAPI`:
config, job store, supervisor, the rescuer), the tables answering a refused job (`adapt_jobs.queueing.JobRefused`) and
a corpus's errors with their error kinds, the event stream, and the job gauges on /metrics. Queueing itself is
`adapt_jobs.queueing`'s. Torch-free, like the rest of the service."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from adapt_jobs.jobs import TERMINAL_STATES, JobNotFound, StoreUnavailable
from adapt_jobs.queueing import JobRefused
from adapt_jobs.retention import prune_expired, release_orphans
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.store import JobStore
from service.adapt.intake import UploadReader
from service.adapt.schemas import AdaptJob
from service.adapt.supervisor import WorkerSupervisor
from service.auth import ApiKeys, bearer_token, key_id
from service.errors import ErrorKind, ServiceError
from service.observability import failed

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

# JobRefused.code → the error kind it is answered with.
REFUSALS = {
    kind.code: kind
    for kind in (
        ErrorKind.invalid_name, ErrorKind.reserved_name, ErrorKind.name_taken, ErrorKind.model_not_found,
        ErrorKind.overloaded,
    )
}  # fmt: skip


def refusal(err: JobRefused) -> ServiceError:
    """A request `adapt_jobs.queueing` refused, as the API answers it (a full queue says when to retry)."""
    headers = {"Retry-After": str(err.retry_after_s)} if err.retry_after_s is not None else None
    return ServiceError(REFUSALS[err.code], str(err), headers=headers)


class AdaptAPI:
    """State shared by the routes: the config, the job store and (single-machine mode) the supervisor."""

    def __init__(self, config: AdaptConfig, keys: ApiKeys) -> None:
        self.config = config
        self.keys = keys
        self.store: JobStore | None = None
        self.supervisor: WorkerSupervisor | None = None
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
        settings = self.config.settings
        return JobStore(self.config.store_url, keep_uploads=settings.keep_uploads, poll_s=settings.poll_seconds)

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
        """Render the failure; the service's guard counts it like any route's (route template, error kind)."""
        failed(request.scope, err.kind)
        return err.response()

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        """An admin key (`ApiKeys.check_admin`); with no key that may use /adapt, a caller on this machine. Settings
        that serve a keyless /adapt beyond loopback stop the server (`ServiceSettings.open_adapt_error`), but an app
        may be served elsewhere than its settings say (`create_app` in another server bound to 0.0.0.0): the peer's
        address decides then, so a keyless /adapt never trains for a caller of another machine."""
        self.keys.check_admin(request.headers.get("authorization"))
        if not self.keys.admin_auth_enabled and not from_this_machine(request.client.host if request.client else None):
            raise ServiceError(
                ErrorKind.forbidden,
                "/adapt has no key set, so it answers only callers on this machine: set EMBED_ADMIN_API_KEYS "
                "(--admin-api-keys) on the server and send 'Authorization: Bearer <admin key>'",
            )

    def caller(self, request: Request) -> str | None:
        """The key id of an authorized caller (`service.auth.key_id`), for audit records; None on a server without
        keys, where any caller is anonymous."""
        if not self.keys.admin_auth_enabled:
            return None
        token = bearer_token(request.headers.get("authorization"))
        return key_id(token) if token is not None else None


def from_this_machine(host: str | None) -> bool:
    """Whether a peer's address is this machine's: loopback (127.0.0.0/8, ::1, IPv4-mapped ones too), or no IP
    address at all (a Unix socket; an in-process client)."""
    if host is None:
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _sse(event_id: int | None, event: str, data: dict[str, Any]) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


def get_or_404(store: JobStore, job_id: str) -> Any:
    try:
        return store.get(job_id)
    except JobNotFound as err:
        raise ServiceError(ErrorKind.job_not_found, str(err)) from err


async def stream_events(
    request: Request, store: JobStore, job_id: str, after_id: int, poll_s: float, *, ended: bool = False
) -> AsyncIterator[str]:
    """The job's events after ``after_id``, each once and in the order they were committed, then ``done`` with the
    whole job. ``ended``: the job had ended when the stream was asked for (read before its events), so every event it
    will ever have is committed already.

    A job's end commits its ``state`` event with what the end implies in one transaction — a dependant's
    ``corpus_removed`` comes after its ``state`` — so once the terminal ``state`` is seen, the stream reads on until
    nothing is left, then ends. A client that resumes after the terminal ``state`` (or after any later event) gets
    the rest and ``done`` at once, rather than keep-alives forever."""
    last_sent = time.monotonic()
    loop = asyncio.get_running_loop()
    while True:
        # Armed before the read, so an event committed meanwhile is not missed: woken by the store's notification
        # (PostgreSQL) or by the poll of the event counters every stream of this process shares (either store).
        wake = asyncio.Event()
        disarm = store.wake_on_event(job_id, lambda wake=wake: loop.call_soon_threadsafe(wake.set), after_seq=after_id)
        try:
            try:
                events = await run_in_threadpool(store.events, job_id, after_id=after_id)
            except StoreUnavailable:  # a database restart: keep the stream open and read on when it is back
                events = []
            for event in events:
                after_id = event.id
                yield _sse(event.id, event.type, {"job_id": job_id, "created_at": event.created_at, **event.data})
                last_sent = time.monotonic()
                ended = ended or (event.type == "state" and event.data.get("state") in TERMINAL_STATES)
            if events:
                continue  # read on: a batch may not hold every event committed so far
            if ended:
                with contextlib.suppress(StoreUnavailable):
                    job = await run_in_threadpool(store.get, job_id)
                    yield _sse(None, "done", AdaptJob.from_job(job).model_dump(mode="json"))
                return
            if await request.is_disconnected():
                return
            if time.monotonic() - last_sent >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                last_sent = time.monotonic()
            # Until woken, else until the next keep-alive: an idle stream reads its job's events that seldom itself.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(poll_s, KEEPALIVE_S - (time.monotonic() - last_sent)))
        finally:
            disarm()
