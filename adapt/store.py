"""SQLite job store for /adapt: the only channel between the API process and the worker processes.

The API inserts jobs and reads them; workers claim queued jobs, write progress events and the
final result. Both sides open short-lived connections (WAL mode, a busy timeout), so several
processes share one file safely. Pure standard library: the API process imports it without torch.

Job states and the transitions the store allows::

    queued ──▶ running ──▶ evaluating ──▶ succeeded
       │          │             │
       │          ├─────────────┴──▶ failed      (reason: corpus | training | export | evaluation |
       │          │                               interrupted | internal)
       └──────────┴─────────────┴──▶ cancelled

A job that was ``running`` or ``evaluating`` when its worker died is marked ``failed`` with reason
``interrupted`` (by the supervisor when it sees the worker exit, and on startup for jobs left over
from a previous run): it is never resumed, because half a fine-tune cannot be continued honestly.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUEUED, RUNNING, EVALUATING = "queued", "running", "evaluating"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
ACTIVE_STATES = (RUNNING, EVALUATING)
TERMINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)
ALL_STATES = (QUEUED, RUNNING, EVALUATING, SUCCEEDED, FAILED, CANCELLED)

# Allowed transitions; anything else is a programming error (raised, never silently applied).
TRANSITIONS: dict[str, tuple[str, ...]] = {
    QUEUED: (RUNNING, CANCELLED, FAILED),
    RUNNING: (EVALUATING, SUCCEEDED, FAILED, CANCELLED),
    EVALUATING: (SUCCEEDED, FAILED, CANCELLED),
    SUCCEEDED: (),
    FAILED: (),
    CANCELLED: (),
}

INTERRUPTED = "interrupted"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    params TEXT NOT NULL,
    corpus_dir TEXT NOT NULL,
    n_documents INTEGER NOT NULL,
    progress TEXT NOT NULL DEFAULT '{}',
    result TEXT NOT NULL DEFAULT '{}',
    error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    worker_id TEXT,
    heartbeat_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, id);
"""


class JobStoreError(RuntimeError):
    """A job that does not exist, or a state change the state machine does not allow."""


class QueueFullError(JobStoreError):
    """The bounded queue of pending jobs is full; the client should retry later."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(
            f"the adapt queue is full ({pending} jobs pending, limit {limit}); retry when a job has finished"
        )
        self.pending = pending
        self.limit = limit


@dataclass
class Job:
    """One row of the ``jobs`` table, with its JSON columns decoded."""

    id: str
    state: str
    created_at: float
    params: dict[str, Any]
    corpus_dir: str
    n_documents: int
    started_at: float | None = None
    finished_at: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    worker_id: str | None = None
    heartbeat_at: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass
class Event:
    id: int
    job_id: str
    created_at: float
    type: str
    data: dict[str, Any]


def new_job_id() -> str:
    """``adaptjob-`` + 24 hex characters (shape after OpenAI's ``ftjob-...`` ids)."""
    return "adaptjob-" + secrets.token_hex(12)


def _row_to_job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        state=row["state"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        params=json.loads(row["params"]),
        corpus_dir=row["corpus_dir"],
        n_documents=row["n_documents"],
        progress=json.loads(row["progress"]),
        result=json.loads(row["result"]),
        error=json.loads(row["error"]) if row["error"] else None,
        cancel_requested=bool(row["cancel_requested"]),
        worker_id=row["worker_id"],
        heartbeat_at=row["heartbeat_at"],
    )


class JobStore:
    """Jobs and their event log in one SQLite file, safe to share between processes."""

    def __init__(self, path: Path | str, *, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._timeout_s = timeout_s
        conn = sqlite3.connect(self.path, timeout=timeout_s, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # readers (the API) never block the writer (a worker)
            conn.executescript(_SCHEMA)
        finally:
            conn.close()

    @contextmanager
    def _connect(self, *, immediate: bool = False) -> Iterator[sqlite3.Connection]:
        # isolation_level=None: transactions are explicit, so BEGIN IMMEDIATE really takes the
        # write lock before a claim reads the queue (two workers never claim the same job).
        conn = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            conn.close()

    # ---------------------------------------------------------------- API side
    def create(
        self,
        params: dict[str, Any],
        *,
        corpus_dir: Path | str,
        n_documents: int,
        max_pending: int,
        job_id: str | None = None,
    ) -> Job:
        """Queue a job, or raise :class:`QueueFullError` when ``max_pending`` jobs already wait."""
        job_id = job_id or new_job_id()
        now = time.time()
        with self._connect(immediate=True) as conn:
            pending = conn.execute("SELECT COUNT(*) FROM jobs WHERE state = ?", (QUEUED,)).fetchone()[0]
            if pending >= max_pending:
                raise QueueFullError(pending, max_pending)
            conn.execute(
                "INSERT INTO jobs (id, state, created_at, params, corpus_dir, n_documents) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, QUEUED, now, json.dumps(params), str(corpus_dir), n_documents),
            )
            self._add_event(conn, job_id, "state", {"state": QUEUED}, now)
        return self.get(job_id)

    def get(self, job_id: str) -> Job:
        with self._connect() as conn:
            row = conn.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobStoreError(f"no adapt job with id {job_id!r}")
        return _row_to_job(row)

    def list_jobs(self, *, limit: int = 20, after: str | None = None, state: str | None = None) -> list[Job]:
        """Newest first; ``after`` is the id of the last job of the previous page."""
        query, args = "SELECT * FROM jobs WHERE 1=1", []
        if after is not None:
            query += " AND seq < (SELECT seq FROM jobs WHERE id = ?)"
            args.append(after)
        if state is not None:
            query += " AND state = ?"
            args.append(state)
        query += " ORDER BY seq DESC LIMIT ?"
        args.append(limit)
        with self._connect() as conn:
            rows = conn.execute(query, args).fetchall()
        return [_row_to_job(row) for row in rows]

    def count_by_state(self) -> dict[str, int]:
        with self._connect() as conn:
            rows = conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        counts = dict.fromkeys(ALL_STATES, 0)
        counts.update({state: n for state, n in rows})
        return counts

    def request_cancel(self, job_id: str) -> Job:
        """Cancel a queued job at once; ask the worker to stop a running one (it checks often).

        Cancelling a finished job is a no-op that returns it unchanged.
        """
        now = time.time()
        with self._connect(immediate=True) as conn:
            row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobStoreError(f"no adapt job with id {job_id!r}")
            if row["state"] == QUEUED:
                self._transition(conn, job_id, QUEUED, CANCELLED, now)
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
            elif row["state"] in ACTIVE_STATES:
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE id = ?", (job_id,))
                self._add_event(conn, job_id, "cancel_requested", {}, now)
        return self.get(job_id)

    def events(self, job_id: str, *, after_id: int = 0, limit: int = 500) -> list[Event]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?", (job_id, after_id, limit)
            ).fetchall()
        return [Event(r["id"], r["job_id"], r["created_at"], r["type"], json.loads(r["data"])) for r in rows]

    # ------------------------------------------------------------- worker side
    def claim_next(self, worker_id: str, *, max_running: int) -> Job | None:
        """Atomically move the oldest queued job to ``running`` for ``worker_id``.

        Returns None when nothing is queued or ``max_running`` jobs already run (the concurrency
        limit holds across every worker sharing this store).
        """
        now = time.time()
        with self._connect(immediate=True) as conn:
            running = conn.execute("SELECT COUNT(*) FROM jobs WHERE state IN (?, ?)", ACTIVE_STATES).fetchone()[0]
            if running >= max_running:
                return None
            row = conn.execute("SELECT id FROM jobs WHERE state = ? ORDER BY seq LIMIT 1", (QUEUED,)).fetchone()
            if row is None:
                return None
            self._transition(conn, row["id"], QUEUED, RUNNING, now)
            conn.execute(
                "UPDATE jobs SET started_at = ?, worker_id = ?, heartbeat_at = ? WHERE id = ?",
                (now, worker_id, now, row["id"]),
            )
        return self.get(row["id"])

    def set_state(self, job_id: str, state: str, **data: Any) -> None:
        """Move a job along the state machine (raises :class:`JobStoreError` on an illegal move)."""
        now = time.time()
        with self._connect(immediate=True) as conn:
            current = self._state(conn, job_id)
            self._transition(conn, job_id, current, state, now, data)

    def update_progress(self, job_id: str, progress: dict[str, Any], *, event: bool = True) -> None:
        """Merge ``progress`` into the job's progress and log it as a ``progress`` event."""
        now = time.time()
        with self._connect(immediate=True) as conn:
            row = conn.execute("SELECT progress FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobStoreError(f"no adapt job with id {job_id!r}")
            merged = {**json.loads(row["progress"]), **progress}
            conn.execute(
                "UPDATE jobs SET progress = ?, heartbeat_at = ? WHERE id = ?", (json.dumps(merged), now, job_id)
            )
            if event:
                self._add_event(conn, job_id, "progress", progress, now)

    def update_result(self, job_id: str, result: dict[str, Any], *, event_type: str | None = None) -> None:
        """Merge ``result`` into the job's result (crop yield, evaluation, published model...)."""
        now = time.time()
        with self._connect(immediate=True) as conn:
            row = conn.execute("SELECT result FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobStoreError(f"no adapt job with id {job_id!r}")
            merged = {**json.loads(row["result"]), **result}
            conn.execute("UPDATE jobs SET result = ? WHERE id = ?", (json.dumps(merged), job_id))
            if event_type is not None:
                self._add_event(conn, job_id, event_type, result, now)

    def add_event(self, job_id: str, type_: str, data: dict[str, Any]) -> None:
        with self._connect(immediate=True) as conn:
            self._add_event(conn, job_id, type_, data, time.time())

    def cancel_requested(self, job_id: str) -> bool:
        with self._connect() as conn:
            row = conn.execute("SELECT cancel_requested FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return bool(row and row["cancel_requested"])

    def finish(self, job_id: str, state: str, *, reason: str | None = None, message: str | None = None) -> None:
        """End a job: ``succeeded``, ``cancelled``, or ``failed`` with a reason and a message."""
        if state not in TERMINAL_STATES:
            raise JobStoreError(f"finish() needs a terminal state {TERMINAL_STATES}, got {state!r}")
        if state == FAILED and not reason:
            raise JobStoreError("a failed job needs a reason")
        now = time.time()
        error = {"reason": reason, "message": message or reason} if state == FAILED else None
        with self._connect(immediate=True) as conn:
            current = self._state(conn, job_id)
            self._transition(conn, job_id, current, state, now, {"error": error} if error else {})
            conn.execute("UPDATE jobs SET error = ? WHERE id = ?", (json.dumps(error) if error else None, job_id))

    def fail_active(self, *, worker_id: str | None = None, message: str = "the job was interrupted") -> list[str]:
        """Mark running/evaluating jobs (of one worker, or all) ``failed`` with reason ``interrupted``."""
        now = time.time()
        with self._connect(immediate=True) as conn:
            query, args = "SELECT id, state FROM jobs WHERE state IN (?, ?)", list(ACTIVE_STATES)
            if worker_id is not None:
                query += " AND worker_id = ?"
                args.append(worker_id)
            rows = conn.execute(query, args).fetchall()
            error = {"reason": INTERRUPTED, "message": message}
            for row in rows:
                self._transition(conn, row["id"], row["state"], FAILED, now, {"error": error})
                conn.execute("UPDATE jobs SET error = ? WHERE id = ?", (json.dumps(error), row["id"]))
        return [row["id"] for row in rows]

    # ---------------------------------------------------------------- helpers
    def _state(self, conn: sqlite3.Connection, job_id: str) -> str:
        row = conn.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobStoreError(f"no adapt job with id {job_id!r}")
        return row["state"]

    def _transition(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        current: str,
        state: str,
        now: float,
        data: dict[str, Any] | None = None,
    ) -> None:
        if state not in TRANSITIONS.get(current, ()):
            raise JobStoreError(f"adapt job {job_id} cannot go from {current!r} to {state!r}")
        finished = now if state in TERMINAL_STATES else None
        conn.execute(
            "UPDATE jobs SET state = ?, finished_at = COALESCE(?, finished_at) WHERE id = ?",
            (state, finished, job_id),
        )
        self._add_event(conn, job_id, "state", {"state": state, **(data or {})}, now)

    @staticmethod
    def _add_event(conn: sqlite3.Connection, job_id: str, type_: str, data: dict[str, Any], now: float) -> None:
        conn.execute(
            "INSERT INTO events (job_id, created_at, type, data) VALUES (?, ?, ?, ?)",
            (job_id, now, type_, json.dumps(data)),
        )
