"""Retention and audit: who created a job (``created_by``), an index to find ended jobs by age, and named leases
(``adapt_leases``) so one process at a time prunes ended jobs.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("adapt_jobs") as batch:
        batch.add_column(sa.Column("created_by", sa.String(64), nullable=True))
    op.create_index("adapt_jobs_state_finished", "adapt_jobs", ["state", "finished_at"])
    op.create_table(
        "adapt_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(128), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
