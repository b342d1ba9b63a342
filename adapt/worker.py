"""`embedder adapt-worker`: claim queued /adapt jobs from the SQLite store and run them one at a time.

Started and supervised by the service in single-machine mode (`service.adapt.supervisor`); at
scale the same entry point runs as a Kubernetes Job against a shared registry volume and store.

Stopping: SIGTERM/SIGINT (or the parent process going away when ``--parent-pid`` is given) stops
the current training at its next step; that job ends ``failed`` with reason ``interrupted`` and the
worker exits. A cancel request (``POST /adapt/{id}/cancel``) stops the job the same way and ends it
``cancelled``. Either way nothing half-written reaches the registry: export renames a bundle into
place only when it is complete, and promotion happens only after the gate.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shutil
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapt.pipeline import JobCancelled, JobFailed, WorkerOptions, run_job
from service.adapt.store import CANCELLED, FAILED, INTERRUPTED, SUCCEEDED, Job, JobStore, JobStoreError

log = logging.getLogger("adapt.worker")

PROGRESS_EVERY_S = 0.5
CANCEL_CHECK_EVERY_S = 0.5


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


def _finish(store: JobStore, job_id: str, state: str, reason: str | None = None, message: str | None = None) -> None:
    try:
        store.finish(job_id, state, reason=reason, message=message)
    except JobStoreError as err:
        # The supervisor may have failed the job already (it saw us stop): its verdict stands.
        log.warning("%s: could not record %s: %s", job_id, state, err)


def process_job(
    store: JobStore,
    job: Job,
    options: WorkerOptions,
    stop: threading.Event,
    pipeline: Callable[[Job, JobContext, WorkerOptions], None] = run_job,
) -> str:
    """Run one claimed job to a terminal state and clean up its scratch files; returns the state."""
    ctx = JobContext(store, job, stop)
    state = FAILED
    try:
        pipeline(job, ctx, options)
        state = SUCCEEDED
        _finish(store, job.id, SUCCEEDED)
    except JobCancelled:
        if ctx.interrupted:
            _finish(store, job.id, FAILED, INTERRUPTED, "the adapt worker was stopped while the job was running")
        else:
            state = CANCELLED
            _finish(store, job.id, CANCELLED)
    except JobFailed as err:
        _finish(store, job.id, FAILED, err.reason, str(err))
    except Exception as err:
        log.error("%s: unexpected failure\n%s", job.id, traceback.format_exc())
        _finish(store, job.id, FAILED, "internal", f"internal error in the adapt worker ({type(err).__name__}: {err})")
    finally:
        folder = Path(job.corpus_dir)
        shutil.rmtree(folder / "work", ignore_errors=True)
        if not options.keep_uploads:
            shutil.rmtree(folder, ignore_errors=True)
    log.info("%s: %s", job.id, state)
    return state


def _preload() -> None:
    """Import the heavy stack (torch, transformers, onnx, mteb) while idle, so a job does not wait for it."""
    for module in ("training.trainer", "export.api", "evaluation.suite", "evaluation.tasks"):
        try:
            importlib.import_module(module)
        except Exception:  # the job that needs it will report the failure with its reason
            log.exception("could not preload %s", module)


def _watch_parent(parent_pid: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        if os.getppid() != parent_pid:
            log.warning("the service (pid %d) is gone: stopping", parent_pid)
            stop.set()


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="embedder adapt-worker",
        description="Run queued /adapt jobs from the SQLite job store (the service starts this for you).",
    )
    p.add_argument("--db", required=True, type=Path, help="the service's adapt job store (jobs.sqlite3)")
    p.add_argument("--registry-dir", type=Path, default=None, help="bundle registry (default: EMBED_REGISTRY_DIR)")
    p.add_argument("--worker-id", default=None, help="name recorded on claimed jobs (default: host-pid)")
    p.add_argument("--max-running", type=int, default=1, help="jobs running at once across all workers")
    p.add_argument(
        "--threads", type=int, default=2, help="torch threads: more is faster, but competes with /embed for cores"
    )
    p.add_argument(
        "--nice", type=int, default=0, help="raise this process's niceness by N (0-19): /embed gets the cores first"
    )
    p.add_argument("--gate-margin", type=float, default=2.0, help="points the general suite may drop")
    p.add_argument("--poll-s", type=float, default=0.5, help="seconds between polls of the queue")
    p.add_argument("--keep-uploads", action="store_true", help="keep each job's corpus after it ends")
    p.add_argument(
        "--base-model", action="append", default=[], metavar="NAME=PATH", help="extra base model (repeatable)"
    )
    p.add_argument(
        "--general-tasks",
        default=",".join(WorkerOptions.general_tasks),
        help="comma-separated offline tasks of the gate's general side ('' skips that side)",
    )
    p.add_argument("--fast-general", action="store_true", help="a few documents per general task (tests only)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    p.add_argument("--once", action="store_true", help="run at most one job, then exit (Kubernetes Job mode)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.nice > 0:
        os.nice(args.nice)  # before torch starts its threads: they inherit it
    from core.settings import get_settings

    settings = get_settings()
    base_models = {}
    for item in args.base_model:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--base-model expects NAME=PATH, got {item!r}")
        base_models[name] = path
    options = WorkerOptions(
        registry_dir=args.registry_dir or settings.registry_dir,
        threads=args.threads,
        gate_margin=args.gate_margin,
        keep_uploads=args.keep_uploads,
        base_models=base_models,
        general_tasks=tuple(t for t in args.general_tasks.split(",") if t),
        general_fast=args.fast_general,
    )
    store = JobStore(args.db)
    worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, stop), daemon=True).start()
    threading.Thread(target=_preload, name="preload", daemon=True).start()
    log.info("adapt worker %s polling %s", worker_id, args.db)
    while not stop.is_set():
        job = store.claim_next(worker_id, max_running=args.max_running)
        if job is None:
            if args.once:
                return 0
            stop.wait(args.poll_s)
            continue
        log.info("%s: claimed (%s → %s)", job.id, job.params["base_model"], job.params["name"])
        process_job(store, job, options, stop)
        if args.once:
            return 0
    return 0
