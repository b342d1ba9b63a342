"""/adapt's job queue, torch-free: what the API, the CLI and the KEDA trigger share — the per-job settings and the job's
typed spec, the corpus intake, and the job store (SQLite or PostgreSQL) that owns every job's life."""
