"""Process-wide settings for the command-line tools (``EMBED_`` environment variables).

The service has its own, larger settings object (``service.settings``); both read the same
``EMBED_CACHE_DIR`` and ``EMBED_REGISTRY_DIR`` so a model prepared by one is seen by the other.
No other module reads ``os.environ``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

STATE_DIR = Path("state")  # everything the tools and the server write by default: ignored by git, one folder to delete
DEFAULT_REGISTRY_DIR = STATE_DIR / "registry"
DEFAULT_CACHE_DIR = STATE_DIR / "cache"


class Settings(BaseSettings):
    """Settings shared by `embedder models|train|export|validate`."""

    model_config = SettingsConfigDict(env_prefix="EMBED_", extra="ignore")

    cache_dir: Path = Field(
        default=DEFAULT_CACHE_DIR,
        description="Where built-in models are unpacked or rebuilt (a few hundred MB with mpnet-base).",
    )
    registry_dir: Path = Field(
        default=DEFAULT_REGISTRY_DIR,
        description="Root of the bundle registry: <registry>/<name>/<version>/ and <name>/current.",
    )
    device: str = Field(default="cpu", description="torch device for training and reference encoders.")
    num_threads: int | None = Field(
        default=None, description="torch intra-op threads; None keeps torch's default (all cores)."
    )


def split_csv(value: object) -> object:
    """Environment variables hold lists as ``a,b,c`` (JSON lists are accepted too)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    return value


def get_settings() -> Settings:
    return Settings()


def add_registry_flag(parser: argparse.ArgumentParser) -> None:
    """The ``--registry`` flag of the commands that read or write the registry: None unless given (the caller then
    reads ``EMBED_REGISTRY_DIR`` through `get_settings`)."""
    parser.add_argument(
        "--registry",
        type=Path,
        default=None,
        help=f"registry root (default: EMBED_REGISTRY_DIR, else {DEFAULT_REGISTRY_DIR})",
    )
