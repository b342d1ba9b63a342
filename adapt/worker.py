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
import traceback
from collections.abc import Callable
from pathlib import Path

from adapt.context import JobCancelled, JobContext, JobFailed
from adapt.pipeline import WorkerOptions, run_job
from adapt.store import CANCELLED, FAILED, INTERRUPTED, SUCCEEDED, Job, JobStore, JobStoreError
from core.settings import get_settings

log = logging.getLogger("adapt.worker")


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
    p.add_argument("--poll-s", type=float, default=0.5, help="seconds between polls of the queue")
    p.add_argument("--keep-uploads", action="store_true", help="keep each job's corpus after it ends")
    p.add_argument(
        "--base-model", action="append", default=[], metavar="NAME=PATH", help="extra base model (repeatable)"
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
        keep_uploads=args.keep_uploads,
        base_models=base_models,
        general_fast=args.fast_general,
        cache_dir=settings.cache_dir,
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
