"""Job kinds and dependencies: a job may be a student build (``kind``) and may wait for another job (``after_job``).

An /adapt job that asks for a compact student waits for the one-time build of its base student, queued as a job of
its own; a worker claims it only once that job succeeded, and fails it when that job failed or was cancelled.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("adapt_jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(32), nullable=False, server_default="adapt"))
        batch.add_column(sa.Column("after_job", sa.String(64), nullable=True))
