"""The adapt job store with leases and attempts; adopts a store written before it (the `jobs`/`events` tables).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    jobs = op.create_table(
        "adapt_jobs",
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
    )
    op.create_index("adapt_jobs_state_seq", "adapt_jobs", ["state", "seq"])
    events = op.create_table(
        "adapt_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("data", JSON, nullable=False),
        sa.UniqueConstraint("job_id", "seq", name="adapt_events_job_seq"),
    )
    if sa.inspect(op.get_bind()).has_table("jobs"):
        _adopt_legacy(jobs, events)


def _adopt_legacy(jobs: sa.Table, events: sa.Table) -> None:
    """Copy a pre-lease SQLite store (tables `jobs`, `events`) into the new tables, then drop the old ones. Its
    jobs keep their ids, states and history; a job it left active has no lease, so the first rescuer takes it back."""
    bind = op.get_bind()
    old_events: dict[str, list[dict]] = {}
    for row in bind.execute(sa.text("SELECT job_id, created_at, type, data FROM events ORDER BY id")).mappings():
        old_events.setdefault(row["job_id"], []).append(dict(row))
    for row in bind.execute(sa.text("SELECT * FROM jobs ORDER BY seq")).mappings():
        history = old_events.get(row["id"], [])
        started = row["started_at"] is not None
        bind.execute(
            jobs.insert().values(
                id=row["id"], state=row["state"], created_at=row["created_at"], started_at=row["started_at"],
                finished_at=row["finished_at"], params=json.loads(row["params"]), corpus_dir=row["corpus_dir"],
                n_documents=row["n_documents"], progress=json.loads(row["progress"]), result=json.loads(row["result"]),
                error=json.loads(row["error"]) if row["error"] else None,
                cancel_requested=bool(row["cancel_requested"]),
                worker_id=row["worker_id"], heartbeat_at=row["heartbeat_at"], lease_expires_at=row["heartbeat_at"],
                attempt=1 if started else 0, max_attempts=1, attempts=[], event_seq=len(history),
            )
        )  # fmt: skip
        for seq, ev in enumerate(history, start=1):
            bind.execute(
                events.insert().values(
                    job_id=row["id"], seq=seq, created_at=ev["created_at"], type=ev["type"], data=json.loads(ev["data"])
                )
            )
    op.drop_table("events")
    op.drop_table("jobs")
