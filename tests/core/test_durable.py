"""Durable writes on a volume that cannot fsync a folder (some network and FUSE filesystems answer EINVAL): the write
still happens, as durable as that filesystem makes it; a real I/O error on the folder still fails it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from core import durable
from core import registry as reg


def _folder_fsync_fails(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    fsync = os.fsync

    def failing(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)


def test_a_volume_that_cannot_fsync_a_folder_still_takes_writes_and_publishes(tmp_path: Path, monkeypatch) -> None:
    _folder_fsync_fails(monkeypatch, errno.EINVAL)
    durable.write_atomic(tmp_path / "a.json", '{"a": 1}')
    assert (tmp_path / "a.json").read_text() == '{"a": 1}'
    root = tmp_path / "registry"
    version = reg.reserve_version(root, "acme")
    staging = reg.staging_path(root, "acme", version)
    staging.mkdir()
    (staging / reg.MANIFEST).write_text('{"name": "acme"}')
    reg.publish(staging, root, "acme", version)
    assert reg.promote(root, "acme", version)
    assert reg.current_version(root, "acme") == version


def test_an_io_error_on_the_folder_still_fails_the_write(tmp_path: Path, monkeypatch) -> None:
    _folder_fsync_fails(monkeypatch, errno.EIO)
    with pytest.raises(OSError) as raised:
        durable.write_atomic(tmp_path / "a.json", "{}")
    assert raised.value.errno == errno.EIO
