"""What is kept of ended jobs, and for how long (torch-free: every replica's rescuer runs it, idle workers too).

- A job that failed because the job it waited for did not succeed never runs: the store fails it in the same
  transaction that ended that job (`adapt_jobs.store_core`; `JobStore.fail_dependants` sweeps up any it could not take),
  deletes its corpus and records a ``corpus_removed`` event saying why.
- Every other ended job's folder is deleted by the store when the job ends, whoever ends it (unless ``keep_uploads``).
- Ended jobs older than ``job_retention`` are deleted with their events and whatever folder they still have, by the
  one process that holds the store's prune lease (`JobStore.prune`); that process also deletes any folder under the
  jobs directory that no job names once it is older than the retention (left by a crash between the store's delete
  and the folder's, or by a request that died before its job was queued). Nothing uploaded outlives its job's
  retention, however the job ended.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from adapt_jobs.jobs import Ended
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.store import JobStore

log = logging.getLogger(__name__)

_BATCH = 500


def release_orphans(store: JobStore) -> list[Ended]:
    """The sweep: end the queued jobs whose dependency failed or was cancelled that no transition took (the store
    frees their corpora and records why), and log them."""
    orphans = store.fail_dependants()
    if orphans:
        log.warning("adapt: %d job(s) failed because the job they waited for did not succeed: %s", len(orphans),
                    ", ".join(o.job_id for o in orphans))  # fmt: skip
    return orphans


def prune_expired(store: JobStore, config: AdaptConfig, holder: str) -> list[Ended] | None:
    """Prune ended jobs past the retention, and their folders (the store deletes them), if ``holder`` gets the prune
    lease (None if another process holds it); then the folders under the jobs directory that no job names."""
    settings = config.settings
    older_than_s = settings.job_retention.total_seconds()
    pruned = store.prune(holder, older_than_s=older_than_s, lease_s=settings.lease_seconds)
    if pruned is None:
        return None
    if pruned:
        log.info("adapt: pruned %d job(s) that ended over %s ago, with their events and folders", len(pruned),
                 settings.job_retention)  # fmt: skip
    prune_job_folders(store, config.jobs_dir, older_than_s)
    return pruned


def prune_job_folders(store: JobStore, jobs_dir: Path, older_than_s: float) -> list[Path]:
    """Delete the folders under ``jobs_dir`` that no job in the store names and that are older than
    ``older_than_s`` seconds (a job's folder is written just before its job is queued: a young one may be on its way
    in). Returns the folders deleted."""
    if not jobs_dir.is_dir():
        return []
    cutoff = time.time() - older_than_s
    old = [p for p in jobs_dir.iterdir() if p.is_dir() and p.stat().st_mtime < cutoff]
    removed = []
    for start in range(0, len(old), _BATCH):
        batch = old[start : start + _BATCH]
        known = store.existing(p.name for p in batch)
        for folder in batch:
            if folder.name not in known:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
    if removed:
        log.info("adapt: deleted %d folder(s) under %s that no job names", len(removed), jobs_dir)
    return removed
