"""What a power loss can leave of a publish: ``current`` never names a version whose files are not on disk.

A rename reaches the disk independently of the data of the files renamed (ext4's delayed allocation, a network
volume): unless the bundle's files are fsynced before the rename into the version, and the name's folder after it,
a power loss can leave a ``current`` that names a folder of empty or cut-short files, or that is gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core import registry as reg


def _bundle(folder: Path) -> Path:
    (folder / "tokenizer").mkdir(parents=True)
    (folder / reg.MANIFEST).write_text('{"name": "acme", "onnx": {"fp32": "model.onnx"}}')
    (folder / "model.onnx").write_bytes(b"graph" * 1000)
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture
def disk_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each fsync (of the file or folder it was called on) and each rename or replace, in order."""
    events: list[tuple[str, str]] = []
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


def _index(events: list[tuple[str, str]], event: tuple[str, str]) -> int:
    assert event in events, f"{event} never happened: {events}"
    return events.index(event)


def test_a_bundle_is_on_disk_before_it_is_renamed_into_its_version(
    tmp_path: Path, disk_events: list[tuple[str, str]]
) -> None:
    root = tmp_path / "registry"
    version = reg.reserve_version(root, "acme")
    staging = _bundle(reg.staging_path(root, "acme", version))
    names = [p.relative_to(staging) for p in sorted(staging.rglob("*"))]

    target = reg.publish(staging, root, "acme", version)

    renamed = _index(disk_events, ("rename", str(target)))
    for name in names:  # the copy's files and folders, and the copy itself, as they were called before the rename
        assert _index(disk_events, ("fsync", str(staging / name))) < renamed
    assert _index(disk_events, ("fsync", str(staging))) < renamed
    assert ("fsync", str(root / "acme")) in disk_events[renamed:]  # the rename itself


def test_the_switch_of_current_is_on_disk_when_promote_returns(
    tmp_path: Path, disk_events: list[tuple[str, str]]
) -> None:
    root = tmp_path / "registry"
    version = reg.reserve_version(root, "acme")
    reg.publish(_bundle(reg.staging_path(root, "acme", version)), root, "acme", version)
    del disk_events[:]

    assert reg.promote(root, "acme", version)

    switched = _index(disk_events, ("rename", str(root / "acme" / reg.CURRENT)))
    assert ("fsync", str(root / "acme")) in disk_events[switched:]
