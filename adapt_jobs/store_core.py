"""The job store's plumbing, beneath `adapt_jobs.store.JobStore`: the engine and its transactions, the schema's
migration, the database clock, and the guarded transition every state change goes through. Used by `adapt_jobs.store`
and `adapt_jobs.store_upkeep` only.

The transition does what a change of state implies, in the same transaction: its ``state`` event; when a job fails or
is cancelled, the queued jobs waiting for it fail (reason ``dependency``, with a ``corpus_removed`` event); and the
folder of every job that ended (corpus and scratch, unless ``keep_uploads``) or was pruned is deleted once the
transaction has committed. A crash between the commit and the delete leaves a folder of an ended job, which the prune
past its retention deletes."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from adapt_jobs.jobs import (
    ACTIVE_STATES,
    CANCELLED,
    CORPUS_REMOVED_EVENT,
    DEPENDENCY_FAILED,
    FAILED,
    PRUNED,
    QUEUED,
    TERMINAL_STATES,
    TRANSITIONS,
    Ended,
    JobNotFound,
    JobStoreError,
    Lease,
    LeaseLost,
    StoreUnavailable,
)
from adapt_jobs.store_db import db_now, engine_url, events_table, jobs_table, make_engine
from adapt_jobs.store_notify import CLAIMABLE_CHANNEL, EVENTS_CHANNEL, EventPoller, Listener

# PostgreSQL transaction advisory-lock keys: serialise the checks that count rows (jobs pending, jobs running),
# migrations, and the grant of a named lease.
CREATE_LOCK, CLAIM_LOCK, MIGRATE_LOCK, LEASE_LOCK = 0x616470_01, 0x616470_02, 0x616470_03, 0x616470_04

_ENDED = "adapt_ended"  # the connection's list of jobs its transaction ended or pruned: their folders go on commit
_DEPENDANT_CORPUS = (
    "the job it waited for did not succeed, so this job will never run: its corpus was deleted (failed on dependency)"
)


class CommitUnknown(StoreUnavailable):
    """The store was lost while a transaction committed: its writes may or may not have been applied (a caller that
    queued a job must not act as if it was refused)."""


class StoreCore:
    """The engine and the helpers every store method uses."""

    def __init__(self, url: str, *, timeout_s: float = 30.0, keep_uploads: bool = False, poll_s: float = 0.5) -> None:
        """``timeout_s``: how long a call waits for the store (to connect, for a pooled connection, for SQLite's
        lock), and on PostgreSQL how long the server lets a transaction of this store sit idle before it ends the
        session (its process frozen or cut off: its row locks would keep the job from being taken back).
        ``keep_uploads``: an ended job keeps its folder until it is pruned past its retention (default: the folder is
        deleted when the job ends). ``poll_s``: how often the event poller of a SQLite store reads the event counters
        of the jobs streamed from this process (`wake_on_event`)."""
        self.url = engine_url(url)
        self.keep_uploads = keep_uploads
        self.engine = make_engine(self.url, timeout_s)
        self.postgresql = self.url.get_backend_name() == "postgresql"
        self._timeout_s = timeout_s
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self._poller = EventPoller(self._event_seqs, poll_s)
        self._migrate()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._poller.close()
        self.engine.dispose()

    # ---------------------------------------------------------------- wake-ups (PostgreSQL LISTEN/NOTIFY)
    def wake_when_claimable(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` once when a job may have become claimable (queued, back in the queue, or one ended); returns
        the function that disarms it. PostgreSQL only (`adapt_jobs.store_notify`); on SQLite nothing calls it, and the
        caller's poll interval is the wake-up."""
        return self._arm(CLAIMABLE_CHANNEL, "", wake)

    def wake_on_event(self, job_id: str, wake: Callable[[], None], after_seq: int | None = None) -> Callable[[], None]:
        """Call ``wake`` when an event of ``job_id`` is committed; returns the function that disarms it. PostgreSQL:
        its notification. Given ``after_seq`` (the last event id the caller read), also the first poll of
        `EventPoller` that finds a later event — one query per poll for every stream of the process: SQLite's only
        wake-up, and PostgreSQL's when notifications do not arrive (a pooler in transaction mode drops LISTEN).
        ``wake`` may be called by both: it must be idempotent."""
        if after_seq is None:
            return self._arm(EVENTS_CHANNEL, job_id, wake)
        polled = self._poller.arm(job_id, after_seq, wake)
        if not self.postgresql:
            return polled
        notified = self._arm(EVENTS_CHANNEL, job_id, wake)

        def disarm() -> None:
            polled()
            notified()

        return disarm

    def _event_seqs(self, job_ids: list[str]) -> dict[str, int]:
        """The event counters of ``job_ids`` (a job that no longer exists is left out)."""
        seqs: dict[str, int] = {}
        with self._transaction() as conn:
            for start in range(0, len(job_ids), 500):
                chunk = job_ids[start : start + 500]
                rows = conn.execute(
                    sa.select(jobs_table.c.id, jobs_table.c.event_seq).where(jobs_table.c.id.in_(chunk))
                ).all()
                seqs.update({row.id: int(row.event_seq) for row in rows})
        return seqs

    def _arm(self, channel: str, key: str, wake: Callable[[], None]) -> Callable[[], None]:
        if not self.postgresql:
            return lambda: None
        with self._listener_lock:
            if self._listener is None:
                self._listener = Listener(self.url, self._timeout_s)
        return self._listener.arm(channel, key, wake)

    def _notify(self, conn: Connection, channel: str, payload: str = "") -> None:
        """Sent when the transaction commits (and not at all if it rolls back)."""
        if self.postgresql:
            conn.execute(sa.select(sa.func.pg_notify(channel, payload)))

    def describe(self) -> str:
        """The store for logs: backend and place, never the password."""
        return self.url.render_as_string(hide_password=True)

    # ---------------------------------------------------------------- plumbing
    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[Connection]:
        ended: list[Ended] = []
        committing = False
        try:
            with self.engine.connect() as conn:
                conn.execution_options(write=write)
                conn.info[_ENDED] = ended
                try:
                    with conn.begin():
                        yield conn
                        committing = True  # the body is done: only the commit is left
                finally:
                    conn.info.pop(_ENDED, None)
        except (OperationalError, sa.exc.InterfaceError) as err:
            unavailable = CommitUnknown if committing else StoreUnavailable
            raise unavailable(f"the adapt job store is unavailable: {err.orig or err}") from err
        except DBAPIError as err:
            if err.connection_invalidated:
                unavailable = CommitUnknown if committing else StoreUnavailable
                raise unavailable(f"the adapt job store connection was lost: {err.orig or err}") from err
            raise
        self._free(ended)  # committed: the jobs' folders are no one's any more

    def _free(self, ended: Iterable[Ended]) -> None:
        """Delete the folders (corpus and scratch) of jobs that ended — unless ``keep_uploads`` — or were pruned; a job
        back in the queue keeps its corpus for the next attempt."""
        for job in ended:
            if job.state == PRUNED or (job.state in TERMINAL_STATES and not self.keep_uploads):
                shutil.rmtree(job.corpus_dir, ignore_errors=True)

    @staticmethod
    def _ended(conn: Connection, job_id: str, state: str, corpus_dir: str) -> Ended:
        """Note that this transaction ended (or pruned) a job: its folder is freed once the transaction commits."""
        ended = Ended(job_id, state, corpus_dir)
        conn.info[_ENDED].append(ended)
        return ended

    def _serialize(self, conn: Connection, key: int) -> None:
        """PostgreSQL: one transaction at a time past this point (SQLite's BEGIN IMMEDIATE already is)."""
        if self.postgresql:
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def _migrate(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
        with self._transaction(write=True) as conn:
            self._serialize(conn, MIGRATE_LOCK)
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    @staticmethod
    def _now(conn: Connection) -> float:
        return float(conn.execute(sa.select(db_now())).scalar_one())

    @staticmethod
    def _row(conn: Connection, job_id: str, *, lock: bool = False) -> sa.Row[Any]:
        query = sa.select(jobs_table).where(jobs_table.c.id == job_id)
        row = conn.execute(query.with_for_update() if lock else query).first()
        if row is None:
            raise JobNotFound(f"no adapt job with id {job_id!r}")
        return row

    def _add_event(self, conn: Connection, job_id: str, type_: str, data: dict[str, Any], now: float) -> int:
        # The job's own counter, bumped under its row lock: event ids of one job are in commit order, so an SSE
        # client resuming after id n never misses an event committed later with a smaller id.
        seq = conn.execute(
            sa.update(jobs_table)
            .where(jobs_table.c.id == job_id)
            .values(event_seq=jobs_table.c.event_seq + 1)
            .returning(jobs_table.c.event_seq)
        ).scalar_one()
        conn.execute(sa.insert(events_table).values(job_id=job_id, seq=seq, created_at=now, type=type_, data=data))
        self._notify(conn, EVENTS_CHANNEL, job_id)
        return int(seq)

    def _transition(
        self, conn: Connection, job: sa.Row[Any], state: str, now: float, data: dict[str, Any] | None = None,
        **values: Any,
    ) -> None:  # fmt: skip
        """One guarded UPDATE: the row must still be in the state it was read in. What the move implies comes with it:
        the ``state`` event, the jobs waiting for one that failed or was cancelled fail, and an ended job's folder is
        freed after the commit."""
        current = job.state
        if state not in TRANSITIONS.get(current, ()):
            raise JobStoreError(f"adapt job {job.id} cannot go from {current!r} to {state!r}")
        if state in TERMINAL_STATES:
            values["finished_at"] = now
        if state not in ACTIVE_STATES:  # nobody holds a queued or ended job
            values.update(worker_id=None, lease_expires_at=None)
        done = conn.execute(
            sa.update(jobs_table)
            .where(jobs_table.c.id == job.id, jobs_table.c.state == current)
            .values(state=state, **values)
        )
        if done.rowcount != 1:
            raise JobStoreError(f"adapt job {job.id} changed state while it was being moved to {state!r}")
        self._add_event(conn, job.id, "state", {"state": state, **(data or {})}, now)
        if state == QUEUED or state in TERMINAL_STATES:  # a job to take, a slot freed, or a dependency ended
            self._notify(conn, CLAIMABLE_CHANNEL)
        if state in TERMINAL_STATES:
            self._ended(conn, job.id, state, job.corpus_dir)
        if state in (FAILED, CANCELLED):
            waiting = conn.execute(
                sa.select(jobs_table)
                .where(jobs_table.c.after_job == job.id, jobs_table.c.state == QUEUED)
                .order_by(jobs_table.c.seq)
                .with_for_update(skip_locked=True)  # one locked elsewhere is failed by the sweep (`fail_dependants`)
            ).all()
            for row in waiting:
                self._fail_dependant(conn, row, state, values.get("error"), now)

    def _fail_dependant(
        self, conn: Connection, row: sa.Row[Any], dependency_state: str, dependency_error: dict[str, Any] | None,
        now: float,
    ) -> None:  # fmt: skip
        """End ``failed`` (reason ``dependency``) a queued job whose `after_job` failed or was cancelled: it will never
        run, so its corpus goes too (a ``corpus_removed`` event says why, unless ``keep_uploads``)."""
        why = (dependency_error or {}).get("message") or dependency_state
        error = {
            "reason": DEPENDENCY_FAILED,
            "message": f"job {row.after_job}, which this job waited for, ended {dependency_state}: {why}",
        }
        self._transition(conn, row, FAILED, now, {"error": error}, error=error)
        if not self.keep_uploads:
            self._add_event(conn, row.id, CORPUS_REMOVED_EVENT, {"reason": _DEPENDANT_CORPUS}, now)

    def _held(self, conn: Connection, lease: Lease) -> sa.Row[Any]:
        """The job row, locked, if ``lease`` still holds it; else `LeaseLost`."""
        row = conn.execute(
            sa.select(jobs_table)
            .where(
                jobs_table.c.id == lease.job_id,
                jobs_table.c.worker_id == lease.worker_id,
                jobs_table.c.attempt == lease.attempt,
                jobs_table.c.state.in_(ACTIVE_STATES),
            )
            .with_for_update()
        ).first()
        if row is None:
            raise LeaseLost(
                f"adapt job {lease.job_id}: worker {lease.worker_id} no longer holds attempt {lease.attempt}"
            )
        return row
