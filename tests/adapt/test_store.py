"""The job store, one suite for both backends (SQLite file, real PostgreSQL): the state machine, the bounded queue,
claims under a lease, fenced writes, rescue of lapsed leases with attempts, hand-back, cancel, per-job event ids,
and the upgrade of a store written before leases."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import time
from pathlib import Path

import pytest

from adapt_jobs.jobs import (
    CANCELLED,
    EVALUATING,
    FAILED,
    HANDED_BACK,
    INTERRUPTED,
    JOB_KIND_ADAPT,
    JOB_KIND_STUDENT_BUILD,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    JobNotFound,
    JobStoreError,
    LeaseLost,
    QueueFullError,
    StoreUnavailable,
)
from adapt_jobs.store import JobStore

LEASE = 30.0


def _params(name: str = "m") -> dict:
    return {"base_model": "minilm-l6", "name": name, "hyperparameters": {}}


def _create(store: JobStore, name: str = "m", *, max_pending: int = 100, max_attempts: int = 2):
    return store.create(
        _params(name), corpus_dir="/c", n_documents=1, max_pending=max_pending, max_attempts=max_attempts
    )


def test_lifecycle_records_states_progress_result_and_the_attempt(store_url: str) -> None:
    store = JobStore(store_url)
    job = _create(store)
    assert job.state == QUEUED and job.id.startswith("adaptjob-") and job.attempt == 0
    claimed = store.claim_next("w1", max_running=1, lease_s=LEASE)
    assert claimed is not None and claimed.id == job.id and claimed.state == RUNNING
    assert claimed.worker_id == "w1" and claimed.attempt == 1 and claimed.started_at is not None
    assert claimed.lease_expires_at == pytest.approx(claimed.heartbeat_at + LEASE)
    lease = claimed.lease
    store.update_progress(lease, {"step": 3, "total": 10, "loss": 1.5})
    store.update_progress(lease, {"step": 4})
    store.set_state(lease, EVALUATING)
    store.update_result(lease, {"model": {"name": "m", "version": "1", "promoted": True}}, event_type="published")
    store.finish(lease, SUCCEEDED)
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.finished_at is not None and done.terminal
    assert done.worker_id is None and done.lease_expires_at is None  # nobody holds an ended job
    assert done.progress == {"step": 4, "total": 10, "loss": 1.5}
    assert done.result["model"]["version"] == "1"
    assert [(a["attempt"], a["worker_id"], a["outcome"]) for a in done.attempts] == [(1, "w1", SUCCEEDED)]
    events = store.events(job.id)
    assert [e.id for e in events] == list(range(1, 9))  # the job's own sequence: what SSE resumes from
    assert [(e.type, e.data.get("state")) for e in events] == [
        ("state", QUEUED), ("audit", None), ("state", RUNNING), ("progress", None), ("progress", None),
        ("state", EVALUATING), ("published", None), ("state", SUCCEEDED),
    ]  # fmt: skip
    assert [e.type for e in store.events(job.id, after_id=5)] == ["state", "published", "state"]


def test_illegal_transitions_raise(store_url: str) -> None:
    store = JobStore(store_url)
    job = _create(store)
    lease = store.claim_next("w", max_running=1, lease_s=LEASE).lease
    with pytest.raises(JobStoreError, match="needs a reason"):
        store.finish(lease, FAILED)
    with pytest.raises(JobStoreError, match="needs a terminal state"):
        store.finish(lease, RUNNING)
    store.finish(lease, FAILED, reason="training", message="boom")
    assert store.get(job.id).error == {"reason": "training", "message": "boom"}
    with pytest.raises(LeaseLost):  # an ended job is held by nobody
        store.finish(lease, SUCCEEDED)
    with pytest.raises(JobStoreError, match="no adapt job"):
        store.get("adaptjob-missing")


def test_queue_is_bounded_and_claims_respect_the_concurrency_limit(store_url: str) -> None:
    store = JobStore(store_url)
    a, b = _create(store, "a", max_pending=2), _create(store, "b", max_pending=2)
    with pytest.raises(QueueFullError, match="2 jobs pending, limit 2"):
        _create(store, "c", max_pending=2)
    first = store.claim_next("w1", max_running=1, lease_s=LEASE)
    assert first is not None and first.id == a.id  # oldest first
    assert store.claim_next("w2", max_running=1, lease_s=LEASE) is None  # limit 1 holds across workers
    store.finish(first.lease, SUCCEEDED)
    second = store.claim_next("w2", max_running=1, lease_s=LEASE)
    assert second is not None and second.id == b.id
    assert store.claim_next("w2", max_running=5, lease_s=LEASE) is None  # nothing queued
    assert store.count_by_state()[RUNNING] == 1


def _claim_all(url: str, worker: str, out: multiprocessing.Queue) -> None:
    store = JobStore(url)
    got = []
    while (job := store.claim_next(worker, max_running=100, lease_s=LEASE)) is not None:
        got.append(job.id)
    out.put(got)


def test_concurrent_workers_never_claim_the_same_job(store_url: str) -> None:
    store = JobStore(store_url)
    ids = {_create(store).id for _ in range(30)}
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(store_url, f"w{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    claimed = [job for _ in procs for job in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
    assert sorted(claimed) == sorted(ids)  # every job once, none twice


def test_writes_are_fenced_by_the_lease(store_url: str) -> None:
    store = JobStore(store_url)
    job = _create(store)
    lease = store.claim_next("w1", max_running=1, lease_s=0.3).lease
    time.sleep(0.5)
    assert [e.state for e in store.rescue_expired()] == [QUEUED]
    retry = store.claim_next("w2", max_running=1, lease_s=LEASE)
    assert retry.attempt == 2
    for write in (
        lambda: store.update_progress(lease, {"step": 9}),
        lambda: store.update_result(lease, {"x": 1}),
        lambda: store.set_state(lease, EVALUATING),
        lambda: store.renew(lease, LEASE),
        lambda: store.finish(lease, SUCCEEDED),
        lambda: store.hand_back(lease, "stopping"),
    ):
        with pytest.raises(LeaseLost, match="no longer holds attempt 1"):
            write()
    after = store.get(job.id)
    assert after.state == RUNNING and after.worker_id == "w2" and after.progress == {}


def test_a_renewed_lease_is_never_taken_and_a_lapsed_one_is_retried_then_failed(store_url: str) -> None:
    store = JobStore(store_url)
    job = _create(store, max_attempts=2)
    lease = store.claim_next("w1", max_running=1, lease_s=0.6).lease
    for _ in range(3):  # the heartbeat keeps it: nobody takes a job whose lease another process holds
        time.sleep(0.3)
        store.renew(lease, 0.6)
        assert store.rescue_expired() == []
    time.sleep(0.8)
    (ended,) = store.rescue_expired()
    assert (ended.job_id, ended.state) == (job.id, QUEUED)
    second = store.claim_next("w2", max_running=1, lease_s=0.2)
    assert second.attempt == 2
    time.sleep(0.4)
    assert [e.state for e in store.rescue_expired()] == [FAILED]
    failed = store.get(job.id)
    assert failed.state == FAILED and failed.error["reason"] == INTERRUPTED
    assert "interrupted 2 time(s)" in failed.error["message"]
    assert [(a["worker_id"], a["outcome"]) for a in failed.attempts] == [("w1", INTERRUPTED), ("w2", INTERRUPTED)]
    retries = [e.data for e in store.events(job.id) if e.type == "state" and e.data.get("reason") == INTERRUPTED]
    assert [r["attempt"] for r in retries] == [1, 2] and "retry" in retries[0] and "error" in retries[1]


def test_hand_back_requeues_without_spending_an_attempt(store_url: str) -> None:
    store = JobStore(store_url)
    job = _create(store, max_attempts=1)
    store.hand_back(store.claim_next("w1", max_running=1, lease_s=LEASE).lease, "the worker is stopping")
    queued = store.get(job.id)
    assert queued.state == QUEUED and queued.worker_id is None
    lease = store.claim_next("w2", max_running=1, lease_s=0.2).lease
    assert lease.attempt == 2
    time.sleep(0.4)
    # max_attempts=1: the first interrupted attempt ends it; the handed-back one did not count
    assert [e.state for e in store.rescue_expired()] == [FAILED]
    assert [a["outcome"] for a in store.get(job.id).attempts] == [HANDED_BACK, INTERRUPTED]
    cancelled = _create(store)
    held = store.claim_next("w3", max_running=9, lease_s=LEASE)
    store.request_cancel(cancelled.id)
    store.hand_back(held.lease, "the worker is stopping")  # a pending cancel wins over the queue
    assert store.get(cancelled.id).state == CANCELLED


def test_release_worker_takes_back_only_that_workers_jobs(store_url: str) -> None:
    store = JobStore(store_url)
    a, b = _create(store), _create(store)
    store.claim_next("w1", max_running=9, lease_s=LEASE)
    store.claim_next("w2", max_running=9, lease_s=LEASE)
    ended = store.release_worker("w1", "the worker process exited with code -9")
    assert [(e.job_id, e.state) for e in ended] == [(a.id, QUEUED)]
    assert store.get(b.id).state == RUNNING and store.get(b.id).worker_id == "w2"


def test_cancel_queued_is_immediate_running_is_a_request_dead_worker_ends_cancelled(store_url: str) -> None:
    store = JobStore(store_url)
    first, second, third = _create(store), _create(store), _create(store)
    store.claim_next("w", max_running=9, lease_s=LEASE)
    running = store.claim_next("w2", max_running=9, lease_s=0.2)
    assert store.request_cancel(third.id).state == CANCELLED
    job = store.request_cancel(running.id)
    assert job.state == RUNNING and job.cancel_requested and store.cancel_requested(running.id)
    assert not store.cancel_requested(first.id)
    time.sleep(0.4)
    assert [(e.job_id, e.state) for e in store.rescue_expired()] == [(second.id, CANCELLED)]
    assert store.request_cancel(second.id).state == CANCELLED  # finished: a no-op


def test_only_the_first_cancel_of_a_job_is_recorded(store_url: str) -> None:
    store = JobStore(store_url)
    running, queued = _create(store), _create(store)
    assert store.claim_next("w", max_running=9, lease_s=LEASE).id == running.id
    first, asked = store.cancel(running.id, actor="k1")
    assert asked and first.state == RUNNING and first.cancel_requested
    for _ in range(2):  # asked again while the worker stops: the job unchanged, nothing recorded
        again, asked = store.cancel(running.id, actor="k2")
        assert not asked and again == first
    assert [(e.type, e.data.get("actor")) for e in store.events(running.id)][-2:] == [
        ("audit", "k1"), ("cancel_requested", None),
    ]  # fmt: skip
    cancelled, asked = store.cancel(queued.id, actor="k1")
    assert asked and cancelled.state == CANCELLED
    assert store.cancel(queued.id, actor="k2") == (cancelled, False)
    audits = [e.data["actor"] for e in store.events(queued.id) if e.type == "audit"]
    assert audits == [None, "k1"]  # created (no key), cancelled once


def test_list_pages_newest_first(store_url: str) -> None:
    store = JobStore(store_url)
    ids = [_create(store).id for _ in range(5)]
    page = store.list_jobs(limit=2)
    assert [j.id for j in page] == ids[::-1][:2]
    assert [j.id for j in store.list_jobs(limit=10, after=page[-1].id)] == ids[::-1][2:]
    store.request_cancel(ids[0])
    assert [j.id for j in store.list_jobs(state=CANCELLED)] == [ids[0]]
    assert store.list_jobs(after=ids[0]) == []  # the oldest job: the listing's true end
    with pytest.raises(JobNotFound, match="'adaptjob-gone' to list after"):  # not an empty page: not the end
        store.list_jobs(after="adaptjob-gone")


def test_a_second_process_opening_the_store_sees_the_same_jobs(store_url: str) -> None:
    first = JobStore(store_url)
    job = _create(first)
    second = JobStore(store_url)  # migrations already at head: a no-op
    assert second.get(job.id).state == QUEUED and second.count_by_state()[QUEUED] == 1


def _build(store: JobStore, name: str = "base--sct-tiny"):
    return store.create(
        _params(name), corpus_dir="/b", n_documents=0, max_pending=100, max_attempts=2, kind=JOB_KIND_STUDENT_BUILD,
        reuse_active=True,
    )  # fmt: skip


def test_a_job_waits_for_its_dependency_and_one_build_serves_every_waiting_job(store_url: str) -> None:
    store = JobStore(store_url)
    build = _build(store)
    assert build.kind == JOB_KIND_STUDENT_BUILD and build.after_job is None
    assert _build(store).id == build.id  # queued: asked again, the same build
    assert _build(store, "other--sct-tiny").id != build.id  # another student, another build
    waiting = store.create(_params("a"), corpus_dir="/c", n_documents=1, max_pending=100, max_attempts=2,
                           after_job=build.id)  # fmt: skip
    assert waiting.kind == JOB_KIND_ADAPT and waiting.after_job == build.id
    first = store.claim_next("w1", max_running=3, lease_s=LEASE)
    assert first is not None and first.id == build.id
    assert _build(store).id == build.id  # running: still the same build
    second = store.claim_next("w2", max_running=3, lease_s=LEASE)
    assert second is not None and second.id != waiting.id  # the other build; the waiting job is skipped
    assert store.claim_next("w3", max_running=3, lease_s=LEASE) is None
    store.finish(first.lease, SUCCEEDED)
    third = store.claim_next("w3", max_running=3, lease_s=LEASE)
    assert third is not None and third.id == waiting.id
    assert _build(store).id != build.id  # ended: asking again queues a new build


def test_a_unique_index_holds_one_active_build_per_name(store_url: str) -> None:
    """The database refuses a second active build of a name however it is written; `create` answers with the build
    that exists, even when the queue is full, and refuses anything but a build to reuse."""
    import sqlalchemy as sa

    from adapt_jobs.store_db import jobs_table

    store = JobStore(store_url)
    build = _build(store)
    with store.engine.connect() as conn:
        row = {c: v for c, v in conn.execute(sa.select(jobs_table)).one()._mapping.items() if c != "seq"}
    with pytest.raises(sa.exc.IntegrityError), store.engine.begin() as conn:
        conn.execute(sa.insert(jobs_table).values({**row, "id": "adaptjob-duplicate"}))
    full = store.create(_params("base--sct-tiny"), corpus_dir="/b", n_documents=0, max_pending=1, max_attempts=2,
                        kind=JOB_KIND_STUDENT_BUILD, reuse_active=True)  # fmt: skip
    assert full.id == build.id
    with pytest.raises(QueueFullError):
        store.create(_params("x--sct-tiny"), corpus_dir="/b", n_documents=0, max_pending=1, max_attempts=2,
                     kind=JOB_KIND_STUDENT_BUILD, reuse_active=True)  # fmt: skip
    with pytest.raises(JobStoreError, match="reuse_active"):
        store.create(_params(), corpus_dir="/c", n_documents=1, max_pending=9, max_attempts=2, reuse_active=True)
    assert [j.id for j in store.list_jobs()] == [build.id]


def _after_build(store: JobStore, name: str = "a", *, max_pending: int = 100):
    return store.create_after_build(_params("base--sct-tiny"), _params(name), build_dir="/b", corpus_dir="/c",
                                    n_documents=1, max_pending=max_pending, max_attempts=2)  # fmt: skip


def test_a_job_and_the_build_it_waits_for_are_queued_together_or_not_at_all(store_url: str) -> None:
    store = JobStore(store_url)
    _create(store, "x")
    with pytest.raises(QueueFullError):  # room for one: the build and the job need two
        _after_build(store, max_pending=2)
    assert [j.params["name"] for j in store.list_jobs()] == ["x"]
    build, job = _after_build(store, max_pending=3)
    assert build.kind == JOB_KIND_STUDENT_BUILD and build.state == QUEUED and build.corpus_dir == "/b"
    assert job.kind == JOB_KIND_ADAPT and job.after_job == build.id and job.state == QUEUED
    assert [e.type for e in store.events(build.id)] == [e.type for e in store.events(job.id)] == ["state", "audit"]
    with pytest.raises(QueueFullError):  # the build is reused, and the job alone has no room
        _after_build(store, "b", max_pending=3)
    again, other = _after_build(store, "b", max_pending=4)  # room for the job: it waits for the same build
    assert again.id == build.id and other.after_job == build.id
    assert [j.params["name"] for j in store.list_jobs()] == ["b", "a", "base--sct-tiny", "x"]


def test_a_job_whose_dependency_failed_fails_with_the_reason(store_url: str) -> None:
    store = JobStore(store_url)
    build = _build(store)
    waiting = store.create(_params("a"), corpus_dir="/c", n_documents=1, max_pending=100, max_attempts=2,
                           after_job=build.id)  # fmt: skip
    claimed = store.claim_next("w1", max_running=1, lease_s=LEASE)
    store.finish(claimed.lease, FAILED, reason="training", message="training failed: the loss diverged")
    assert store.claim_next("w1", max_running=1, lease_s=LEASE) is None  # never claimed: its build failed
    assert store.fail_dependants() == []  # failed by the transition that failed its build, not by a later sweep
    failed = store.get(waiting.id)
    assert failed.state == FAILED and failed.error["reason"] == "dependency"
    assert build.id in failed.error["message"] and "the loss diverged" in failed.error["message"]
    assert [e.data["state"] for e in store.events(waiting.id) if e.type == "state"] == [QUEUED, FAILED]


def test_a_store_lost_during_the_commit_says_the_outcome_is_unknown(store_url: str) -> None:
    """A connection lost before the commit rolls the transaction back (`StoreUnavailable`); one lost during the
    commit may have applied it (`CommitUnknown`), which a caller that queued a job must not take for a refusal."""
    import sqlalchemy as sa

    from adapt_jobs.store_core import CommitUnknown

    store = JobStore(store_url)

    def lost(*args: object) -> None:
        raise sa.exc.OperationalError("COMMIT", {}, ConnectionResetError("server closed the connection"))

    sa.event.listen(store.engine, "commit", lost)
    with pytest.raises(CommitUnknown, match="server closed the connection"):
        _create(store)
    sa.event.remove(store.engine, "commit", lost)
    sa.event.listen(store.engine, "before_execute", lost)
    with pytest.raises(StoreUnavailable) as raised:
        _create(store)
    assert not isinstance(raised.value, CommitUnknown)
    sa.event.remove(store.engine, "before_execute", lost)
    assert _create(store).state == QUEUED and len(store.list_jobs()) == 1  # the failed commits applied nothing here


def test_a_database_restart_is_unavailable_then_usable_again(postgres) -> None:
    store = JobStore(postgres.new_database(), timeout_s=2)
    job = _create(store)
    postgres.stop()  # immediate: like a crash, the pooled connections break
    try:
        with pytest.raises(StoreUnavailable, match=r"unavailable|lost"):
            store.get(job.id)
    finally:
        postgres.start()
    assert store.get(job.id).state == QUEUED  # pre-ping replaced the dead connections
    with pytest.raises(StoreUnavailable):
        JobStore("postgresql://postgres@127.0.0.1:1/nothing", timeout_s=2)


def test_unsupported_url_says_what_to_use() -> None:
    with pytest.raises(JobStoreError, match="use postgresql://user:password@host/db"):
        JobStore("mysql://u@h/db")


def test_a_store_written_before_leases_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite3"
    legacy = sqlite3.connect(path)
    legacy.executescript(
        """
        CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, state TEXT NOT NULL,
            created_at REAL NOT NULL, started_at REAL, finished_at REAL, params TEXT NOT NULL, corpus_dir TEXT NOT NULL,
            n_documents INTEGER NOT NULL, progress TEXT NOT NULL DEFAULT '{}', result TEXT NOT NULL DEFAULT '{}',
            error TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0, worker_id TEXT, heartbeat_at REAL);
        CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT NULL, created_at REAL NOT NULL,
            type TEXT NOT NULL, data TEXT NOT NULL);
        """
    )
    legacy.execute(
        "INSERT INTO jobs (id, state, created_at, finished_at, params, corpus_dir, n_documents, error) "
        "VALUES ('adaptjob-old', 'failed', 1.0, 2.0, ?, '/c', 80, ?)",
        (json.dumps(_params("old")), json.dumps({"reason": "training", "message": "boom"})),
    )
    legacy.execute("INSERT INTO jobs (id, state, created_at, params, corpus_dir, n_documents) "
                   "VALUES ('adaptjob-queued', 'queued', 3.0, ?, '/c', 80)", (json.dumps(_params("q")),))  # fmt: skip
    for job_id, state in (("adaptjob-old", "queued"), ("adaptjob-old", "failed"), ("adaptjob-queued", "queued")):
        legacy.execute("INSERT INTO events (job_id, created_at, type, data) VALUES (?, 1.0, 'state', ?)",
                       (job_id, json.dumps({"state": state})))  # fmt: skip
    legacy.commit()
    legacy.close()

    store = JobStore(f"sqlite:///{path}")
    old = store.get("adaptjob-old")
    assert old.state == FAILED and old.error == {"reason": "training", "message": "boom"}
    assert old.params["name"] == "old"
    assert [e.data["state"] for e in store.events("adaptjob-old")] == ["queued", "failed"]
    claimed = store.claim_next("w", max_running=1, lease_s=LEASE)  # the old queued job runs under the new rules
    assert claimed.id == "adaptjob-queued" and claimed.attempt == 1
    assert [e.id for e in store.events("adaptjob-queued")] == [1, 2]


def test_a_last_attempt_interrupted_while_publishing_is_queued_once_more(store_url: str) -> None:
    """Its version may be in the registry, maybe served: a ``failed`` record would say no model came of the job. One
    more attempt (which ends the job with that version); interrupted again, the job fails."""
    store = JobStore(store_url)
    job = _create(store, max_attempts=1)
    lease = store.claim_next("w1", max_running=1, lease_s=0.3).lease
    assert store.begin_publish(lease, 0.3)
    time.sleep(0.5)
    (ended,) = store.rescue_expired()
    assert (ended.job_id, ended.state) == (job.id, QUEUED)
    retry = [e.data["retry"] for e in store.events(job.id) if e.type == "state" and "retry" in e.data]
    assert retry == ["attempt 1, the last of 1, was interrupted after it began publishing: queued once more to end "
                     "the job with the version it published"]  # fmt: skip
    second = store.claim_next("w2", max_running=1, lease_s=0.2)
    assert second.attempt == 2
    time.sleep(0.4)
    assert [e.state for e in store.rescue_expired()] == [FAILED]  # once more, not for ever
    unpublished = _create(store, max_attempts=1)
    store.claim_next("w3", max_running=1, lease_s=0.2)
    time.sleep(0.4)
    assert [(e.job_id, e.state) for e in store.rescue_expired()] == [(unpublished.id, FAILED)]
