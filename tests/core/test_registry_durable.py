"""What a power loss can leave of a publish: ``current`` never names a version whose files are not on disk.

A rename reaches the disk independently of the data of the files renamed (ext4's delayed allocation, a network
volume): unless the bundle's files are fsynced before the rename into the version, and the name's folder after it,
a power loss can leave a ``current`` that names a folder of empty or cut-short files, or that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import registry as reg
from tests.disk_events import Event, position, record_disk_events


def _bundle(folder: Path) -> Path:
    (folder / "tokenizer").mkdir(parents=True)
    (folder / reg.MANIFEST).write_text('{"name": "acme", "onnx": {"fp32": "model.onnx"}}')
    (folder / "model.onnx").write_bytes(b"graph" * 1000)
    (folder / "tokenizer" / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture
def disk_events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    return record_disk_events(monkeypatch)


def test_a_bundle_is_on_disk_before_it_is_renamed_into_its_version(
    tmp_path: Path, disk_events: list[Event]
) -> None:
    root = tmp_path / "registry"
    version = reg.reserve_version(root, "acme")
    staging = _bundle(reg.staging_path(root, "acme", version))
    names = [p.relative_to(staging) for p in sorted(staging.rglob("*"))]

    target = reg.publish(staging, root, "acme", version)

    renamed = position(disk_events, ("rename", str(target)))
    for name in names:  # the copy's files and folders, and the copy itself, as they were called before the rename
        assert position(disk_events, ("fsync", str(staging / name))) < renamed
    assert position(disk_events, ("fsync", str(staging))) < renamed
    assert ("fsync", str(root / "acme")) in disk_events[renamed:]  # the rename itself


def test_the_switch_of_current_is_on_disk_when_promote_returns(
    tmp_path: Path, disk_events: list[Event]
) -> None:
    root = tmp_path / "registry"
    version = reg.reserve_version(root, "acme")
    reg.publish(_bundle(reg.staging_path(root, "acme", version)), root, "acme", version)
    del disk_events[:]

    assert reg.promote(root, "acme", version)

    switched = position(disk_events, ("rename", str(root / "acme" / reg.CURRENT)))
    assert ("fsync", str(root / "acme")) in disk_events[switched:]
