"""What a running job sees of its worker: progress reporting, stop checks, state changes under the worker's lease,
and the ways a job ends early (`JobCancelled`, `JobFailed`, `WorkerStopping`, `LeaseLost`). Shared by the worker
loop and the pipeline's stages.

Every write goes through the job's lease (`adapt_jobs.jobs.Lease`), so a worker that lost its job — its lease lapsed
and another process took the job back — changes nothing. A store outage (a database restarting) does not end the
job: progress that cannot be written is skipped, and writes the job needs (results, state changes) are retried
until the lease would have lapsed; past that the worker gives the job up (`LeaseLost`), and whoever rescues it
retries it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from adapt_jobs.jobs import AUDIT_EVENT, Job, LeaseLost, StoreUnavailable, audit_record
from adapt_jobs.results import JobResult
from adapt_jobs.store import JobStore

log = logging.getLogger("adapt_worker.worker")

PROGRESS_EVERY_S = 0.5
CANCEL_CHECK_EVERY_S = 0.5
RETRY_EVERY_S = 1.0

T = TypeVar("T")


class JobStopped(Exception):
    """The job must stop before its end, for a reason that is not its own failure."""


class JobCancelled(JobStopped):
    """The job was cancelled (``POST /adapt/{id}/cancel``) while it ran."""


class WorkerStopping(JobStopped):
    """The worker was told to stop (SIGTERM, its service shutting down): the job goes back to the queue."""


class JobFailed(Exception):
    """A job failure with a reason the client sees (``corpus``, ``training``, ``export``, ``evaluation``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class JobContext:
    """What the pipeline sees of the worker: progress reporting, stop checks, state changes."""

    def __init__(self, store: JobStore, job: Job, stop: threading.Event, *, lease_s: float) -> None:
        self.store = store
        self.job = job
        self.lease = job.lease
        self.lease_s = lease_s
        self.lost = threading.Event()  # set when the lease is gone: the job is no longer ours
        self._stop = stop
        self._started = time.monotonic()
        self._cpu_started = time.process_time()
        self._last_progress = 0.0
        self._last_cancel_check = 0.0
        self._cancelled = False

    # -------------------------------------------------------------- stopping
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def should_stop(self) -> bool:
        """True once the job was cancelled, the worker was told to exit, or the lease was lost (cheap every step)."""
        if self._stop.is_set() or self._cancelled or self.lost.is_set():
            return True
        now = time.monotonic()
        if now - self._last_cancel_check >= CANCEL_CHECK_EVERY_S:
            self._last_cancel_check = now
            with contextlib.suppress(StoreUnavailable):  # checked again at the next step
                self._cancelled = self.store.cancel_requested(self.job.id)
        return self._cancelled

    def check(self) -> None:
        """Raise the reason the job must stop, if it must (between stages, and after training stopped early)."""
        self._last_cancel_check = 0.0
        self.should_stop()
        if self.lost.is_set():
            raise LeaseLost(f"adapt job {self.job.id}: the lease of attempt {self.lease.attempt} was lost")
        if self._stop.is_set():
            raise WorkerStopping("the worker is stopping")
        if self._cancelled:
            raise JobCancelled("cancelled")

    def renew(self) -> None:
        """Renew the lease now (the heartbeat, and the fence before publishing); `LeaseLost` if it is gone."""
        try:
            self.retrying(lambda: self.store.renew(self.lease, self.lease_s))
        except LeaseLost:
            self.lost.set()
            raise

    def begin_publish(self) -> None:
        """The point of no return before publishing (`JobStore.begin_publish`): `JobCancelled` if a cancel was asked
        for, `LeaseLost` if the job is no longer ours; past it, a cancel is refused and the job ends with its model."""
        try:
            publishing = self.retrying(lambda: self.store.begin_publish(self.lease, self.lease_s))
        except LeaseLost:
            self.lost.set()
            raise
        if not publishing:
            self._cancelled = True
            raise JobCancelled("cancelled")

    def reopen_cancel(self) -> None:
        """An earlier attempt began publishing and left nothing in the registry: a cancel is taken again
        (`JobStore.reopen_cancel`); `LeaseLost` if the job is no longer ours."""
        self.retrying(lambda: self.store.reopen_cancel(self.lease))

    # -------------------------------------------------------------- reporting
    def elapsed(self) -> float:
        return time.monotonic() - self._started

    def cpu_seconds(self) -> float:
        """CPU time of this worker (all threads) since the job started: the cost of a job on a shared
        machine, where wall time also measures everyone else's load."""
        return time.process_time() - self._cpu_started

    def stage(self, name: str, **data: Any) -> None:
        """Enter a stage (``detail`` names the step inside it; cleared when not given)."""
        record = {
            "stage": name,
            "detail": None,
            "elapsed_s": round(self.elapsed(), 2),
            "cpu_s": round(self.cpu_seconds(), 2),
            **data,
        }
        self._write_progress(record)

    def progress(self, data: dict[str, Any], *, force: bool = False) -> None:
        """Record training progress, at most every `PROGRESS_EVERY_S` unless ``force``."""
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self._write_progress({"elapsed_s": round(self.elapsed(), 2), **data})

    def _write_progress(self, record: dict[str, Any]) -> None:
        try:
            self.store.update_progress(self.lease, record, lease_s=self.lease_s)
        except StoreUnavailable as err:  # progress is for watching: a gap is better than a stalled job
            log.warning("%s: progress not recorded (%s)", self.job.id, err)
        except LeaseLost:
            self.lost.set()
            raise

    def result(self, data: JobResult, *, event: str | None = None) -> None:
        """Merge the sections of ``data`` into the job's result (an ``event`` of that type carries them too)."""
        record = data.to_json()
        self.retrying(lambda: self.store.update_result(self.lease, record, event_type=event))

    def set_state(self, state: str) -> None:
        self.retrying(lambda: self.store.set_state(self.lease, state, lease_s=self.lease_s))

    def audit(self, action: str, **data: Any) -> None:
        """An audit record of what this worker did to the job (``promoted``): logged, and kept as an ``audit`` event
        naming the worker and, on whose behalf, the key id that created the job."""
        record = {**audit_record(action, self.lease.worker_id, self.job.params), "on_behalf_of": self.job.created_by}
        record.update(data)
        log.info("adapt audit: %s", json.dumps({"job_id": self.job.id, **record}, sort_keys=True))
        self.retrying(lambda: self.store.add_event(self.lease, AUDIT_EVENT, record))

    def log(self, message: str) -> None:
        log.info("%s: %s", self.job.id, message)
        self.retrying(lambda: self.store.add_event(self.lease, "log", {"message": message}))

    def retrying(self, write: Callable[[], T]) -> T:
        """A write the job's record needs: retried through a store outage for as long as the lease would last."""
        deadline = time.monotonic() + self.lease_s
        while True:
            try:
                return write()
            except LeaseLost:
                self.lost.set()
                raise
            except StoreUnavailable as err:
                if time.monotonic() >= deadline:
                    self.lost.set()
                    message = f"adapt job {self.job.id}: the store was unavailable past the lease ({err})"
                    raise LeaseLost(message) from err
                log.warning("%s: store unavailable, retrying (%s)", self.job.id, err)
                time.sleep(RETRY_EVERY_S)


def scratch_dir(job: Job) -> Path:
    """This attempt's scratch (training output, the staged bundle): one per attempt, so a retry never meets a dead
    attempt's half-written files."""
    return Path(job.corpus_dir) / f"attempt-{job.attempt}"
