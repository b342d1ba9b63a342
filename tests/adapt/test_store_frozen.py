"""A worker frozen inside one of the store's transactions (SIGSTOP, a throttled container, a node cut off) on
PostgreSQL: its row locks must not keep its job from being taken back once its lease lapses."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from adapt_jobs.jobs import QUEUED, StoreUnavailable
from adapt_jobs.store import JobStore
from adapt_jobs.store_db import jobs_table

TIMEOUT_S = 1.0  # the store's timeout: also how long the server lets one of its transactions sit idle
FROZEN_S = 20.0  # how long the frozen worker stays frozen: far longer than its lease and the timeout


def test_a_transaction_left_idle_is_ended_by_the_server_and_the_job_is_taken_back(postgres) -> None:
    url = postgres.new_database()
    worker, rescuer = JobStore(url, timeout_s=TIMEOUT_S), JobStore(url, timeout_s=TIMEOUT_S)
    job = worker.create({"base_model": "b", "name": "m", "hyperparameters": {}}, corpus_dir="/c", n_documents=1,
                        max_pending=5, max_attempts=2)  # fmt: skip
    assert worker.claim_next("w1", max_running=1, lease_s=0.5) is not None
    locked, thawed = threading.Event(), threading.Event()
    ended: list[BaseException] = []

    def frozen_mid_transaction() -> None:  # a heartbeat's transaction, its process stopped after locking the row
        try:
            with worker._transaction(write=True) as conn:
                conn.execute(sa.select(jobs_table).where(jobs_table.c.id == job.id).with_for_update())
                locked.set()
                thawed.wait(FROZEN_S)
                conn.execute(sa.select(1))
        except BaseException as err:  # what the thawed worker meets is the finding
            ended.append(err)

    thread = threading.Thread(target=frozen_mid_transaction, daemon=True)
    thread.start()
    assert locked.wait(10)
    deadline = time.monotonic() + FROZEN_S / 2
    taken_back = []
    while not taken_back and time.monotonic() < deadline:
        taken_back = rescuer.rescue_expired()
        time.sleep(0.2)
    thawed.set()
    thread.join(30)
    assert [e.job_id for e in taken_back] == [job.id], "the frozen transaction kept the job's row locked"
    assert rescuer.get(job.id).state == QUEUED  # its second attempt is next
    assert len(ended) == 1 and isinstance(ended[0], StoreUnavailable), ended  # the thawed worker lost its session


def test_the_bound_is_set_per_transaction_and_never_left_on_the_session(postgres) -> None:
    """Behind a connection pooler in transaction mode a session setting would not follow the store's transactions
    and would reach other clients of the pooled connection: the bound is the transaction's own (SET LOCAL)."""
    store = JobStore(postgres.new_database(), timeout_s=TIMEOUT_S)
    with store._transaction() as conn:
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar_one() == "1s"
    raw = store.engine.raw_connection()  # the same pooled session, outside any store transaction
    try:
        cursor = raw.cursor()
        cursor.execute("SHOW idle_in_transaction_session_timeout")
        assert cursor.fetchone()[0] == "0"
        raw.rollback()
    finally:
        raw.close()
