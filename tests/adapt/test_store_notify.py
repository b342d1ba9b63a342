"""Wake-ups on a real PostgreSQL (LISTEN/NOTIFY): an idle worker claims a job queued by another process long before
its poll interval; an event stream's waiter hears a job's event; the listener reconnects when its connection is
killed; a rolled-back change wakes nobody; on SQLite nothing is armed and the poll stays the wake-up."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from adapt_jobs.jobs import Job, QueueFullError
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from adapt_worker.worker import Worker

POLL_S = 30.0  # far longer than any wake-up below may take
WOKEN_WITHIN_S = 5.0


def _create(store: JobStore, name: str = "n", max_pending: int = 100) -> Job:
    return store.create({"base_model": "b", "name": name}, corpus_dir="/nonexistent", n_documents=1,
                        max_pending=max_pending, max_attempts=2)  # fmt: skip


def _listening(store: JobStore) -> None:
    listener = store._listener
    assert listener is not None and listener.listening.wait(WOKEN_WITHIN_S), "the listener never connected"


def test_an_idle_worker_is_woken_by_a_job_queued_elsewhere_long_before_its_poll(postgres, tmp_path: Path) -> None:
    url = postgres.new_database()
    settings = AdaptSettings(dir=tmp_path / "adapt", store_url=url, poll_seconds=POLL_S, heartbeat_seconds=POLL_S)
    config = AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)
    ran: dict[str, float] = {}
    stop = threading.Event()
    worker = Worker(config, "idle", stop, pipeline=lambda job, ctx, config: ran.setdefault(job.id, time.monotonic()))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WOKEN_WITHIN_S
        while worker.store is None or worker.store._listener is None:
            assert time.monotonic() < deadline, "the worker never armed a wake-up"
            time.sleep(0.02)
        _listening(worker.store)
        time.sleep(0.3)  # the worker found the queue empty and waits (for POLL_S, unless woken)
        api = JobStore(url)
        queued_at = time.monotonic()
        job = _create(api)
        while job.id not in ran:
            assert time.monotonic() - queued_at < WOKEN_WITHIN_S, "the idle worker was not woken"
            time.sleep(0.02)
        assert ran[job.id] - queued_at < WOKEN_WITHIN_S < POLL_S
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()  # a waiting worker still sees its stop event at once


def test_a_stream_waiter_hears_its_jobs_events_and_a_rollback_wakes_nobody(postgres) -> None:
    url = postgres.new_database()
    store, other = JobStore(url), JobStore(url)
    job = _create(other)
    store.wake_when_claimable(lambda: None)  # starts the listener; its first connect wakes whoever waits
    _listening(store)
    heard, claimable = threading.Event(), threading.Event()
    store.wake_on_event(job.id, heard.set)
    store.wake_when_claimable(claimable.set)
    unrelated = _create(other, "unrelated")  # another job's events: not this waiter's
    assert claimable.wait(WOKEN_WITHIN_S) and not heard.wait(0.3)
    other.request_cancel(job.id)
    assert heard.wait(WOKEN_WITHIN_S)

    rolled_back = threading.Event()
    store.wake_when_claimable(rolled_back.set)
    with pytest.raises(QueueFullError):  # its insert (and its notification) rolled back
        _create(other, "refused", max_pending=1)
    assert not rolled_back.wait(1.0)
    other.request_cancel(unrelated.id)
    assert rolled_back.wait(WOKEN_WITHIN_S)


def test_the_listener_reconnects_after_losing_its_connection(postgres) -> None:
    url = postgres.new_database()
    store, other = JobStore(url), JobStore(url)
    first = threading.Event()
    store.wake_when_claimable(first.set)
    _listening(store)
    with psycopg.connect(url) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %' AND datname = "
            "current_database()"
        ).fetchall()
    assert killed and all(row[0] for row in killed)
    # whoever waited while it was down is woken on reconnect (it may have missed a notification)
    assert first.wait(WOKEN_WITHIN_S + 2)
    _listening(store)
    again = threading.Event()
    store.wake_when_claimable(again.set)
    _create(other)
    assert again.wait(WOKEN_WITHIN_S)


def test_sqlite_arms_nothing(tmp_path: Path) -> None:
    store = JobStore(f"sqlite:///{tmp_path / 'jobs.sqlite3'}")
    woken = threading.Event()
    store.wake_when_claimable(woken.set)()
    _create(store)
    assert store._listener is None and not woken.is_set()


def test_a_stream_is_woken_by_the_poll_where_notifications_never_arrive(postgres) -> None:
    """A connection pooler in transaction mode accepts LISTEN and never delivers: a stream must still hear its job's
    events within a poll, not only at its keep-alive."""
    url = postgres.new_database()
    store, other = JobStore(url, poll_s=0.05), JobStore(url)
    store._arm = lambda channel, key, wake: (lambda: None)  # LISTEN taken, nothing ever delivered
    job = _create(other)
    heard = threading.Event()
    disarm = store.wake_on_event(job.id, heard.set, after_seq=store.events(job.id)[-1].id)
    assert not heard.wait(0.3)  # nothing new yet
    other.request_cancel(job.id)
    assert heard.wait(2.0)
    disarm()
    store.close()
