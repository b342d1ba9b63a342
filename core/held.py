"""Folders a process works in until it is done with them — an export's staging, a version being published into the
registry, the service's worker configuration — marked as held while their process lives, so that a later process can
tell a live one from one left behind by a process that was killed (SIGKILL, out of memory, a lost node) and delete it.

A held folder holds a lock file (`HELD_FILE`) its process keeps an exclusive ``flock`` on for as long as it works in
the folder; the kernel drops the lock when the process dies, however it dies. A folder is abandoned (`abandoned`)
when that lock can be taken; one without the lock file (made by an earlier release, or by a process killed between
making the folder and locking it) only once it is older than `UNMARKED_GRACE_S`. `sweep` deletes the abandoned
folders matching a pattern. Pure standard library.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

HELD_FILE = ".held"
# A folder without the lock file is taken for a live one until it is this old: a publisher of an earlier release
# (during a rolling upgrade) marks none.
UNMARKED_GRACE_S = 3600.0

_held: dict[Path, int] = {}  # folder → the descriptor holding its lock, in this process
_guard = threading.Lock()


def hold(folder: Path) -> Path:
    """Mark ``folder`` (which exists) as held by this process until `let_go`. Returns it."""
    folder = Path(folder).absolute()
    marker = folder / HELD_FILE
    if marker.exists():  # marked already (by a holder that let go): locked where it is, or refused while held
        fd = os.open(marker, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
    else:
        # Locked before it takes its name: a sweep that finds the lock file unlocked must be able to conclude that
        # its holder is gone, never that it has not locked it yet (a new folder is fresh without one: spared).
        fd, staged = tempfile.mkstemp(dir=folder, prefix=f"{HELD_FILE}.")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.fchmod(fd, 0o644)  # a sweeper of another user tests the lock through a read-only descriptor
            os.rename(staged, marker)
        except BaseException:
            os.close(fd)
            Path(staged).unlink(missing_ok=True)
            raise
    with _guard:
        _held[folder] = fd
    return folder


def make_held(prefix: str, parent: Path | None = None) -> Path:
    """A new, empty folder (``tempfile.mkdtemp``: owner-only) under ``parent`` (default: the temporary folder), held
    by this process."""
    return hold(Path(tempfile.mkdtemp(prefix=prefix, dir=parent)))


def let_go(folder: Path) -> None:
    """Drop this process's hold on ``folder`` (once it is deleted or handed over)."""
    with _guard:
        fd = _held.pop(Path(folder).absolute(), None)
    if fd is not None:
        os.close(fd)


def abandoned(folder: Path, grace_s: float = UNMARKED_GRACE_S) -> bool:
    """Whether no live process holds ``folder``: its lock can be taken, or it has no lock file and is older than
    ``grace_s`` seconds."""
    folder = Path(folder).absolute()
    with _guard:
        if folder in _held:
            return False
    try:
        fd = os.open(folder / HELD_FILE, os.O_RDONLY)
    except FileNotFoundError:
        try:
            return time.time() - folder.stat().st_mtime > grace_s
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # its process still holds it
    finally:
        os.close(fd)
    return True


def sweep(parent: Path, pattern: str) -> list[Path]:
    """Delete the folders under ``parent`` matching ``pattern`` (a glob) that no live process holds; return them."""
    parent = Path(parent)
    if not parent.is_dir():
        return []
    removed = []
    for path in sorted(parent.glob(pattern)):
        if path.is_dir() and not path.is_symlink() and abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
