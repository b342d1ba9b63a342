"""The one definition of a job that is ready to claim: queued, and waiting for no job or for one that succeeded.

`JobStore.claim_next` takes the oldest ready job; the Helm chart's KEDA ScaledJob counts the ready jobs to start one
worker pod per job (helm/embedder/templates/adapt-worker-scaledjob.yaml). The chart cannot run Python when it is
rendered, so its trigger holds the PostgreSQL text this module renders — ``python -m adapt_jobs.store_ready`` prints it,
folded as the template writes it — and tests/deploy/test_chart.py checks that the two are the same and that, against
a real PostgreSQL, the count and `claim_next` agree on every combination of job states.

A queued job whose dependency failed or was cancelled is not ready: the transition that ended the dependency fails it
(`adapt_jobs.store_core`), and the rescuers' sweep (`JobStore.fail_dependants`) takes any it missed.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from adapt_jobs.jobs import QUEUED, SUCCEEDED
from adapt_jobs.store_db import jobs_table


def ready(job: sa.TableClause) -> sa.ColumnElement[bool]:
    """The condition on a row of the jobs table (``job``: the table or an alias of it) that makes it claimable."""
    dependency = jobs_table.alias("d")
    return sa.and_(
        job.c.state == QUEUED,
        sa.or_(
            job.c.after_job.is_(None),
            sa.exists().where(dependency.c.id == job.c.after_job, dependency.c.state == SUCCEEDED),
        ),
    )


def ready_jobs() -> sa.Select[tuple[Any, ...]]:
    """Every column of the ready jobs, oldest first (what `JobStore.claim_next` locks and takes one of)."""
    job = jobs_table.alias("j")
    return sa.select(job).where(ready(job)).order_by(job.c.seq)


def ready_count() -> sa.Select[tuple[int]]:
    """How many jobs are ready: what KEDA's PostgreSQL scaler queries."""
    job = jobs_table.alias("j")
    return sa.select(sa.func.count()).select_from(job).where(ready(job))


def ready_count_sql() -> str:
    """`ready_count` as one line of PostgreSQL text with its values inlined (KEDA passes no parameters)."""
    compiled = ready_count().compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True})
    return " ".join(str(compiled).split())


def folded(sql: str, width: int = 110, indent: str = " " * 10) -> str:
    """``sql`` broken at spaces into lines of at most ``width`` characters, for a YAML folded scalar (``>-``), which
    joins them back with single spaces."""
    lines: list[str] = []
    for word in sql.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(indent + line for line in lines)


if __name__ == "__main__":
    print(folded(ready_count_sql()))
