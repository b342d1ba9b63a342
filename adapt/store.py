"""The /adapt job store: one table is the whole state machine (`adapt.jobs`; tables, clock and engines in
`adapt.store_db`), shared by every replica and worker.

One interface, two backends (SQLAlchemy Core, one set of queries): PostgreSQL when scaled out
(``EMBED_ADAPT_STORE_URL=postgresql://…``), an embedded SQLite file on one machine (the default). They differ only
in how a write serialises — SQLite takes the database's write lock (``BEGIN IMMEDIATE``), PostgreSQL locks rows
(``SELECT … FOR UPDATE SKIP LOCKED``) and, for the two counted limits (pending jobs, jobs running), a transaction
advisory lock — not in the states. The schema is created and upgraded by Alembic (`adapt/migrations`), under a lock,
by whichever process opens the store first. Torch-free: the service imports it.

A worker's claim is a **lease**: its id, the attempt number and an expiry, renewed by its heartbeat. Every write a
worker makes is fenced by its lease (the row must still name it and its attempt), so a worker that lost its lease
can no longer change the job. Whoever sees a lapsed lease (any replica's rescuer, any idle worker) takes the job
back: it is queued again for a fresh attempt, or, once ``max_attempts`` attempts were interrupted, ends ``failed``
with reason ``interrupted``. A worker that stops on purpose (SIGTERM, a rolling update, a node drain) hands its job
back at once; that attempt is not counted. No process ever fails a job another live process holds. Timestamps come
from the database's clock. A job may wait for another (``after_job``: a student build): it is claimed only once
that job succeeded, and fails with reason ``dependency`` when it did not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, OperationalError

from adapt.jobs import (
    ACTIVE_STATES,
    ALL_STATES,
    CANCELLED,
    DEPENDENCY_FAILED,
    FAILED,
    HANDED_BACK,
    INTERRUPTED,
    JOB_KIND_ADAPT,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    TRANSITIONS,
    Ended,
    Event,
    Job,
    JobNotFound,
    JobStoreError,
    Lease,
    LeaseLost,
    QueueFullError,
    StoreUnavailable,
    close_attempt,
    new_job_id,
)
from adapt.store_db import db_now, engine_url, events_table, jobs_table, make_engine, row_to_job

# PostgreSQL transaction advisory-lock keys: serialise the two checks that count rows (jobs pending, jobs running).
_CREATE_LOCK, _CLAIM_LOCK, _MIGRATE_LOCK = 0x616470_01, 0x616470_02, 0x616470_03


class JobStore:
    """Jobs and their event log, shared by every process that opens the same URL."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = engine_url(url)
        self.engine = make_engine(self.url, timeout_s)
        self.postgresql = self.url.get_backend_name() == "postgresql"
        self._migrate()

    def close(self) -> None:
        self.engine.dispose()

    def describe(self) -> str:
        """The store for logs: backend and place, never the password."""
        return self.url.render_as_string(hide_password=True)

    # ---------------------------------------------------------------- plumbing
    @contextmanager
    def _transaction(self, *, write: bool = False) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                conn.execution_options(write=write)
                with conn.begin():
                    yield conn
        except (OperationalError, sa.exc.InterfaceError) as err:
            raise StoreUnavailable(f"the adapt job store is unavailable: {err.orig or err}") from err
        except DBAPIError as err:
            if err.connection_invalidated:
                raise StoreUnavailable(f"the adapt job store connection was lost: {err.orig or err}") from err
            raise

    def _serialize(self, conn: Connection, key: int) -> None:
        """PostgreSQL: one transaction at a time past this point (SQLite's BEGIN IMMEDIATE already is)."""
        if self.postgresql:
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))

    def _migrate(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
        with self._transaction(write=True) as conn:
            self._serialize(conn, _MIGRATE_LOCK)
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

    @staticmethod
    def _add_event(conn: Connection, job_id: str, type_: str, data: dict[str, Any], now: float) -> int:
        # The job's own counter, bumped under its row lock: event ids of one job are in commit order, so an SSE
        # client resuming after id n never misses an event committed later with a smaller id.
        seq = conn.execute(
            sa.update(jobs_table)
            .where(jobs_table.c.id == job_id)
            .values(event_seq=jobs_table.c.event_seq + 1)
            .returning(jobs_table.c.event_seq)
        ).scalar_one()
        conn.execute(sa.insert(events_table).values(job_id=job_id, seq=seq, created_at=now, type=type_, data=data))
        return int(seq)

    def _transition(
        self, conn: Connection, job: sa.Row[Any], state: str, now: float, data: dict[str, Any] | None = None,
        **values: Any,
    ) -> None:  # fmt: skip
        """One guarded UPDATE: the row must still be in the state it was read in."""
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

    # ---------------------------------------------------------------- API side
    def create(
        self,
        params: dict[str, Any],
        *,
        corpus_dir: Path | str,
        n_documents: int,
        max_pending: int,
        max_attempts: int,
        job_id: str | None = None,
        kind: str = JOB_KIND_ADAPT,
        after_job: str | None = None,
        reuse_active: bool = False,
    ) -> Job:
        """Queue a job, or raise :class:`QueueFullError` when ``max_pending`` jobs already wait.

        ``after_job``: the job is claimed only once that job succeeded, and fails (reason ``dependency``) when it
        failed or was cancelled. ``reuse_active``: if a queued or running job of the same ``kind`` and
        ``params["name"]`` exists, return it instead of queueing another (one build of a base student at a time,
        however many replicas ask for it at once)."""
        job_id = job_id or new_job_id()
        with self._transaction(write=True) as conn:
            self._serialize(conn, _CREATE_LOCK)
            if reuse_active:
                for row in conn.execute(
                    sa.select(jobs_table)
                    .where(jobs_table.c.kind == kind, jobs_table.c.state.in_((QUEUED, *ACTIVE_STATES)))
                    .order_by(jobs_table.c.seq)
                ).all():
                    if row.params.get("name") == params.get("name"):
                        return row_to_job(row)
            pending = conn.execute(
                sa.select(sa.func.count()).select_from(jobs_table).where(jobs_table.c.state == QUEUED)
            ).scalar_one()
            if pending >= max_pending:
                raise QueueFullError(pending, max_pending)
            now = self._now(conn)
            conn.execute(
                sa.insert(jobs_table).values(
                    id=job_id, state=QUEUED, created_at=now, params=params, corpus_dir=str(corpus_dir),
                    n_documents=n_documents, progress={}, result={}, cancel_requested=False, attempt=0,
                    max_attempts=max_attempts, attempts=[], event_seq=0, kind=kind, after_job=after_job,
                )
            )  # fmt: skip
            self._add_event(conn, job_id, "state", {"state": QUEUED}, now)
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        with self._transaction() as conn:
            return row_to_job(self._row(conn, job_id))

    def list_jobs(self, *, limit: int = 20, after: str | None = None, state: str | None = None) -> list[Job]:
        """Newest first; ``after`` is the id of the last job of the previous page."""
        query = sa.select(jobs_table)
        if after is not None:
            before = sa.select(jobs_table.c.seq).where(jobs_table.c.id == after).scalar_subquery()
            query = query.where(jobs_table.c.seq < before)
        if state is not None:
            query = query.where(jobs_table.c.state == state)
        with self._transaction() as conn:
            rows = conn.execute(query.order_by(jobs_table.c.seq.desc()).limit(limit)).all()
        return [row_to_job(row) for row in rows]

    def count_by_state(self) -> dict[str, int]:
        query = sa.select(jobs_table.c.state, sa.func.count()).group_by(jobs_table.c.state)
        with self._transaction() as conn:
            rows = conn.execute(query).all()
        counts = dict.fromkeys(ALL_STATES, 0)
        counts.update({state: n for state, n in rows})
        return counts

    def request_cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once; ask the worker to stop a running one (it checks often).

        Cancelling a finished job is a no-op that returns it unchanged.
        """
        with self._transaction(write=True) as conn:
            row = self._row(conn, job_id, lock=True)
            now = self._now(conn)
            if row.state == QUEUED:
                self._transition(conn, row, CANCELLED, now, cancel_requested=True)
            elif row.state in ACTIVE_STATES and not row.cancel_requested:
                conn.execute(sa.update(jobs_table).where(jobs_table.c.id == job_id).values(cancel_requested=True))
                self._add_event(conn, job_id, "cancel_requested", {}, now)
            return row_to_job(self._row(conn, job_id))

    def events(self, job_id: str, *, after_id: int = 0, limit: int = 500) -> list[Event]:
        query = (
            sa.select(events_table)
            .where(events_table.c.job_id == job_id, events_table.c.seq > after_id)
            .order_by(events_table.c.seq)
            .limit(limit)
        )
        with self._transaction() as conn:
            rows = conn.execute(query).all()
        return [Event(r.seq, r.job_id, r.created_at, r.type, r.data) for r in rows]

    # ------------------------------------------------------------- worker side
    def claim_next(self, worker_id: str, *, max_running: int, lease_s: float) -> Job | None:
        """Take the oldest queued job for ``worker_id`` under a lease of ``lease_s`` seconds (a new attempt).

        Returns None when nothing is queued or ``max_running`` jobs already run (the concurrency limit holds across
        every worker sharing this store).
        """
        with self._transaction(write=True) as conn:
            self._serialize(conn, _CLAIM_LOCK)
            self._fail_orphans(conn)
            running = conn.execute(
                sa.select(sa.func.count()).select_from(jobs_table).where(jobs_table.c.state.in_(ACTIVE_STATES))
            ).scalar_one()
            if running >= max_running:
                return None
            dependency = jobs_table.alias("dependency")
            ready = sa.or_(
                jobs_table.c.after_job.is_(None),
                sa.exists().where(dependency.c.id == jobs_table.c.after_job, dependency.c.state == SUCCEEDED),
            )
            row = conn.execute(
                sa.select(jobs_table)
                .where(jobs_table.c.state == QUEUED, ready)
                .order_by(jobs_table.c.seq)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            now = self._now(conn)
            attempt = row.attempt + 1
            attempts = [*row.attempts, {"attempt": attempt, "worker_id": worker_id, "started_at": now}]
            self._transition(
                conn, row, RUNNING, now, {"attempt": attempt, "worker_id": worker_id},
                started_at=row.started_at or now, worker_id=worker_id, heartbeat_at=now,
                lease_expires_at=now + lease_s, attempt=attempt, attempts=attempts, progress={}, result={},
            )  # fmt: skip
            return row_to_job(self._row(conn, row.id))

    def _fail_orphans(self, conn: Connection) -> None:
        """End ``failed`` (reason ``dependency``) every queued job whose `after_job` failed or was cancelled."""
        dependency = jobs_table.alias("dependency")
        rows = conn.execute(
            sa.select(jobs_table, dependency.c.state.label("dependency_state"), dependency.c.error.label("dep_error"))
            .join(dependency, dependency.c.id == jobs_table.c.after_job)
            .where(jobs_table.c.state == QUEUED, dependency.c.state.in_((FAILED, CANCELLED)))
            .with_for_update(of=jobs_table, skip_locked=True)
        ).all()
        now = self._now(conn) if rows else 0.0
        for row in rows:
            why = (row.dep_error or {}).get("message") or row.dependency_state
            error = {
                "reason": DEPENDENCY_FAILED,
                "message": f"job {row.after_job}, which this job waited for, ended {row.dependency_state}: {why}",
            }
            self._transition(conn, row, FAILED, now, {"error": error}, error=error)

    def renew(self, lease: Lease, lease_s: float) -> None:
        """The heartbeat: extend the lease by ``lease_s`` from now; `LeaseLost` if it is no longer ours."""
        with self._transaction(write=True) as conn:
            self._held(conn, lease)
            now = self._now(conn)
            self._touch(conn, lease, now, lease_s)

    @staticmethod
    def _touch(conn: Connection, lease: Lease, now: float, lease_s: float | None, **values: Any) -> None:
        if lease_s is not None:
            values.update(heartbeat_at=now, lease_expires_at=now + lease_s)
        if values:
            conn.execute(sa.update(jobs_table).where(jobs_table.c.id == lease.job_id).values(**values))

    def set_state(self, lease: Lease, state: str, *, lease_s: float | None = None) -> None:
        """Move a held job along the state machine (raises :class:`JobStoreError` on an illegal move)."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            now = self._now(conn)
            self._transition(conn, row, state, now)
            self._touch(conn, lease, now, lease_s)

    def update_progress(
        self, lease: Lease, progress: dict[str, Any], *, event: bool = True, lease_s: float | None = None
    ) -> None:
        """Merge ``progress`` into the job's progress and log it as a ``progress`` event (renews the lease)."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            now = self._now(conn)
            self._touch(conn, lease, now, lease_s, progress={**row.progress, **progress})
            if event:
                self._add_event(conn, lease.job_id, "progress", progress, now)

    def update_result(self, lease: Lease, result: dict[str, Any], *, event_type: str | None = None) -> None:
        """Merge ``result`` into the job's result (crop yield, evaluation, published model...)."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            now = self._now(conn)
            self._touch(conn, lease, now, None, result={**row.result, **result})
            if event_type is not None:
                self._add_event(conn, lease.job_id, event_type, result, now)

    def add_event(self, lease: Lease, type_: str, data: dict[str, Any]) -> None:
        with self._transaction(write=True) as conn:
            self._held(conn, lease)
            self._add_event(conn, lease.job_id, type_, data, self._now(conn))

    def cancel_requested(self, job_id: str) -> bool:
        with self._transaction() as conn:
            return bool(self._row(conn, job_id).cancel_requested)

    def finish(self, lease: Lease, state: str, *, reason: str | None = None, message: str | None = None) -> None:
        """End a held job: ``succeeded``, ``cancelled``, or ``failed`` with a reason and a message."""
        if state not in TERMINAL_STATES:
            raise JobStoreError(f"finish() needs a terminal state {TERMINAL_STATES}, got {state!r}")
        if state == FAILED and not reason:
            raise JobStoreError("a failed job needs a reason")
        error = {"reason": reason, "message": message or reason} if state == FAILED else None
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            now = self._now(conn)
            attempts = close_attempt(row.attempts, now, state)
            self._transition(conn, row, state, now, {"error": error} if error else {}, error=error, attempts=attempts)

    def hand_back(self, lease: Lease, message: str) -> str:
        """A worker that stops on purpose returns its job to the queue (or ends it ``cancelled`` if a cancel was
        requested); the attempt does not count."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            now = self._now(conn)
            data = {"reason": HANDED_BACK, "message": message, "attempt": row.attempt}
            attempts = close_attempt(row.attempts, now, HANDED_BACK)
            # a cancel asked for meanwhile is honoured here rather than by whoever claims the job next
            state = CANCELLED if row.cancel_requested else QUEUED
            self._transition(conn, row, state, now, data, attempts=attempts)
            return state

    # ------------------------------------------------------------ rescuing
    def rescue_expired(self) -> list[Ended]:
        """Take back every job whose lease lapsed (its worker died or lost the store): retried or ended."""
        with self._transaction(write=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                sa.select(jobs_table)
                .where(jobs_table.c.state.in_(ACTIVE_STATES), jobs_table.c.lease_expires_at < now)
                .order_by(jobs_table.c.seq)
                .with_for_update(skip_locked=True)
            ).all()
            message = "its worker stopped renewing its lease (the process or its machine died)"
            return [self._interrupt(conn, row, now, message) for row in rows]

    def release_worker(self, worker_id: str, message: str) -> list[Ended]:
        """Take back the jobs of a worker the caller knows is dead (it saw the process exit) without waiting for
        the lease to lapse. Only for the caller's own workers: a process never judges another's."""
        with self._transaction(write=True) as conn:
            now = self._now(conn)
            rows = conn.execute(
                sa.select(jobs_table)
                .where(jobs_table.c.state.in_(ACTIVE_STATES), jobs_table.c.worker_id == worker_id)
                .with_for_update()
            ).all()
            return [self._interrupt(conn, row, now, message) for row in rows]

    def _interrupt(self, conn: Connection, row: sa.Row[Any], now: float, message: str) -> Ended:
        attempts = close_attempt(row.attempts, now, INTERRUPTED)
        interrupted = sum(1 for a in attempts if a.get("outcome") == INTERRUPTED)
        data = {"reason": INTERRUPTED, "message": message, "attempt": row.attempt}
        if row.cancel_requested:
            state, values = CANCELLED, {}
        elif interrupted < row.max_attempts:
            state, values = QUEUED, {}
            data["retry"] = f"attempt {row.attempt} of at most {row.max_attempts} was interrupted: queued again"
        else:
            state = FAILED
            error = {
                "reason": INTERRUPTED,
                "message": f"the job was interrupted {interrupted} time(s), the limit (max_attempts "
                f"{row.max_attempts}); the last time {message}",
            }
            values = {"error": error}
            data["error"] = error
        self._transition(conn, row, state, now, data, attempts=attempts, **values)
        return Ended(row.id, state, row.corpus_dir)
