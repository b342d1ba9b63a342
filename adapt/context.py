"""What a running job sees of its worker: progress reporting, stop checks, state changes, and the two ways a
job ends early (`JobCancelled`, `JobFailed`). Shared by the worker loop and the pipeline's stages."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from adapt.store import Job, JobStore

log = logging.getLogger("adapt.worker")

PROGRESS_EVERY_S = 0.5
CANCEL_CHECK_EVERY_S = 0.5


class JobCancelled(Exception):
    """The job was cancelled, or the worker was told to stop, while it ran."""


class JobFailed(Exception):
    """A job failure with a reason the client sees (``corpus``, ``training``, ``export``, ``evaluation``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class JobContext:
    """What the pipeline sees of the worker: progress reporting, stop checks, state changes."""

    def __init__(self, store: JobStore, job: Job, stop: threading.Event) -> None:
        self.store = store
        self.job = job
        self._stop = stop
        self._started = time.monotonic()
        self._cpu_started = time.process_time()
        self._last_progress = 0.0
        self._last_cancel_check = 0.0
        self._cancelled = False

    # -------------------------------------------------------------- stopping
    @property
    def interrupted(self) -> bool:
        return self._stop.is_set()

    def should_stop(self) -> bool:
        """True once the job was cancelled or the worker was told to exit (cheap to call every step)."""
        if self._stop.is_set() or self._cancelled:
            return True
        now = time.monotonic()
        if now - self._last_cancel_check >= CANCEL_CHECK_EVERY_S:
            self._last_cancel_check = now
            self._cancelled = self.store.cancel_requested(self.job.id)
        return self._cancelled

    def check(self) -> None:
        """Raise `JobCancelled` between stages when the job must stop."""
        self._last_cancel_check = 0.0
        if self.should_stop():
            raise JobCancelled("stopped at a stage boundary")

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
        self.store.update_progress(self.job.id, record)

    def progress(self, data: dict[str, Any], *, force: bool = False) -> None:
        """Record training progress, at most every `PROGRESS_EVERY_S` unless ``force``."""
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self.store.update_progress(self.job.id, {"elapsed_s": round(self.elapsed(), 2), **data})

    def result(self, data: dict[str, Any], *, event: str | None = None) -> None:
        self.store.update_result(self.job.id, data, event_type=event)

    def set_state(self, state: str) -> None:
        self.store.set_state(self.job.id, state)

    def log(self, message: str) -> None:
        log.info("%s: %s", self.job.id, message)
        self.store.add_event(self.job.id, "log", {"message": message})
