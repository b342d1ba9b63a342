"""A save interrupted right after any one of its file operations, as a Ctrl-C or a kill would leave it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


class Interrupted(BaseException):
    """Stands for a Ctrl-C (a KeyboardInterrupt is a BaseException too) or a kill after one file operation."""


def interrupt_after(monkeypatch: pytest.MonkeyPatch, operation: int, writer: tuple[Any, str]) -> None:
    """Make the ``operation``-th file operation of a save (counted from 1) complete, then interrupt the save. The
    operations: ``writer`` (an owner and the name of its function that writes the files, e.g. ``(torch, "save")``),
    and removing, renaming and replacing files and folders."""
    count = {"n": 0}

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = function(*args, **kwargs)
            count["n"] += 1
            if count["n"] == operation:
                raise Interrupted
            return out

        return wrapped

    for owner, name in (writer, (shutil, "rmtree"), (os, "replace"), (os, "rename"), (Path, "rename"),
                        (Path, "replace")):  # fmt: skip
        monkeypatch.setattr(owner, name, wrap(getattr(owner, name)))
