"""The bundle registry on disk: the contract between export (writer) and service (reader).

```
<registry>/<name>/<version>/      manifest.json, model.onnx [, model_int8.onnx], tokenizer files
<registry>/<name>/current -> <version>   the promoted version (a symlink, switched atomically)
```

Versions are integers allocated atomically (a reservation directory made with ``os.mkdir``), so
concurrent exports of one name never share a version. A bundle is built in a temporary folder
and renamed into place only when complete: readers never see half a bundle.

Several processes share the registry (replicas, workers, `embedder export`, on one shared volume). Every change to a
name's entries — reserving a number, renaming a bundle in, dropping a reservation, switching ``current`` — is made
under the name's lock (``<name>/.lock``, ``flock``), so a process choosing the next number lists a folder no one is
changing (a directory listing taken while another process renames into it may miss both the new version and its
reservation, and hand the same number out twice), and ``current`` only ever moves to a newer version: a publish that
finishes after a newer version of the name was promoted leaves that one current. Readers take no lock.

Pure standard library: the service imports this without torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CURRENT = "current"
MANIFEST = "manifest.json"
# fullmatch, never match with "$": "$" also matches before a trailing newline, so "acme\n" would pass.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}", re.ASCII)
_RESERVED = ".reserved-"
_LOCK = ".lock"


class RegistryError(ValueError):
    """A bad model name, a missing model or version, or an unreadable bundle."""


def validate_name(name: str) -> str:
    """Model names are lower-case path-safe slugs: no separators, no ``..``, at most 64 chars."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name or name == CURRENT:
        raise RegistryError(
            f"invalid model name {name!r}: use 1-64 characters from a-z, 0-9, '.', '_', '-', "
            "starting with a letter or digit, without '..'"
        )
    return name


def name_from(text: str) -> str:
    """A valid model name made from free text (a folder's name, say): lower case, each run of other characters than
    a-z, 0-9, '.', '_', '-' as one '-', cut to 64 (``My Model v2`` → ``my-model-v2``); RegistryError when nothing
    usable is left."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).replace("..", ".").strip("-._")[:64].rstrip("-._")
    return validate_name(name)


def list_versions(root: Path, name: str) -> list[str]:
    """Published versions of ``name``, oldest first."""
    folder = Path(root) / validate_name(name)
    if not folder.is_dir():
        return []
    versions = [p.name for p in folder.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file()]
    return sorted(versions, key=int)


def current_version(root: Path, name: str) -> str | None:
    link = Path(root) / validate_name(name) / CURRENT
    if not link.is_symlink():
        return None
    version = os.readlink(link)
    return version if (link.parent / version / MANIFEST).is_file() else None


def served_models(root: Path) -> dict[str, Path]:
    """Every promoted model: name → folder of its current bundle."""
    root = Path(root)
    if not root.is_dir():
        return {}
    found = {}
    for folder in sorted(root.iterdir()):
        if folder.is_dir() and _NAME.fullmatch(folder.name):
            version = current_version(root, folder.name)
            if version is not None:
                found[folder.name] = folder / version
    return found


def current_bundle(root: Path, name: str) -> Path:
    version = current_version(root, name)
    if version is None:
        raise RegistryError(f"model {name!r} has no promoted version in {root}")
    return Path(root) / name / version


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = Path(bundle) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise RegistryError(f"cannot read bundle manifest {path}: {err}") from err


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold the lock of one name's folder (``flock`` on ``<name>/.lock``, released when the process dies)."""
    try:
        fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:  # made by another user (an export run as root): locking needs only to read it
        fd = os.open(folder / _LOCK, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def reserve_version(root: Path, name: str) -> str:
    """Claim the next free version number of ``name`` (safe across processes)."""
    folder = Path(root) / validate_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder):
        while True:
            version = str(max(_taken_numbers(folder), default=0) + 1)
            try:
                os.mkdir(folder / f"{_RESERVED}{version}")
                return version
            except FileExistsError:
                continue  # taken by a process that does not lock (an older release): try the next number


def _taken_numbers(folder: Path) -> list[int]:
    numbers = []
    for path in folder.iterdir():
        text = path.name.removeprefix(_RESERVED)
        if text.isdigit():
            numbers.append(int(text))
    return numbers


def publish(staging: Path, root: Path, name: str, version: str) -> Path:
    """Rename a complete bundle folder into ``<root>/<name>/<version>`` and release the reservation."""
    folder = Path(root) / validate_name(name)
    target = folder / version
    with _locked(folder):
        if target.exists():
            raise RegistryError(f"{target} already exists: versions are never overwritten")
        os.rename(staging, target)
        _release(folder, version)
    return target


def release(root: Path, name: str, version: str) -> None:
    """Drop a version reservation (after publishing, or when an export failed)."""
    folder = Path(root) / validate_name(name)
    with _locked(folder):
        _release(folder, version)


def _release(folder: Path, version: str) -> None:
    shutil.rmtree(folder / f"{_RESERVED}{version}", ignore_errors=True)


def promote(root: Path, name: str, version: str) -> bool:
    """Point ``<name>/current`` at ``version`` atomically (symlink + rename), unless a newer version of the name is
    current already (another process published and promoted it meanwhile: it stays). Returns whether ``version`` is
    current now."""
    folder = Path(root) / validate_name(name)
    if not (folder / version / MANIFEST).is_file():
        raise RegistryError(f"cannot promote {name} version {version}: no bundle at {folder / version}")
    with _locked(folder):
        current = current_version(root, name)
        if current is not None and current.isdigit() and version.isdigit() and int(current) > int(version):
            return False
        tmp = folder / f".{CURRENT}.{os.getpid()}.{version}"
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(version, tmp)
        os.replace(tmp, folder / CURRENT)
    return True
