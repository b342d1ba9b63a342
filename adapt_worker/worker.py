"""`embedder adapt-worker`: claim queued /adapt jobs from the shared store under a lease and run them one at a time.

Where it runs: started and supervised by the service on one machine (`service.adapt.supervisor`, which hands it the
service's `AdaptConfig` as one file, ``--config``), or as its own workload when scaled out — one Kubernetes Job per
queued adapt job (the chart's KEDA ScaledJob runs ``embedder adapt-worker --once``), reading the same settings from
its environment (the chart's ConfigMap and Secret).

While it holds a job, a heartbeat thread renews the job's lease every `AdaptSettings.heartbeat_seconds`. When idle it
takes back jobs whose lease lapsed (their worker died) before it looks for a queued one.

Stopping: SIGTERM/SIGINT (or, with ``--parent-pid``, the service going away) stops the current job at its next
training step or stage boundary and hands it back to the queue (a rolling update or node drain loses no job, and the
attempt does not count); the worker then exits. A cancel request (``POST /adapt/{id}/cancel``) stops the job the same
way and ends it ``cancelled``. Nothing half-written reaches the registry: export renames a bundle into place only
when it is complete, and only while the worker still holds the job.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from adapt_jobs.jobs import CANCELLED, FAILED, QUEUED, SUCCEEDED, Job, LeaseLost, StoreUnavailable
from adapt_jobs.retention import release_orphans
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.store import JobStore
from adapt_jobs.store_core import CommitUnknown
from adapt_worker.context import JobCancelled, JobContext, JobFailed, WorkerStopping, scratch_dir

log = logging.getLogger("adapt_worker.worker")

ABANDONED = "abandoned"  # the worker lost the job (lease lapsed, store gone): whoever rescues it decides
_STOP_CHECK_S = 0.1  # how soon an idle worker sees its stop event while it waits for a job
INTERNAL_MESSAGE = "internal error in the adapt worker; its log has the details (search for the job id)"

Pipeline = Callable[[Job, JobContext, AdaptConfig], None]


class Heartbeat:
    """Renews a job's lease in the background while the pipeline works (export and evaluation report no steps)."""

    def __init__(self, ctx: JobContext, every_s: float) -> None:
        self.ctx = ctx
        self.every_s = every_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{ctx.job.id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        store, lease = self.ctx.store, self.ctx.lease
        while not self._done.wait(self.every_s):
            try:
                store.renew(lease, self.ctx.lease_s)
            except LeaseLost:
                log.warning("%s: lease lost (another process took the job back): stopping it", lease.job_id)
                self.ctx.lost.set()
                return
            except StoreUnavailable as err:
                log.warning("%s: could not renew the lease, retrying (%s)", lease.job_id, err)


def _end(ctx: JobContext, state: str, reason: str | None = None, message: str | None = None) -> str:
    """Record how the job ended; returns the state, or `ABANDONED` when the job is no longer ours to end."""
    try:
        if state == QUEUED:  # back to the queue, or cancelled if a cancel was pending
            return ctx.retrying(lambda: ctx.store.hand_back(ctx.lease, message or "the worker stopped"))
        ctx.retrying(lambda: ctx.store.finish(ctx.lease, state, reason=reason, message=message))
        return state
    except LeaseLost as err:
        log.warning("%s: not recording %s: %s", ctx.job.id, state, err)
        return ABANDONED


def process_job(
    store: JobStore, job: Job, config: AdaptConfig, stop: threading.Event, pipeline: Pipeline | None = None
) -> str:
    """Run one claimed job to its end (or back to the queue) and clean up; returns how it ended: a terminal state,
    ``queued`` (handed back), or ``abandoned`` (the lease was lost). The store frees the corpus of a job that ended;
    the worker deletes its attempt's scratch. ``pipeline``: `adapt_worker.pipeline.run_job` unless given."""
    settings = config.settings
    ctx = JobContext(store, job, stop, lease_s=settings.lease_seconds)
    try:
        with Heartbeat(ctx, settings.heartbeat_seconds):  # renewing the lease while the pipeline is imported too
            (pipeline or _run_job())(job, ctx, config)
        outcome = _end(ctx, SUCCEEDED)
    except WorkerStopping:
        outcome = _end(ctx, QUEUED, message="the adapt worker was stopped (drain or shutdown): queued for another")
    except JobCancelled:
        outcome = _end(ctx, CANCELLED)
    except JobFailed as err:
        outcome = _end(ctx, FAILED, err.reason, str(err))
    except LeaseLost as err:
        log.warning("%s: %s; leaving the job to whoever takes it back", job.id, err)
        outcome = ABANDONED
    except Exception:
        log.exception("%s: unexpected failure in attempt %d", job.id, job.attempt)
        outcome = _end(ctx, FAILED, "internal", f"{INTERNAL_MESSAGE} ({job.id})")
    shutil.rmtree(scratch_dir(job), ignore_errors=True)
    log.info("%s: attempt %d %s", job.id, job.attempt, outcome)
    return outcome


# One thread at a time imports the heavy stack: two threads importing it at once can each meet a module the other
# has half initialised (mteb's circular imports then fail with "partially initialized module", or KeyError).
_IMPORT_LOCK = threading.Lock()


def _run_job() -> Pipeline:
    """The job pipeline, imported when a job runs: it imports the torch stack (seconds), which `_preload` loads while
    the worker is idle, so the worker starts polling at once and `--help` answers without it. A job claimed while the
    preload is under way waits for it (its heartbeat keeps the lease) rather than import the same modules beside it."""
    with _IMPORT_LOCK:
        from adapt_worker.pipeline import run_job

    return run_job


def _preload() -> None:
    """Import the heavy stack (torch, transformers, onnx, mteb) while idle, so a job does not wait for it."""
    with _IMPORT_LOCK:
        for module in ("training.trainer", "export.bundle", "evaluation.suite", "evaluation.tasks"):
            try:
                importlib.import_module(module)
            except Exception:  # the job that needs it will report the failure with its reason
                log.exception("could not preload %s", module)


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            log.warning("the service (pid %d) is gone: stopping", parent_pid)
            stop.set()


def _wait(wake: threading.Event, stop: threading.Event, timeout_s: float) -> None:
    """Until ``wake`` (the store says a job may be claimable: PostgreSQL), ``stop``, or ``timeout_s`` (the poll)."""
    deadline = time.monotonic() + timeout_s
    while not (stop.is_set() or wake.is_set()) and (left := deadline - time.monotonic()) > 0:
        wake.wait(min(_STOP_CHECK_S, left))


class Worker:
    """The loop: take back lapsed leases (now and then), claim the oldest queued job, run it; until told to stop. An
    idle worker claims again after ``poll_seconds``, or at once when the store wakes it (PostgreSQL)."""

    def __init__(
        self, config: AdaptConfig, worker_id: str, stop: threading.Event, pipeline: Pipeline | None = None
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.stop = stop
        self.pipeline = pipeline
        self.store: JobStore | None = None
        self._last_rescue = float("-inf")
        # The store was lost while a claim committed: the claim may have been applied, so this worker may hold a job
        # it was never told of. It looks for it before claiming anything else (else the job would sit claimed by an
        # idle worker until its lease lapsed, and be retried at the cost of an attempt).
        self._claim_unknown = False

    def _open(self) -> JobStore:
        while self.store is None:
            try:
                self.store = JobStore(self.config.store_url, keep_uploads=self.config.settings.keep_uploads)
            except StoreUnavailable as err:
                log.warning("adapt worker %s: the job store is unavailable, retrying (%s)", self.worker_id, err)
                if self.stop.wait(self.config.settings.heartbeat_seconds):
                    raise WorkerStopping("stopped before the job store could be opened") from err
        return self.store

    def claim(self) -> Job | None:
        """Rescue lapsed jobs, then claim the next one (None when nothing can run now or the store is down). After a
        claim whose commit went unanswered, first the job that claim took, if it was applied."""
        settings = self.config.settings
        store = self._open()
        try:
            if self._claim_unknown:
                held = store.held_by(self.worker_id)
                self._claim_unknown = False
                if held is not None:
                    log.warning("%s: the store was lost while this worker's claim committed; it was applied", held.id)
                    return held
            if time.monotonic() - self._last_rescue >= settings.heartbeat_seconds:  # a write: not at every poll
                store.rescue_expired()
                release_orphans(store)
                self._last_rescue = time.monotonic()
            return store.claim_next(
                self.worker_id, max_running=settings.max_concurrent_jobs, lease_s=settings.lease_seconds
            )
        except StoreUnavailable as err:
            self._claim_unknown = self._claim_unknown or isinstance(err, CommitUnknown)
            log.warning("adapt worker %s: the job store is unavailable (%s)", self.worker_id, err)
            return None

    def run(self, *, once: bool = False) -> None:
        log.info("adapt worker %s polling %s", self.worker_id, self._open().describe())
        while not self.stop.is_set():
            wake = threading.Event()
            # armed before the claim, so no notification slips in between; a --once worker never waits
            disarm = (lambda: None) if once else self._open().wake_when_claimable(wake.set)
            try:
                job = self.claim()
                if job is None:
                    if once and not self._claim_unknown:  # a --once worker still looks for a claim it was not told of
                        return
                    _wait(wake, self.stop, self.config.settings.poll_seconds)
                    continue
            finally:
                disarm()
            log.info("%s: attempt %d claimed (%s → %s)", job.id, job.attempt, job.params["base_model"],
                     job.params["name"])  # fmt: skip
            process_job(self._open(), job, self.config, self.stop, self.pipeline)
            if once:
                return


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="embedder adapt-worker",
        description="Run queued /adapt jobs from the shared job store. Settings: --config FILE (what the service "
        "writes for the workers it supervises), else the environment (EMBED_REGISTRY_DIR, EMBED_CACHE_DIR, "
        "EMBED_ADAPT_*: see `embedder serve --help`).",
    )
    p.add_argument("--config", type=Path, default=None, help="the service's adapt configuration file (JSON)")
    p.add_argument("--worker-id", default=None, help="name recorded on claimed jobs (default: host-pid)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    p.add_argument("--once", action="store_true", help="run at most one job, then exit (one Kubernetes Job per job)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = AdaptConfig.read(args.config) if args.config else AdaptConfig.from_env()
    if config.settings.worker_nice > 0:
        os.nice(config.settings.worker_nice)  # before torch starts its threads: they inherit it
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True).start()
    threading.Thread(target=_preload, name="preload", daemon=True).start()
    with contextlib.suppress(WorkerStopping):
        Worker(config, worker_id, stop).run(once=args.once)
    return 0
