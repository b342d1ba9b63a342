"""The job store's upkeep, done by whichever process gets to it: taking back jobs whose lease lapsed (any replica's
rescuer, any idle worker), ending jobs whose dependency did not succeed, and pruning ended jobs past their retention
under a named lease the store grants to one process at a time. Part of `adapt_jobs.store.JobStore`.

Retention: an ended job (succeeded, failed, cancelled) is deleted with its events and whatever is left of its folder
once it finished longer ago than the retention, unless a job that has not ended still waits for it. The caller deletes
any folder under the jobs directory that no job in the store names, once it is older than the retention
(`adapt_jobs.retention.prune_job_folders`), so nothing uploaded outlives its job's retention.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from adapt_jobs.jobs import (
    ACTIVE_STATES,
    CANCELLED,
    FAILED,
    INTERRUPTED,
    PRUNED,
    QUEUED,
    TERMINAL_STATES,
    Ended,
    close_attempt,
)
from adapt_jobs.store_core import LEASE_LOCK, StoreCore
from adapt_jobs.store_db import events_table, jobs_table, leases_table

PRUNE_LEASE = "prune"  # the lease on pruning ended jobs


class StoreUpkeep(StoreCore):
    """Rescuing, orphans, leases on chores and pruning."""

    def fail_dependants(self) -> list[Ended]:
        """The sweep behind the transitions: end ``failed`` (reason ``dependency``) every queued job whose `after_job`
        failed or was cancelled and that the transition which ended that job could not take (it was locked, or the
        store predates this rule). Their corpora are freed like any ended job's."""
        with self._transaction(write=True) as conn:
            dependency = jobs_table.alias("dependency")
            rows = conn.execute(
                sa.select(
                    jobs_table, dependency.c.state.label("dependency_state"), dependency.c.error.label("dep_error")
                )
                .join(dependency, dependency.c.id == jobs_table.c.after_job)
                .where(jobs_table.c.state == QUEUED, dependency.c.state.in_((FAILED, CANCELLED)))
                .order_by(jobs_table.c.seq)
                .with_for_update(of=jobs_table, skip_locked=True)
            ).all()
            now = self._now(conn) if rows else 0.0
            for row in rows:
                self._fail_dependant(conn, row, row.dependency_state, row.dep_error, now)
            return [Ended(row.id, FAILED, row.corpus_dir) for row in rows]

    # ---------------------------------------------------------------- leases on chores
    def take_lease(self, name: str, holder: str, lease_s: float) -> bool:
        """Take (or, for its holder, renew) the lease ``name`` for ``lease_s`` seconds; False while another holder's
        lease has not lapsed."""
        with self._transaction(write=True) as conn:
            return self._take_lease(conn, name, holder, lease_s)

    def _take_lease(self, conn: Connection, name: str, holder: str, lease_s: float) -> bool:
        self._serialize(conn, LEASE_LOCK)  # two first grants would both insert: one at a time
        now = self._now(conn)
        row = conn.execute(sa.select(leases_table).where(leases_table.c.name == name).with_for_update()).first()
        if row is None:
            conn.execute(sa.insert(leases_table).values(name=name, holder=holder, expires_at=now + lease_s))
            return True
        if row.holder != holder and row.expires_at >= now:
            return False
        conn.execute(
            sa.update(leases_table).where(leases_table.c.name == name).values(holder=holder, expires_at=now + lease_s)
        )
        return True

    # ---------------------------------------------------------------- retention
    def prune(self, holder: str, *, older_than_s: float, lease_s: float, limit: int = 500) -> list[Ended] | None:
        """Delete, with their events, up to ``limit`` ended jobs that finished more than ``older_than_s`` seconds ago
        — if ``holder`` holds the prune lease (taken or renewed here for ``lease_s``); None while another process
        holds it. A job that an unfinished job still waits for stays. Returns the pruned jobs; their folders are deleted
        once the deletion has committed."""
        with self._transaction(write=True) as conn:
            if not self._take_lease(conn, PRUNE_LEASE, holder, lease_s):
                return None
            now = self._now(conn)
            waiter = jobs_table.alias("waiter")
            rows = conn.execute(
                sa.select(jobs_table.c.id, jobs_table.c.corpus_dir)
                .where(
                    jobs_table.c.state.in_(TERMINAL_STATES),
                    jobs_table.c.finished_at < now - older_than_s,
                    ~sa.exists().where(waiter.c.after_job == jobs_table.c.id, waiter.c.state.not_in(TERMINAL_STATES)),
                )
                .order_by(jobs_table.c.seq)
                .limit(limit)
                .with_for_update(of=jobs_table, skip_locked=True)
            ).all()
            ids = [row.id for row in rows]
            if ids:
                conn.execute(sa.delete(events_table).where(events_table.c.job_id.in_(ids)))
                conn.execute(sa.delete(jobs_table).where(jobs_table.c.id.in_(ids)))
            return [self._ended(conn, row.id, PRUNED, row.corpus_dir) for row in rows]

    def existing(self, job_ids: Iterable[str]) -> set[str]:
        """Which of ``job_ids`` the store holds."""
        ids = list(job_ids)
        if not ids:
            return set()
        with self._transaction() as conn:
            return set(conn.execute(sa.select(jobs_table.c.id).where(jobs_table.c.id.in_(ids))).scalars())

    # ---------------------------------------------------------------- rescuing
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
        elif row.publishing_attempt == row.attempt and interrupted == row.max_attempts:
            # The last attempt began publishing: its version may be in the registry, maybe served. Failing the job
            # would leave a record that says no model came of it; one more attempt ends the job with that version
            # (`adapt_worker.release.published_before`), or, finding none, trains as any retry.
            state, values = QUEUED, {}
            data["retry"] = (f"attempt {row.attempt}, the last of {row.max_attempts}, was interrupted after it began "
                             "publishing: queued once more to end the job with the version it published")  # fmt: skip
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
