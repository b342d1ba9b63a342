"""Files and folders that another process or a later run reads, written so that a kill or a power loss at any
instant leaves the old content or the new, whole — never half of it.

- `replacing` / `write_atomic`: the new content goes to a temporary file in the same folder (a rename never crosses
  filesystems), is flushed and fsynced, then renamed over the old file; the folder is fsynced so that the rename
  survives a power loss. A reader opening the path sees the old file or the new one. `remove_leftovers` deletes the
  temporary files of writers killed mid-write.
- `sync_tree`: fsync every file and folder under a folder built aside, before it is renamed into place: a rename
  that reaches the disk before the files' data (ext4's delayed allocation, a network volume) would put a folder of
  empty or cut-short files where readers look.
- `sync_folder`: fsync a folder, making the renames and creations in it durable.

Pure standard library: the service imports this without torch.
"""

from __future__ import annotations

import errno
import glob
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process's umask (reading it means setting it: put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# What fsync of a folder raises on filesystems that cannot do it (some network and FUSE volumes): there the names in
# a folder are as durable as the filesystem makes them, and a write must not fail for it (PostgreSQL ignores the same).
_FOLDER_FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EOPNOTSUPP})


def sync_folder(folder: Path) -> None:
    """fsync ``folder`` itself: the names created, renamed or removed in it reach the disk (where the filesystem can
    fsync a folder)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _FOLDER_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def sync_tree(folder: Path) -> None:
    """fsync every regular file under ``folder``, then every folder (deepest first, ``folder`` last)."""
    folders = []
    for dirpath, _dirnames, filenames in os.walk(folder):
        folders.append(dirpath)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for dirpath in reversed(folders):
        sync_folder(Path(dirpath))


@contextmanager
def replacing(path: Path, *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write the new content of ``path`` into, put in place in one step that survives a kill or a
    power loss at any moment when the block ends (left as it was when the block raises).

    ``mode``: the file's permissions; default what a plain ``open`` would give (0o666 less the umask), not the
    owner-only mode of a temporary file. A temporary file left by a killed writer is named ``.<name>.<random>``
    (`remove_leftovers`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, (0o666 & ~current_umask()) if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def write_atomic(path: Path, data: str | bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8) as `replacing` does."""
    with replacing(path, mode=mode) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)


def remove_leftovers(path: Path) -> list[Path]:
    """Delete the temporary files that writers of ``path`` killed mid-write left beside it; return them. Only for a
    caller that holds a lock every writer of ``path`` takes: a live writer's temporary file looks the same."""
    path = Path(path)
    removed = []
    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*"):
        if leftover.is_file() and not leftover.is_symlink():
            leftover.unlink(missing_ok=True)
            removed.append(leftover)
    return removed
