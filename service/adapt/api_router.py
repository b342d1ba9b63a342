"""HTTP routes of /adapt: thin handlers over `service.adapt.api_state` and the shared job store; no training here.

``build_adapt_router(config, keys)`` returns an ``APIRouter`` whose lifespan opens the store (retrying in the
background while it is unavailable: /embed serves meanwhile and /adapt answers 503), runs this replica's rescuer
(every ``heartbeat_seconds`` it takes back jobs whose lease lapsed, whoever held them) and, in the default
single-machine mode, starts the supervised worker processes; the service includes it with
``app.include_router(...)`` (FastAPI merges the router's lifespan into the app's). Every replica answers the same
for every job: they all read one store. With /adapt off (``EMBED_ADAPT_ENABLED=false``) the lifespan opens nothing —
no store, so no migrations and no adapt folder — and every route answers 503 ``disabled``.

| route | |
|---|---|
| ``POST /adapt`` | JSON (`AdaptRequest`) or multipart form with a ``file`` (JSONL, JSON, text, Parquet) → 202 + job |
| ``GET /adapt`` | jobs, newest first (``limit``, ``after``: 404 when no job has that id) |
| ``GET /adapt/{id}`` | one job: state, progress, evaluation, gate, published model, error |
| ``GET /adapt/{id}/events`` | server-sent events (``Last-Event-ID`` resumes) until the job ends |
| ``POST /adapt/{id}/cancel`` | cancel (queued: at once; running: the worker stops at its next check) |
"""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from adapt_jobs.corpus import CorpusError, CorpusTooLargeError
from adapt_jobs.jobs import Job, JobNotFound, new_job_id
from adapt_jobs.queueing import JobRefused, audit, check_base_model, check_name, queue_job, spec_for
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import JobSpec
from adapt_jobs.store import JobStore
from adapt_jobs.store_core import CommitUnknown
from service.adapt.api_state import CORPUS_ERRORS, AdaptAPI, AdaptCollector, get_or_404, refusal, stream_events
from service.adapt.intake import read_body
from service.adapt.schemas import AdaptJob, AdaptJobList, adapt_request_body
from service.api.protocol import ErrorResponse
from service.auth import ApiKeys
from service.errors import ErrorKind, ServiceError

# Every route of this router, as declared: the service creates their failure series at zero (`ServiceMetrics`).
ADAPT_ROUTES = ("/adapt", "/adapt/{job_id}", "/adapt/{job_id}/events", "/adapt/{job_id}/cancel")

_ERROR_DESCRIPTIONS = {
    400: "a Host header this server does not answer to (allowed_hosts)",
    401: "admin API key missing or wrong",
    403: "a client API key: /adapt needs an admin key (or adapt_allow_client_keys); with no key set, a caller on "
    "another machine; a browser page of an origin not in cors_allow_origins",
    404: "unknown job (or listing cursor `after`), or unknown base_model",
    408: "the body did not arrive within body_timeout_seconds (plus 1 s per body_min_bytes_per_second)",
    409: "name belongs to a model that /adapt did not make",
    413: "body over adapt_max_upload_bytes on POST /adapt (max_body_bytes on the other routes), or an upload that "
    "decodes to more text than that",
    415: "a compressed body (Content-Encoding other than identity)",
    422: "invalid body, name, query or corpus",
    429: "adapt_max_pending_jobs jobs queued; retry after Retry-After seconds (none when the limit is below the two "
    "places a job and the build of its student take)",
    500: "an unexpected error (the message says only 'internal error'; the log has the traceback)",
    503: "/adapt disabled, or the job store not open yet",
}
# What the service's guard (`service.guard`) may answer on any route before the route runs, and a 500 after it.
_EVERY_ROUTE = (400, 401, 403, 408, 413, 415, 500, 503)


# Event ids are the store's per-job sequence numbers: positive and within a 64-bit signed integer.
MAX_EVENT_ID = 2**63 - 1
_EVENT_ID = re.compile(r"[0-9]{1,19}", re.ASCII)


def last_event_id(header: str | None) -> int:
    """The event id a ``Last-Event-ID`` header resumes after, or 0 (the stream from its first event) when the header
    is absent or is not one of the ids this stream sends: ASCII decimal digits only, at most ``MAX_EVENT_ID``.
    ``str.isdigit`` would pass digits ``int`` refuses (``"\xb2"``) and ids the store cannot compare; a browser's
    EventSource resends whatever id it saw last and cannot be told to send another, so an id that is not ours is
    ignored, as if absent, rather than refused."""
    if header is None or not _EVENT_ID.fullmatch(header):
        return 0
    value = int(header)
    return value if value <= MAX_EVENT_ID else 0


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of a route's error answers: its own ``statuses`` plus those every route can give."""
    return {
        status: {"model": ErrorResponse, "description": _ERROR_DESCRIPTIONS[status]}
        for status in sorted({*_EVERY_ROUTE, *statuses})
    }


def build_adapt_router(config: AdaptConfig, keys: ApiKeys) -> APIRouter:
    """The /adapt routes with a lifespan that opens the job store and supervises the workers (with /adapt off, it
    opens nothing and the routes answer 503 ``disabled``). ``keys`` are the service's (`ApiKeys.check_admin` guards
    every route)."""
    api = AdaptAPI(config, keys)

    def job_store() -> JobStore:
        """The open job store; 503 ``disabled`` on a server with /adapt off, which never opens one."""
        if not config.settings.enabled:
            raise ServiceError(ErrorKind.adapt_disabled, "/adapt is disabled on this server")
        return api.jobs()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.adapt = api
        if not config.settings.enabled:  # /adapt off: no job store (its migrations, its folder), no rescuer, no worker
            yield
            return
        await api.start()
        metrics = getattr(app.state, "metrics", None)
        if metrics is not None:  # inside the full service: job gauges on its /metrics
            metrics.registry.register(AdaptCollector(api))
        try:
            yield
        finally:
            await api.stop()

    router = APIRouter(lifespan=lifespan, tags=["adapt"])

    @router.post(
        "/adapt", status_code=202, response_model=AdaptJob, responses=_errors(404, 409, 413, 415, 422, 429),
        openapi_extra={"requestBody": adapt_request_body()},
    )  # fmt: skip
    async def submit(request: Request) -> Response:
        try:
            api.authorize(request)
            store = job_store()
            job_id = new_job_id()
            folder = config.jobs_dir / job_id
            try:
                content_type, body = await read_body(request, config.settings)
                intake = await api.uploads.take_in(content_type, body, config.settings, folder)
                del body
                check_name(config, intake.request.name)
                check_base_model(config.settings, intake.request.base_model)
                if intake.refused is not None:  # the request's own fields first: one answer names every fix it can
                    raise intake.refused
                caller = api.caller(request)
                spec = spec_for(config.settings, intake.request.job_fields(), has_labels=intake.has_labels,
                                usable=intake.usable)  # fmt: skip
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)  # whatever was saved of a job that was not queued
                raise
            job = await _queue(store, spec, job_id, intake.n_documents, caller)
            audit(job, "created", caller)
        except JobRefused as err:
            return api.fail(request, refusal(err))
        except CorpusTooLargeError as err:
            return api.fail(request, ServiceError(ErrorKind.payload_too_large, str(err)))
        except CorpusError as err:
            kind = CORPUS_ERRORS.get(err.code, ErrorKind.invalid_corpus)
            return api.fail(request, ServiceError(kind, str(err), details=err.details or None))
        except ServiceError as err:
            return api.fail(request, err)
        return JSONResponse(AdaptJob.from_job(job).model_dump(mode="json"), status_code=202)

    async def _queue(store: JobStore, spec: JobSpec, job_id: str, n_documents: int, caller: str | None) -> Job:
        """Queue the job whose corpus is saved in its folder. The folder is deleted only when the job is known not to
        be queued (refused, or its transaction rolled back before its commit). A store lost during the commit
        (`CommitUnknown`) leaves it unknown whether the job is queued: its corpus stays — a folder no job names is
        deleted past the retention (`adapt_jobs.retention.prune_job_folders`) — and the 503 names the job to look
        up before asking again, so a retry does not queue it twice."""
        try:
            return await api.call(
                queue_job, config, store, spec, job_id=job_id, n_documents=n_documents, created_by=caller
            )
        except ServiceError as err:
            if isinstance(err.__cause__, CommitUnknown):
                raise ServiceError(
                    ErrorKind.adapt_not_ready,
                    f"the adapt job store was lost while job {job_id} was being queued, so it may be queued: "
                    f"GET /adapt/{job_id} before asking again",
                    headers=err.headers,
                    details={"job_id": job_id},
                ) from err.__cause__
            shutil.rmtree(config.jobs_dir / job_id, ignore_errors=True)  # the store never committed the job
            raise
        except Exception:
            shutil.rmtree(config.jobs_dir / job_id, ignore_errors=True)  # refused, or rolled back: not queued
            raise

    @router.get("/adapt", response_model=AdaptJobList, responses=_errors(404, 422))
    async def list_jobs(request: Request, limit: int = Query(20, ge=1, le=100), after: str | None = None) -> Response:
        try:
            api.authorize(request)
            try:
                jobs = await api.call(job_store().list_jobs, limit=limit + 1, after=after)
            except JobNotFound as err:  # the cursor: an empty page would end the listing without saying why
                raise ServiceError(ErrorKind.job_not_found, str(err), details={"after": after}) from err
        except ServiceError as err:
            return api.fail(request, err)
        body = AdaptJobList(data=[AdaptJob.from_job(j) for j in jobs[:limit]], has_more=len(jobs) > limit)
        return JSONResponse(body.model_dump(mode="json"))

    @router.get("/adapt/{job_id}", response_model=AdaptJob, responses=_errors(404))
    async def get_job(request: Request, job_id: str) -> Response:
        try:
            api.authorize(request)
            job = await api.call(get_or_404, job_store(), job_id)
        except ServiceError as err:
            return api.fail(request, err)
        return JSONResponse(AdaptJob.from_job(job).model_dump(mode="json"))

    @router.post("/adapt/{job_id}/cancel", response_model=AdaptJob, responses=_errors(404))
    async def cancel_job(request: Request, job_id: str) -> Response:
        try:
            api.authorize(request)
            caller = api.caller(request)
            try:
                job, asked = await api.call(job_store().cancel, job_id, actor=caller)
            except JobNotFound as err:
                raise ServiceError(ErrorKind.job_not_found, str(err)) from err
            if asked:  # asking again while the worker stops changes nothing: logged once, as the store records it
                audit(job, "cancelled", caller)
        except ServiceError as err:
            return api.fail(request, err)
        return JSONResponse(AdaptJob.from_job(job).model_dump(mode="json"))

    @router.get(
        "/adapt/{job_id}/events",
        response_class=StreamingResponse,
        responses={200: {"description": "server-sent events", "content": {"text/event-stream": {}}}, **_errors(404)},
    )
    async def job_events(request: Request, job_id: str) -> Response:
        try:
            api.authorize(request)
            store = job_store()
            job = await api.call(get_or_404, store, job_id)
        except ServiceError as err:
            return api.fail(request, err)
        after_id = last_event_id(request.headers.get("last-event-id"))
        return StreamingResponse(
            stream_events(request, store, job_id, after_id, config.settings.poll_seconds, ended=job.terminal),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router
