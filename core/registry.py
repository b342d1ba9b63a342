"""The bundle registry on disk: the contract between export (writer) and service (reader).

```
<registry>/<name>/<version>/      manifest.json, model.onnx [, model_int8.onnx], tokenizer files
<registry>/<name>/current -> <version>   the promoted version (a symlink, switched atomically)
```

Versions are integers allocated atomically (a reservation directory made with ``os.mkdir``), so
concurrent exports of one name never share a version. A bundle is built in a temporary folder
and renamed into place only when complete and fsynced: readers never see half a bundle, nor after a power loss.

Several processes share the registry (replicas, workers, `embedder export`, on one shared volume). Every change to a
name's entries — reserving a number, renaming a bundle in, dropping a reservation, switching ``current`` — is made
under the name's lock (``<name>/.lock``, ``flock``), so a process choosing the next number lists a folder no one is
changing (a directory listing taken while another process renames into it may miss both the new version and its
reservation, and hand the same number out twice), and ``current`` only ever moves to a newer version when a publish
promotes (`promote`): a publish that finishes after a newer version of the name was promoted leaves that one current.
An operator's deliberate rollback (`make_current`, ``embedder registry promote``) is the one way ``current`` moves to
an older version. Readers take no lock.

A publisher holds its reservation (`core.held`) until it is published or dropped, and copies the bundle into
``.staging-<version>`` beside it (`staging_path`); a publisher that died meanwhile (killed, out of memory) leaves both,
which the next reservation or prune of the name deletes (`_drop_abandoned`), as it does a ``current`` switch a death
cut short.

Old versions are removed by `prune`, under the same lock: never the current one, never a version still being
published (reserved) or published so recently that its publisher may not have promoted it yet, and never the newest,
so no number is handed out twice. A removed version is first renamed to a hidden name (``.pruned-<version>-…``) and
only then deleted: a reader finds a version whole or not at all.

Pure standard library: the service imports this without torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core import durable, held

CURRENT = "current"
MANIFEST = "manifest.json"
# fullmatch, never match with "$": "$" also matches before a trailing newline, so "acme\n" would pass.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}", re.ASCII)
_RESERVED = ".reserved-"
_STAGING = ".staging-"
_PRUNED = ".pruned-"
_LOCK = ".lock"
# A version published less than this long ago is never pruned: its publisher (an export, an /adapt job) may not have
# promoted it yet, and a promotion of a version removed meanwhile would fail instead of leaving a newer one current.
PRUNE_GRACE_SECONDS = 300.0


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
        _drop_abandoned(folder)
        while True:
            version = str(max(_taken_numbers(folder), default=0) + 1)
            try:
                os.mkdir(folder / f"{_RESERVED}{version}")
            except FileExistsError:
                continue  # taken by a process that does not lock (an older release): try the next number
            try:
                held.hold(folder / f"{_RESERVED}{version}")
            except BaseException:
                _release(folder, version)
                raise
            return version


def staging_path(root: Path, name: str, version: str) -> Path:
    """Where the publisher of reserved ``version`` copies its bundle before `publish` renames it into place."""
    return Path(root) / validate_name(name) / f"{_STAGING}{version}"


def _drop_abandoned(folder: Path) -> None:
    """Delete what publishers that died left in one name's folder (the caller holds its lock): each reservation no
    live process holds, with its staging copy, and ``current`` switches cut short."""
    for reservation in held.sweep(folder, f"{_RESERVED}*"):
        shutil.rmtree(folder / f"{_STAGING}{reservation.name.removeprefix(_RESERVED)}", ignore_errors=True)
    for path in folder.glob(f".{CURRENT}.*"):
        if path.is_symlink():
            path.unlink(missing_ok=True)


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
    durable.sync_tree(staging)  # on disk before any name points at it: a power loss leaves no version of empty files
    with _locked(folder):
        if target.exists():
            raise RegistryError(f"{target} already exists: versions are never overwritten")
        os.rename(staging, target)
        with suppress(OSError):  # its mtime says when it was published (`prune` spares the newly published)
            os.utime(target)
        durable.sync_folder(folder)  # the rename: a `current` switched after it never names a lost version
        _release(folder, version)
    return target


def release(root: Path, name: str, version: str) -> None:
    """Drop a version reservation (after publishing, or when an export failed)."""
    folder = Path(root) / validate_name(name)
    with _locked(folder):
        _release(folder, version)


def _release(folder: Path, version: str) -> None:
    shutil.rmtree(folder / f"{_RESERVED}{version}", ignore_errors=True)
    held.let_go(folder / f"{_RESERVED}{version}")


def promote(root: Path, name: str, version: str) -> bool:
    """Point ``<name>/current`` at ``version`` atomically (symlink + rename), unless a newer version of the name is
    current already (another process published and promoted it meanwhile: it stays). Returns whether ``version`` is
    current now. What publishes call; an operator's rollback to an older version is `make_current`."""
    folder = Path(root) / validate_name(name)
    if not folder.is_dir():
        raise RegistryError(f"cannot promote {name} version {version}: no bundle at {folder / version}")
    with _locked(folder):  # checked under the lock: a prune may remove an older version until it is held
        if not (folder / version / MANIFEST).is_file():
            raise RegistryError(f"cannot promote {name} version {version}: no bundle at {folder / version}")
        current = current_version(root, name)
        if current is not None and current.isdigit() and version.isdigit() and int(current) > int(version):
            return False
        _point_current(folder, version)
    return True


def make_current(root: Path, name: str, version: str) -> str | None:
    """Point ``<name>/current`` at ``version`` whether it is newer or older than the current one: the operator's
    explicit promotion, a rollback included (`promote`, what publishes call, never moves ``current`` back). Refuses,
    with RegistryError, a name or version that does not exist, a version still being published, and a bundle that is
    not whole (`bundle_problem`). Returns the version that was current before (``version`` itself: nothing changed)."""
    folder = _existing(root, name)
    with _locked(folder):
        if not (version.isdigit() and (folder / version).is_dir()):
            if (folder / f"{_RESERVED}{version}").is_dir():
                raise RegistryError(f"version {version} of {name} is still being published: not promoted")
            versions = ", ".join(list_versions(root, name)) or "none"
            raise RegistryError(f"{name} has no version {version!r} (versions: {versions})")
        problem = bundle_problem(folder / version)
        if problem is not None:
            raise RegistryError(f"version {version} of {name} cannot be served: {problem}; not promoted")
        before = current_version(root, name)
        if before != version:
            _point_current(folder, version)
    return before


def _point_current(folder: Path, version: str) -> None:
    """Switch ``current`` to ``version`` in one rename (the caller holds the name's lock)."""
    tmp = folder / f".{CURRENT}.{os.getpid()}.{version}"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(version, tmp)
    os.replace(tmp, folder / CURRENT)
    durable.sync_folder(folder)  # a promotion reported done survives a power loss


def _existing(root: Path, name: str) -> Path:
    folder = Path(root) / validate_name(name)
    if not folder.is_dir():
        names = ", ".join(model_names(root)) or "none"
        raise RegistryError(f"no model {name!r} in registry {Path(root)} (models: {names})")
    return folder


def model_names(root: Path) -> list[str]:
    """Every name with a folder in the registry (promoted or not), sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and _NAME.fullmatch(p.name) and p.name != CURRENT)


def publishing_versions(root: Path, name: str) -> list[str]:
    """Versions of ``name`` reserved by a publish that has not finished (or died: its reservation stays)."""
    folder = Path(root) / validate_name(name)
    if not folder.is_dir():
        return []
    found = [p.name.removeprefix(_RESERVED) for p in folder.iterdir() if p.name.startswith(_RESERVED)]
    return sorted((v for v in found if v.isdigit()), key=int)


def bundle_problem(bundle: Path) -> str | None:
    """Why ``bundle`` is not whole — no readable manifest, or a file its manifest names (``files``, the ``onnx`` and
    ``openvino`` graphs, the tokenizer) missing — or None."""
    try:
        manifest = read_manifest(bundle)
    except RegistryError as err:
        return str(err)
    named = set(manifest.get("files") or {})
    for key in ("onnx", "openvino"):
        named.update(str(f) for f in (manifest.get(key) or {}).values())
    tokenizer = (manifest.get("tokenizer") or {}).get("file") if isinstance(manifest.get("tokenizer"), dict) else None
    if tokenizer:
        named.add(str(tokenizer))
    missing = sorted(f for f in named if not (Path(bundle) / f).is_file())
    if missing:
        return f"incomplete: {', '.join(missing)} missing"
    return None


def version_summary(root: Path, name: str, version: str) -> dict[str, Any]:
    """What one published version is, from its manifest: when it was made, from what, how, its quantization, the
    figures of the gate it passed (an /adapt job's), its size, whether it is current, and any problem."""
    bundle = Path(root) / validate_name(name) / version
    problem = bundle_problem(bundle)
    try:
        manifest = read_manifest(bundle)
    except RegistryError:
        manifest = {}
    method = manifest.get("method")
    return {
        "name": name,
        "version": version,
        "current": current_version(root, name) == version,
        "created_at": manifest.get("created_at"),
        "published_at": _published_at(bundle),
        "base_model": manifest.get("base_model"),
        "parent": manifest.get("parent"),
        "method": method.get("name") if isinstance(method, dict) else method,
        "quantization": manifest.get("quantization"),
        "dim": manifest.get("dim"),
        "layers": manifest.get("layers"),
        "max_seq_length": manifest.get("max_seq_length"),
        "trained_on": manifest.get("trained_on"),
        "validation": _validation_summary(manifest.get("validation")),
        "size_bytes": _size(bundle),
        "problem": problem,
    }


def _validation_summary(validation: object) -> dict[str, Any] | None:
    """An /adapt job's record in the manifest without its whole evaluation: the job, and the gate's decision with the
    score it decided on (base → adapted) and its table."""
    if not isinstance(validation, dict):
        return None
    gate = validation.get("gate") if isinstance(validation.get("gate"), dict) else {}
    table = gate.get("table") if isinstance(gate.get("table"), list) else []
    decided_on = gate.get("decided_on")
    row = next((r for r in table if isinstance(r, dict) and r.get("task") == decided_on), None)
    return {
        "job": validation.get("job"),
        "gate_passed": gate.get("passed"),
        "decided_on": decided_on,
        "decided_on_score": row,
        "margin": gate.get("margin"),
        "reasons": gate.get("reasons"),
        "table": table,
    }


def _published_at(bundle: Path) -> float | None:
    try:
        return bundle.stat().st_mtime
    except OSError:
        return None


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for file in files:
            with suppress(OSError):  # removed meanwhile
                total += os.lstat(os.path.join(dirpath, file)).st_size
    return total


@dataclass
class Pruned:
    """What `prune` did (or, dry, would do) to one name: versions removed and kept, each kept one with why."""

    name: str
    keep: int
    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # version -> why it stays
    publishing: list[str] = field(default_factory=list)  # reserved versions, never touched
    freed_bytes: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prune(
    root: Path, name: str, keep: int, *, dry_run: bool = False, grace_seconds: float = PRUNE_GRACE_SECONDS
) -> Pruned:
    """Remove the versions of ``name`` older than its newest ``keep`` (at least 1), under the name's lock. Kept
    whatever ``keep`` says: the current version, versions still being published (reserved), and versions published
    less than ``grace_seconds`` ago (their publisher may be about to promote them). Each removed version is renamed to
    a hidden name under the lock, so no reader ever finds it half deleted, then deleted after the lock is released (a
    copy left by a process that died while deleting is deleted by the next prune). ``dry_run``: say what would go."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise RegistryError(
            f"keep must be at least 1, got {keep!r}: the newest version always stays, so that no version number is "
            "handed out twice"
        )
    folder = _existing(root, name)
    result = Pruned(name=name, keep=keep, dry_run=dry_run)
    doomed: list[Path] = []
    with _locked(folder):
        if not dry_run:
            _drop_abandoned(folder)
        versions = list_versions(root, name)
        current = current_version(root, name)
        result.publishing = publishing_versions(root, name)
        newest = set(versions[-keep:])
        now = time.time()
        for version in reversed(versions):
            published = _published_at(folder / version)
            if version == current:
                result.kept[version] = "current"
            elif version in newest:
                result.kept[version] = f"among the newest {keep}"
            elif version in result.publishing:
                result.kept[version] = "still being published"
            elif published is not None and now - published < grace_seconds:
                result.kept[version] = f"published {now - published:.0f} s ago (less than {grace_seconds:g} s)"
            else:
                result.removed.append(version)
        result.removed.reverse()
        result.freed_bytes = sum(_size(folder / version) for version in result.removed)
        if dry_run:
            return result
        for version in result.removed:
            trash = folder / f"{_PRUNED}{version}-{secrets.token_hex(4)}"
            os.rename(folder / version, trash)
        doomed = [p for p in folder.iterdir() if p.name.startswith(_PRUNED)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return result
