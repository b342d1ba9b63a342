"""The SQLite job store: state machine, bounded queue, atomic claims, cancel, recovery, events."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from adapt.store import (
    CANCELLED,
    EVALUATING,
    FAILED,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    JobStore,
    JobStoreError,
    QueueFullError,
)


def _params(name: str = "m") -> dict:
    return {"base_model": "minilm-l6", "name": name, "hyperparameters": {}}


def _store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.sqlite3")


def test_lifecycle_records_states_progress_and_result(tmp_path: Path) -> None:
    store = _store(tmp_path)
    job = store.create(_params(), corpus_dir=tmp_path / "c", n_documents=10, max_pending=4)
    assert job.state == QUEUED and job.id.startswith("adaptjob-")
    claimed = store.claim_next("w1", max_running=1)
    assert claimed is not None and claimed.id == job.id and claimed.state == RUNNING
    assert claimed.worker_id == "w1" and claimed.started_at is not None
    store.update_progress(job.id, {"step": 3, "total": 10, "loss": 1.5})
    store.update_progress(job.id, {"step": 4})
    store.set_state(job.id, EVALUATING)
    store.update_result(job.id, {"model": {"name": "m", "version": "1", "promoted": True}}, event_type="published")
    store.finish(job.id, SUCCEEDED)
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.finished_at is not None and done.terminal
    assert done.progress == {"step": 4, "total": 10, "loss": 1.5}
    assert done.result["model"]["version"] == "1"
    kinds = [(e.type, e.data.get("state")) for e in store.events(job.id)]
    assert kinds == [
        ("state", QUEUED),
        ("state", RUNNING),
        ("progress", None),
        ("progress", None),
        ("state", EVALUATING),
        ("published", None),
        ("state", SUCCEEDED),
    ]
    later = store.events(job.id, after_id=store.events(job.id)[3].id)
    assert [e.type for e in later] == ["state", "published", "state"]


def test_illegal_transitions_raise(tmp_path: Path) -> None:
    store = _store(tmp_path)
    job = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=4)
    with pytest.raises(JobStoreError, match="cannot go from 'queued' to 'evaluating'"):
        store.set_state(job.id, EVALUATING)
    store.claim_next("w", max_running=1)
    store.finish(job.id, FAILED, reason="training", message="boom")
    with pytest.raises(JobStoreError, match="cannot go from 'failed' to 'succeeded'"):
        store.finish(job.id, SUCCEEDED)
    with pytest.raises(JobStoreError, match="needs a reason"):
        store.finish(job.id, FAILED)
    with pytest.raises(JobStoreError, match="no adapt job"):
        store.get("adaptjob-missing")
    assert store.get(job.id).error == {"reason": "training", "message": "boom"}


def test_queue_is_bounded_and_claims_respect_the_concurrency_limit(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a = store.create(_params("a"), corpus_dir=tmp_path, n_documents=1, max_pending=2)
    b = store.create(_params("b"), corpus_dir=tmp_path, n_documents=1, max_pending=2)
    with pytest.raises(QueueFullError, match="2 jobs pending, limit 2"):
        store.create(_params("c"), corpus_dir=tmp_path, n_documents=1, max_pending=2)
    first = store.claim_next("w1", max_running=1)
    assert first is not None and first.id == a.id  # oldest first
    assert store.claim_next("w2", max_running=1) is None  # limit 1 holds across workers
    store.finish(a.id, SUCCEEDED)
    second = store.claim_next("w2", max_running=1)
    assert second is not None and second.id == b.id
    assert store.claim_next("w2", max_running=5) is None  # nothing queued
    assert store.count_by_state()[RUNNING] == 1


def _claim_all(path: str, worker: str, out: multiprocessing.Queue) -> None:
    store = JobStore(path)
    got = []
    while (job := store.claim_next(worker, max_running=100)) is not None:
        got.append(job.id)
    out.put(got)


def test_concurrent_workers_never_claim_the_same_job(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ids = {store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=100).id for _ in range(30)}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(str(store.path), f"w{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    claimed = [job for _ in procs for job in out.get(timeout=60)]
    for p in procs:
        p.join(timeout=60)
    assert sorted(claimed) == sorted(ids)  # every job once, none twice


def test_cancel_queued_is_immediate_running_is_a_request(tmp_path: Path) -> None:
    store = _store(tmp_path)
    queued = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=4)
    running = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=4)
    store.claim_next("w", max_running=1)  # claims `queued` (oldest)
    store.claim_next("w", max_running=2)  # and `running`
    queued2 = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=4)
    assert store.request_cancel(queued2.id).state == CANCELLED
    job = store.request_cancel(running.id)
    assert job.state == RUNNING and job.cancel_requested and store.cancel_requested(running.id)
    assert not store.cancel_requested(queued.id)
    store.finish(running.id, CANCELLED)
    assert store.request_cancel(running.id).state == CANCELLED  # finished: a no-op


def test_fail_active_marks_interrupted_jobs_of_one_worker_or_all(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=9)
    b = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=9)
    c = store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=9)
    store.claim_next("w1", max_running=9)
    store.claim_next("w2", max_running=9)
    store.set_state(b.id, EVALUATING)
    assert store.fail_active(worker_id="w1", message="worker died") == [a.id]
    assert store.get(a.id).error == {"reason": INTERRUPTED, "message": "worker died"}
    assert store.get(b.id).state == EVALUATING
    # a fresh store on the same file (a restarted service) sees the state and recovers the rest
    again = JobStore(store.path)
    assert again.fail_active() == [b.id]
    assert again.get(b.id).state == FAILED and again.get(c.id).state == QUEUED


def test_list_pages_newest_first(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ids = [store.create(_params(), corpus_dir=tmp_path, n_documents=1, max_pending=9).id for _ in range(5)]
    page = store.list_jobs(limit=2)
    assert [j.id for j in page] == ids[::-1][:2]
    assert [j.id for j in store.list_jobs(limit=10, after=page[-1].id)] == ids[::-1][2:]
    store.request_cancel(ids[0])
    assert [j.id for j in store.list_jobs(state=CANCELLED)] == [ids[0]]
