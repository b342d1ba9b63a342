"""The /adapt job store: one table is the whole state machine (`adapt_jobs.jobs`; tables, clock and engines in
`adapt_jobs.store_db`), shared by every replica and worker.

One interface, two backends (SQLAlchemy Core, one set of queries): PostgreSQL when scaled out
(``EMBED_ADAPT_STORE_URL=postgresql://…``), an embedded SQLite file on one machine (the default). They differ only
in how a write serialises — SQLite takes the database's write lock (``BEGIN IMMEDIATE``), PostgreSQL locks rows
(``SELECT … FOR UPDATE SKIP LOCKED``) and, for the two counted limits (pending jobs, jobs running), a transaction
advisory lock — not in the states. The schema is created and upgraded by Alembic (`migrations/`), under a lock,
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

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from adapt_jobs.jobs import (
    ACTIVE_STATES,
    ALL_STATES,
    AUDIT_EVENT,
    CANCELLED,
    FAILED,
    HANDED_BACK,
    JOB_KIND_ADAPT,
    JOB_KIND_STUDENT_BUILD,
    QUEUED,
    RUNNING,
    TERMINAL_STATES,
    Event,
    Job,
    JobNotFound,
    JobStoreError,
    Lease,
    QueueFullError,
    audit_record,
    close_attempt,
    new_job_id,
)
from adapt_jobs.store_core import CLAIM_LOCK, CREATE_LOCK
from adapt_jobs.store_db import events_table, jobs_table, row_to_job
from adapt_jobs.store_notify import CLAIMABLE_CHANNEL
from adapt_jobs.store_ready import ready_jobs
from adapt_jobs.store_upkeep import StoreUpkeep


class JobStore(StoreUpkeep):
    """Jobs and their event log, shared by every process that opens the same URL."""

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
        created_by: str | None = None,
    ) -> Job:
        """Queue a job, or raise :class:`QueueFullError` when ``max_pending`` jobs already wait. Returns the job as
        stored, read in the transaction that queued it: once this returns, the job is committed and needs no second
        read (which could fail on its own and make a queued job look refused).

        ``after_job``: the job is claimed only once that job succeeded, and fails (reason ``dependency``) when it
        failed or was cancelled. ``reuse_active`` (student builds only): if a queued or running build of the same
        ``params["name"]`` exists, return it instead of queueing another (one build of a base student at a time,
        however many replicas ask for it at once: a unique index on the active builds' names holds it, and its
        violation returns the build that exists). ``created_by``: the caller's API key id, kept on the job and in
        its ``audit`` event (action ``created``)."""
        if reuse_active and kind != JOB_KIND_STUDENT_BUILD:
            raise JobStoreError(f"reuse_active needs kind {JOB_KIND_STUDENT_BUILD!r} (one active build per name)")
        with self._transaction(write=True) as conn:
            pending, now = self._creating(conn)
            job, queued = self._queue(conn, job_id or new_job_id(), params, corpus_dir, n_documents, max_attempts,
                                      kind, after_job, created_by, now, reuse_active=reuse_active)  # fmt: skip
            if queued and pending >= max_pending:  # the insert is rolled back with the transaction
                raise QueueFullError(pending, max_pending)
            return job  # a build that exists is returned even when the queue is full: depending on it adds nothing

    def create_after_build(
        self,
        build_params: dict[str, Any],
        params: dict[str, Any],
        *,
        build_dir: Path | str,
        corpus_dir: Path | str,
        n_documents: int,
        max_pending: int,
        max_attempts: int,
        build_id: str | None = None,
        job_id: str | None = None,
        created_by: str | None = None,
    ) -> tuple[Job, Job]:
        """Queue a job and the one-time build of its base student it waits for, in one transaction: both or neither.

        The build (``build_params``, kind student-build, its scratch in ``build_dir``) is the queued or running build
        of the same ``build_params["name"]`` when there is one (as `create` with ``reuse_active``), else a new one.
        Raises :class:`QueueFullError` when the queue has no room for what the request adds — the job, and the build
        when it is new — so a refused job leaves behind no build that nothing waits for. Returns (build, job), each
        as stored; the build's id differs from ``build_id`` when an existing build was reused."""
        with self._transaction(write=True) as conn:
            pending, now = self._creating(conn)
            build_id = build_id or new_job_id()
            build, new_build = self._queue(conn, build_id, build_params, build_dir, 0, max_attempts,
                                           JOB_KIND_STUDENT_BUILD, None, created_by, now,
                                           reuse_active=True)  # fmt: skip
            if pending + 1 + new_build > max_pending:  # both inserts are rolled back with the transaction
                raise QueueFullError(pending, max_pending)
            job, _ = self._queue(conn, job_id or new_job_id(), params, corpus_dir, n_documents, max_attempts,
                                 JOB_KIND_ADAPT, build.id, created_by, now)  # fmt: skip
            return build, job

    def _creating(self, conn: Connection) -> tuple[int, float]:
        """Begin queueing (one creating transaction at a time): the jobs queued now, and the database's clock."""
        self._serialize(conn, CREATE_LOCK)
        pending = conn.execute(
            sa.select(sa.func.count()).select_from(jobs_table).where(jobs_table.c.state == QUEUED)
        ).scalar_one()
        return pending, self._now(conn)

    def _queue(
        self, conn: Connection, job_id: str, params: dict[str, Any], corpus_dir: Path | str, n_documents: int,
        max_attempts: int, kind: str, after_job: str | None, created_by: str | None, now: float, *,
        reuse_active: bool = False,
    ) -> tuple[Job, bool]:  # fmt: skip
        """Insert a queued job with its ``state`` and ``audit`` events; returns it as stored and True, or — with
        ``reuse_active``, when an active job of the kind and name exists — that job and False."""
        try:
            with conn.begin_nested():  # the unique index adapt_jobs_one_active_build: one active build per name
                self._insert(conn, job_id, params, corpus_dir, n_documents, max_attempts, kind, after_job, created_by,
                             now)  # fmt: skip
        except IntegrityError:
            if reuse_active and (existing := self._active(conn, kind, params.get("name"))) is not None:
                return existing, False
            raise
        self._add_event(conn, job_id, "state", {"state": QUEUED}, now)
        self._add_event(conn, job_id, AUDIT_EVENT, audit_record("created", created_by, params), now)
        self._notify(conn, CLAIMABLE_CHANNEL)
        return row_to_job(self._row(conn, job_id)), True

    @staticmethod
    def _active(conn: Connection, kind: str, name: Any) -> Job | None:
        """The queued or running job of this ``kind`` and ``params["name"]``, the one whose entry in the unique index
        ``adapt_jobs_one_active_build`` (one active student build per name) an insert ran into."""
        row = conn.execute(
            sa.select(jobs_table)
            .where(
                jobs_table.c.kind == kind,
                jobs_table.c.state.in_((QUEUED, *ACTIVE_STATES)),
                jobs_table.c.params["name"].as_string() == name,
            )
            .order_by(jobs_table.c.seq)
            .limit(1)
        ).first()
        return row_to_job(row) if row is not None else None

    @staticmethod
    def _insert(
        conn: Connection, job_id: str, params: dict[str, Any], corpus_dir: Path | str, n_documents: int,
        max_attempts: int, kind: str, after_job: str | None, created_by: str | None, now: float,
    ) -> None:  # fmt: skip
        conn.execute(
            sa.insert(jobs_table).values(
                id=job_id, state=QUEUED, created_at=now, params=params, corpus_dir=str(corpus_dir),
                n_documents=n_documents, progress={}, result={}, cancel_requested=False, attempt=0,
                max_attempts=max_attempts, attempts=[], event_seq=0, kind=kind, after_job=after_job,
                created_by=created_by,
            )
        )  # fmt: skip

    def get(self, job_id: str) -> Job:
        with self._transaction() as conn:
            return row_to_job(self._row(conn, job_id))

    def list_jobs(self, *, limit: int = 20, after: str | None = None, state: str | None = None) -> list[Job]:
        """Newest first; ``after`` is the id of the last job of the previous page. Raises :class:`JobNotFound` when no
        job has that id (never queued, or pruned past its retention): an empty page would look like the end of the
        listing."""
        query = sa.select(jobs_table)
        if state is not None:
            query = query.where(jobs_table.c.state == state)
        with self._transaction() as conn:
            if after is not None:
                before = conn.execute(sa.select(jobs_table.c.seq).where(jobs_table.c.id == after)).scalar()
                if before is None:
                    raise JobNotFound(
                        f"no adapt job with id {after!r} to list after: it never existed or was pruned past its "
                        "retention; list again from the start (without after)"
                    )
                query = query.where(jobs_table.c.seq < before)
            rows = conn.execute(query.order_by(jobs_table.c.seq.desc()).limit(limit)).all()
        return [row_to_job(row) for row in rows]

    def count_by_state(self) -> dict[str, int]:
        query = sa.select(jobs_table.c.state, sa.func.count()).group_by(jobs_table.c.state)
        with self._transaction() as conn:
            rows = conn.execute(query).all()
        counts = dict.fromkeys(ALL_STATES, 0)
        counts.update({state: n for state, n in rows})
        return counts

    def request_cancel(self, job_id: str, *, actor: str | None = None) -> Job:
        """`cancel`, returning the job only."""
        return self.cancel(job_id, actor=actor)[0]

    def cancel(self, job_id: str, *, actor: str | None = None) -> tuple[Job, bool]:
        """Cancel a queued job at once; ask the worker to stop a running one (it checks often). Returns the job and
        whether this call cancelled it or asked for it, recording that as the job's ``audit`` event (action
        ``cancelled``; ``actor``: the caller's API key id).

        Only the first request changes anything: asking again while the worker stops, or cancelling a finished job,
        returns the job unchanged and records nothing (one audit record per cancel, however often a client retries).
        Nor does one that comes once an attempt of the job began publishing its model (`begin_publish`): the job ends
        with it, so the cancel is not acknowledged rather than acknowledged and then not honoured. That holds for a
        retry too, queued or running: an attempt that published, maybe promoted, and was then interrupted left its
        version in the registry, and the retry ends the job with it (unless it finds none there: `reopen_cancel`).
        """
        with self._transaction(write=True) as conn:
            row = self._row(conn, job_id, lock=True)
            now = self._now(conn)
            publishing = row.publishing_attempt is not None  # this attempt's or an earlier one's: past no return
            asked = not publishing and (
                row.state == QUEUED or (row.state in ACTIVE_STATES and not row.cancel_requested)
            )
            if not asked:
                return row_to_job(row), False
            self._add_event(conn, job_id, AUDIT_EVENT, audit_record("cancelled", actor, row.params), now)
            if row.state == QUEUED:
                self._transition(conn, row, CANCELLED, now, cancel_requested=True)
            else:
                conn.execute(sa.update(jobs_table).where(jobs_table.c.id == job_id).values(cancel_requested=True))
                self._add_event(conn, job_id, "cancel_requested", {}, now)
            return row_to_job(self._row(conn, job_id)), asked

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
        """Take the oldest ready job (`adapt_jobs.store_ready`: queued, waiting for nothing or for a job that succeeded)
        for ``worker_id`` under a lease of ``lease_s`` seconds (a new attempt).

        Returns None when nothing is queued or ``max_running`` jobs already run (the concurrency limit holds across
        every worker sharing this store).
        """
        with self._transaction(write=True) as conn:
            self._serialize(conn, CLAIM_LOCK)
            running = conn.execute(
                sa.select(sa.func.count()).select_from(jobs_table).where(jobs_table.c.state.in_(ACTIVE_STATES))
            ).scalar_one()
            if running >= max_running:
                return None
            row = conn.execute(ready_jobs().limit(1).with_for_update(skip_locked=True)).first()
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

    def held_by(self, worker_id: str) -> Job | None:
        """The running job ``worker_id`` holds, if any: what a worker looks for when the store was lost while its claim
        committed (`adapt_jobs.store_core.CommitUnknown`), since the claim may have been applied."""
        with self._transaction() as conn:
            row = conn.execute(
                sa.select(jobs_table)
                .where(jobs_table.c.worker_id == worker_id, jobs_table.c.state.in_(ACTIVE_STATES))
                .order_by(jobs_table.c.seq)
                .limit(1)
            ).first()
        return row_to_job(row) if row is not None else None

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

    def begin_publish(self, lease: Lease, lease_s: float) -> bool:
        """The point of no return before a held job publishes its model: False when a cancel was asked for (the worker
        stops, publishing nothing); else renews the lease and records that this attempt publishes, so a cancel asked
        for from now on is refused (`cancel`). One transaction, under the job's row lock, so a cancel is either seen
        here or refused there. `LeaseLost` if the lease is no longer ours (the fence: a worker that lost the job
        publishes nothing)."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            if row.cancel_requested:
                return False
            self._touch(conn, lease, self._now(conn), lease_s, publishing_attempt=lease.attempt)
            return True

    def reopen_cancel(self, lease: Lease) -> None:
        """The retry of a job whose earlier attempt began publishing found no version of it in the registry: that
        attempt stopped before its copy got there, so the job is not past its point of no return after all, and a
        cancel is taken again until this attempt begins publishing. `LeaseLost` if the lease is no longer ours."""
        with self._transaction(write=True) as conn:
            row = self._held(conn, lease)
            if row.publishing_attempt is not None and row.publishing_attempt < lease.attempt:
                self._touch(conn, lease, self._now(conn), None, publishing_attempt=None)

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
