"""What reaches the disk in which order: each fsync (with the file or folder it was called on) and each rename or
replace, as a power loss would cut the sequence short. Durability is judged on this order: a rename that readers
follow must come after the fsync of the data it names, and a folder's fsync after the renames in it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

Event = tuple[str, str]


def record_disk_events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """From now on, ``("fsync", path)`` and ``("rename", destination)`` in the order they happen."""
    events: list[Event] = []
    fsync, rename, replace = os.fsync, os.rename, os.replace

    def recorded_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_rename(src: str | Path, dst: str | Path) -> None:
        rename(src, dst)
        events.append(("rename", str(dst)))

    def recorded_replace(src: str | Path, dst: str | Path) -> None:
        replace(src, dst)
        events.append(("rename", str(dst)))

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    monkeypatch.setattr(os, "replace", recorded_replace)
    return events


def position(events: list[Event], event: Event) -> int:
    """Where ``event`` first happened; fails the test, listing what did happen, when it never did."""
    assert event in events, f"{event} never happened: {events}"
    return events.index(event)
