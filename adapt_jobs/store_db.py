"""The job store's database: its tables (created and upgraded by Alembic, `migrations/`), the database's clock,
and engines for the two backends — SQLite with explicit ``BEGIN IMMEDIATE`` write transactions, PostgreSQL through
psycopg 3 with a pool that replaces connections a restarted server broke. Used by `adapt_jobs.store` only."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from adapt_jobs.jobs import JOB_KIND_ADAPT, Job, JobStoreError

metadata = sa.MetaData()
JSON = sa.JSON().with_variant(JSONB(), "postgresql")

jobs_table = sa.Table(
    "adapt_jobs",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("finished_at", sa.Float),
    sa.Column("params", JSON, nullable=False),
    sa.Column("corpus_dir", sa.Text, nullable=False),
    sa.Column("n_documents", sa.Integer, nullable=False),
    sa.Column("progress", JSON, nullable=False),
    sa.Column("result", JSON, nullable=False),
    sa.Column("error", JSON),
    sa.Column("cancel_requested", sa.Boolean, nullable=False),
    sa.Column("worker_id", sa.String(128)),
    sa.Column("heartbeat_at", sa.Float),
    sa.Column("lease_expires_at", sa.Float),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("attempts", JSON, nullable=False),
    sa.Column("event_seq", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False, server_default=JOB_KIND_ADAPT),
    sa.Column("after_job", sa.String(64), nullable=True),  # claimed only once this job succeeded
    sa.Column("created_by", sa.String(64), nullable=True),  # the creator's API key id; None on an open server
    sa.Column("publishing_attempt", sa.Integer, nullable=True),  # the attempt that began publishing: too late to cancel
    sa.Index("adapt_jobs_state_seq", "state", "seq"),
    sa.Index("adapt_jobs_state_finished", "state", "finished_at"),
)

events_table = sa.Table(
    "adapt_events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.String(64), nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),  # per job, in commit order: the SSE event id
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("data", JSON, nullable=False),
    sa.UniqueConstraint("job_id", "seq", name="adapt_events_job_seq"),
)

# Named leases on store-wide chores (pruning): one holder at a time, until it stops renewing.
leases_table = sa.Table(
    "adapt_leases",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("holder", sa.String(128), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)


class db_now(FunctionElement):
    """The database's clock in seconds since the epoch (one clock for every process sharing the store)."""

    type = sa.Float()
    inherit_cache = True


@compiles(db_now, "postgresql")
def _now_postgresql(element: db_now, compiler: Any, **kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"


def engine_url(url: str) -> sa.URL:
    """``postgresql://`` (and ``postgres://``) use psycopg 3; ``sqlite:///path`` the standard library."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and parsed.database:
        return parsed
    raise JobStoreError(
        f"unsupported adapt store URL scheme {parsed.drivername!r}: use postgresql://user:password@host/db "
        "or sqlite:////absolute/path/jobs.sqlite3"
    )


def row_to_job(row: sa.Row[Any]) -> Job:
    """Every `Job` field is the column of the same name (SQLite hands back integers for booleans)."""
    values = {f.name: row._mapping[f.name] for f in dataclasses.fields(Job)}
    return Job(**values | {"cancel_requested": bool(values["cancel_requested"]), "attempts": list(values["attempts"])})


def make_engine(url: sa.URL, timeout_s: float) -> Engine:
    if url.get_backend_name() == "sqlite":
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)  # type: ignore[arg-type]
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args={"timeout": timeout_s})

        @sa_event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # Transactions are ours to begin (below), so BEGIN IMMEDIATE really takes the write lock before a claim
            # reads the queue; WAL lets readers (the API) read while a worker writes.
            dbapi_connection.isolation_level = None
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        @sa_event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

        return engine
    engine = sa.create_engine(
        url,
        pool_pre_ping=True,  # a restarted server's dead connections are replaced, not handed out
        pool_size=4,
        max_overflow=8,
        pool_timeout=timeout_s,
        connect_args={"connect_timeout": max(1, int(timeout_s))},
    )

    @sa_event.listens_for(engine, "begin")
    def _begin_bounded(conn: Connection) -> None:
        # The store's transactions are a few statements with nothing slow between them. One left open longer (its
        # process frozen by SIGSTOP or a throttled container, its node cut off) keeps its rows locked, and the rescue
        # of lapsed leases skips locked rows: the server ends such a session after the store's timeout, so the job is
        # taken back once its lease lapses instead of when the TCP connection dies (hours). Set per transaction
        # (LOCAL), so that it holds, and stays ours, behind a connection pooler in transaction mode too.
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {max(1, round(timeout_s * 1000))}")

    return engine
