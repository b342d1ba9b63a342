"""Retention, on both backends (SQLite file, real PostgreSQL): ended jobs past `job_retention` go with their events
and folders, under a lease one process holds at a time; active and young jobs stay; a job failed because its
student build failed frees its corpus at once and says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from adapt_jobs.corpus import CORPUS_FILE
from adapt_jobs.jobs import (
    CANCELLED,
    CORPUS_REMOVED_EVENT,
    FAILED,
    JOB_KIND_STUDENT_BUILD,
    PRUNED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
)
from adapt_jobs.retention import prune_expired, release_orphans
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from adapt_jobs.store_db import jobs_table

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0
LEASE = 30.0


def _config(tmp_path: Path, store_url: str) -> AdaptConfig:
    settings = AdaptSettings(dir=tmp_path / "adapt", store_url=store_url, job_retention=timedelta(days=7))
    return AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)


def _job(store: JobStore, config: AdaptConfig, name: str, **kwargs):
    """A job with a corpus on disk, like POST /adapt queues one."""
    job = store.create({"base_model": "minilm-l6", "name": name}, corpus_dir=config.jobs_dir / "pending",
                       n_documents=1, max_pending=100, max_attempts=2, **kwargs)  # fmt: skip
    folder = config.jobs_dir / job.id
    folder.mkdir(parents=True)
    (folder / CORPUS_FILE).write_text('{"text": "a document"}\n')
    with store.engine.begin() as conn:
        conn.execute(sa.update(jobs_table).where(jobs_table.c.id == job.id).values(corpus_dir=str(folder)))
    return store.get(job.id)


def _end(store: JobStore, job_id: str, state: str) -> None:
    if state == CANCELLED:
        store.request_cancel(job_id)
        return
    claimed = store.claim_next("w", max_running=100, lease_s=LEASE)
    assert claimed is not None and claimed.id == job_id
    store.finish(claimed.lease, state, reason="training" if state == FAILED else None)


def _age(store: JobStore, job_id: str, days: float) -> None:
    """Move a job's clock back ``days``, as if it was created and ended that long ago."""
    with store.engine.begin() as conn:
        row = conn.execute(sa.select(jobs_table).where(jobs_table.c.id == job_id)).one()
        shift = {"created_at": row.created_at - days * DAY}
        if row.finished_at is not None:
            shift["finished_at"] = row.finished_at - days * DAY
        conn.execute(sa.update(jobs_table).where(jobs_table.c.id == job_id).values(**shift))


def test_old_ended_jobs_go_with_their_events_and_folders_and_the_rest_stay(store_url: str, tmp_path: Path) -> None:
    config = _config(tmp_path, store_url)
    store = JobStore(store_url, keep_uploads=True)  # an ended job's folder stays until its retention
    old = {}
    for state in (SUCCEEDED, FAILED, CANCELLED):
        job = _job(store, config, f"old-{state}")
        _end(store, job.id, state)
        _age(store, job.id, 8)
        old[job.id] = Path(job.corpus_dir)
    young = _job(store, config, "young")
    _end(store, young.id, SUCCEEDED)
    _age(store, young.id, 6)
    running = _job(store, config, "running")
    assert store.claim_next("w", max_running=100, lease_s=LEASE).id == running.id
    _age(store, running.id, 30)
    # an old ended build that a queued job still waits for stays until that job ends
    build = _job(store, config, "base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)
    waiting = _job(store, config, "waiting", after_job=build.id)
    assert store.claim_next("w", max_running=100, lease_s=LEASE).id == build.id
    _end_held(store, build.id)
    _age(store, build.id, 30)
    old_queued = _job(store, config, "old-queued")
    _age(store, old_queued.id, 30)
    leftover_old, leftover_young = config.jobs_dir / "adaptjob-crashed", config.jobs_dir / "adaptjob-arriving"
    for folder in (leftover_old, leftover_young):
        folder.mkdir()
        (folder / CORPUS_FILE).write_text("{}\n")
    os.utime(leftover_old, (time.time() - 8 * DAY, time.time() - 8 * DAY))

    pruned = prune_expired(store, config, "replica-a")

    assert pruned is not None and {p.job_id for p in pruned} == set(old)
    assert {p.state for p in pruned} == {PRUNED}
    for job_id, folder in old.items():
        assert not folder.exists()
        assert store.events(job_id) == []
        assert store.existing([job_id]) == set()
    kept = {young.id, old_queued.id, running.id, build.id, waiting.id}
    assert store.existing([*kept, *old]) == kept
    for job_id in kept:
        assert (config.jobs_dir / job_id / CORPUS_FILE).is_file() and store.events(job_id)
    assert not leftover_old.exists() and leftover_young.is_dir()
    assert prune_expired(store, config, "replica-a") == []  # nothing more; the holder renews its lease


def _end_held(store: JobStore, job_id: str) -> None:
    job = store.get(job_id)
    assert job.state == RUNNING
    store.finish(job.lease, SUCCEEDED)


def test_a_job_failed_on_its_dependency_frees_its_corpus_and_says_why(store_url: str, tmp_path: Path) -> None:
    config = _config(tmp_path, store_url)
    store = JobStore(store_url)
    build = _job(store, config, "base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)
    waiting = _job(store, config, "acme", after_job=build.id)
    claimed = store.claim_next("w", max_running=1, lease_s=LEASE)

    store.finish(claimed.lease, FAILED, reason="student", message="the student build diverged")

    failed = store.get(waiting.id)  # in the same transition as its build's failure
    assert failed.state == FAILED and failed.error["reason"] == "dependency"
    assert "the student build diverged" in failed.error["message"]
    assert not Path(waiting.corpus_dir).exists() and not Path(build.corpus_dir).exists()
    (removed,) = [e for e in store.events(waiting.id) if e.type == CORPUS_REMOVED_EVENT]
    assert "did not succeed" in removed.data["reason"] and "deleted" in removed.data["reason"]
    assert release_orphans(store) == []


def test_the_sweep_fails_a_dependant_no_transition_took(store_url: str, tmp_path: Path) -> None:
    """A queued job whose build ended ``failed`` without it (a store written before the transitions failed
    dependants): the sweep fails it, frees its corpus and says why."""
    config = _config(tmp_path, store_url)
    store = JobStore(store_url)
    build = _job(store, config, "base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)
    waiting = _job(store, config, "acme", after_job=build.id)
    with store.engine.begin() as conn:
        conn.execute(sa.update(jobs_table).where(jobs_table.c.id == build.id).values(state=CANCELLED))

    orphans = release_orphans(store)

    assert [(o.job_id, o.state) for o in orphans] == [(waiting.id, FAILED)]
    assert store.get(waiting.id).error["reason"] == "dependency" and not Path(waiting.corpus_dir).exists()
    assert [e.type for e in store.events(waiting.id)][-2:] == ["state", CORPUS_REMOVED_EVENT]
    assert release_orphans(store) == []


def test_the_prune_lease_is_held_by_one_process_until_it_lapses(store_url: str) -> None:
    store = JobStore(store_url)
    assert store.take_lease("prune", "a", 30)
    assert store.take_lease("prune", "a", 30)  # its holder renews it
    assert not store.take_lease("prune", "b", 30)
    assert store.prune("b", older_than_s=0, lease_s=30) is None
    assert store.take_lease("prune", "a", 0.5)  # renewed for a moment only: b may take it once that lapsed
    time.sleep(0.7)
    assert store.prune("b", older_than_s=0, lease_s=30) == []  # lapsed: b takes it
    assert not store.take_lease("prune", "a", 0.5)


# One pruning process: 20 rounds of `prune_expired`, then what it pruned and how often it was refused, as JSON. Run
# with `python -c` (not multiprocessing): a child must not have to import this test module by a name that an
# installed package's own top-level `tests` could shadow.
_PRUNE_ROUNDS = """
import json, sys
from datetime import timedelta
from pathlib import Path
from adapt_jobs.retention import prune_expired
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
url, root, holder = sys.argv[1:4]
settings = AdaptSettings(dir=Path(root) / "adapt", store_url=url, job_retention=timedelta(days=7))
config = AdaptConfig(registry_dir=Path(root) / "registry", cache_dir=Path(root) / "cache", settings=settings)
store = JobStore(url)
got, refused = [], 0
for _ in range(20):
    pruned = prune_expired(store, config, holder)
    if pruned is None:
        refused += 1
    else:
        got.extend(p.job_id for p in pruned)
print(json.dumps([holder, got, refused]))
"""


def test_two_processes_pruning_at_once_never_both_prune(store_url: str, tmp_path: Path) -> None:
    config = _config(tmp_path, store_url)
    store = JobStore(store_url)
    old = set()
    for i in range(12):
        job = _job(store, config, f"old-{i}")
        _end(store, job.id, CANCELLED)
        _age(store, job.id, 8)
        old.add(job.id)
    procs = [
        subprocess.Popen([sys.executable, "-c", _PRUNE_ROUNDS, store_url, str(tmp_path), holder], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for holder in ("a", "b")
    ]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    pruners = [(got, refused) for _, got, refused in results if refused < 20]
    assert len(pruners) == 1  # the other was refused every round: the lease lasts 30 s
    assert sorted(pruners[0][0]) == sorted(old) and pruners[0][1] == 0  # each job pruned once
    assert store.existing(old) == set()
    assert not any((config.jobs_dir / job_id).exists() for job_id in old)


@pytest.mark.parametrize(("value", "seconds"), [("P7D", 7 * DAY), ("PT12H", 43200.0), ("3600", 3600.0)])
def test_retention_reads_a_duration(value: str, seconds: float) -> None:
    assert AdaptSettings(job_retention=value).job_retention.total_seconds() == seconds


def test_a_retention_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="job_retention"):
        AdaptSettings(job_retention=0)


def test_queued_state_is_kept_by_the_store(store_url: str) -> None:
    store = JobStore(store_url)
    job = store.create({"name": "x"}, corpus_dir="/c", n_documents=1, max_pending=1, max_attempts=1)
    assert store.prune("a", older_than_s=0, lease_s=LEASE) == [] and store.get(job.id).state == QUEUED


def test_a_replicas_rescuer_fails_orphans_and_prunes(store_url: str, tmp_path: Path) -> None:
    """The service's periodic upkeep (`AdaptAPI.upkeep`, every heartbeat) does both."""
    from service.adapt.api_state import AdaptAPI
    from service.auth import ApiKeys

    config = _config(tmp_path, store_url)
    store = JobStore(store_url)
    old = _job(store, config, "old")
    _end(store, old.id, CANCELLED)
    _age(store, old.id, 8)
    build = _job(store, config, "base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)
    waiting = _job(store, config, "acme", after_job=build.id)
    store.request_cancel(build.id)
    AdaptAPI(config, ApiKeys()).upkeep(store)
    assert store.existing([old.id, build.id, waiting.id]) == {build.id, waiting.id}
    assert not Path(old.corpus_dir).exists() and not Path(waiting.corpus_dir).exists()
    assert store.get(waiting.id).state == FAILED
