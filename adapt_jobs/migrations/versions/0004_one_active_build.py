"""One active build per student: a partial unique index on the name of the student-build jobs that are queued,
running or evaluating. Two replicas asking for the same base student at once get the same build (the store maps the
index's violation to "depend on the build that exists"); an ended build leaves the index, so asking again builds anew.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

INDEX = "adapt_jobs_one_active_build"
_ACTIVE_BUILD = "kind = 'student-build' AND state IN ('queued', 'running', 'evaluating')"
_NAME = {"postgresql": "(params ->> 'name')", "sqlite": "json_extract(params, '$.name')"}


def upgrade() -> None:
    name = _NAME[op.get_bind().dialect.name]
    op.execute(f"CREATE UNIQUE INDEX {INDEX} ON adapt_jobs ({name}) WHERE {_ACTIVE_BUILD}")
