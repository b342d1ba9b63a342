"""Shared entry points: the `embedder` command line and the process-wide settings."""
