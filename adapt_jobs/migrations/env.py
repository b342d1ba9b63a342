"""Alembic's entry point for the job store: runs on the connection `adapt_jobs.store.JobStore` opened (and locked)."""

from alembic import context

connection = context.config.attributes["connection"]
# Our own version table: a PostgreSQL database shared with other applications may have its own `alembic_version`.
context.configure(connection=connection, version_table="adapt_alembic_version", render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
