"""The point of no return of a job: ``publishing_attempt``, the attempt that began publishing its model. A cancel that
arrives later is not acknowledged (the job ends with its model), so no cancel is acknowledged and then ignored.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("adapt_jobs") as batch:
        batch.add_column(sa.Column("publishing_attempt", sa.Integer, nullable=True))
