"""A publisher killed while it copies a bundle into the registry (SIGKILL, out of memory) leaves its reservation and its
staging copy behind: the next reservation or prune of the name deletes them, never a live publisher's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core import registry

ROOT = Path(__file__).resolve().parents[2]

# Reserve the next version, copy part of a bundle into its staging folder, and die there.
KILLED_MID_COPY = """
import os, signal, sys
from pathlib import Path
from core import registry
root, name = Path(sys.argv[1]), sys.argv[2]
version = registry.reserve_version(root, name)
staging = registry.staging_path(root, name, version)
staging.mkdir()
(staging / "model.onnx").write_bytes(b"w" * 65536)
os.kill(os.getpid(), signal.SIGKILL)
"""

# Reserve the next version, say so, and wait to be told to go.
ALIVE = """
import sys
from pathlib import Path
from core import registry
root, name = Path(sys.argv[1]), sys.argv[2]
version = registry.reserve_version(root, name)
registry.staging_path(root, name, version).mkdir()
print(version, flush=True)
sys.stdin.read()
"""


def _run(script: str, root: Path, name: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, str(root), name], cwd=ROOT, text=True, **kwargs  # type: ignore[call-overload]
    )


def _publish(root: Path, name: str) -> str:
    version = registry.reserve_version(root, name)
    staging = registry.staging_path(root, name, version)
    staging.mkdir()
    (staging / registry.MANIFEST).write_text(json.dumps({"name": name, "version": version, "files": {}}))
    registry.publish(staging, root, name, version)
    registry.promote(root, name, version)
    return version


def _leftovers(root: Path, name: str) -> list[str]:
    return sorted(p.name for p in (root / name).iterdir() if p.name.startswith((".reserved-", ".staging-")))


def test_publishers_killed_mid_copy_leave_nothing_after_the_next_publish(tmp_path: Path) -> None:
    _publish(tmp_path, "m")
    for _ in range(3):
        proc = _run(KILLED_MID_COPY, tmp_path, "m")
        assert proc.wait(timeout=60) == -signal.SIGKILL
    # each reservation deleted what the publisher killed before it left: only the last one's are there
    assert _leftovers(tmp_path, "m") == [".reserved-2", ".staging-2"]
    assert registry.publishing_versions(tmp_path, "m") == ["2"]
    _publish(tmp_path, "m")
    assert _leftovers(tmp_path, "m") == []
    assert registry.publishing_versions(tmp_path, "m") == []


def test_prune_drops_a_dead_publisher_and_keeps_a_live_one(tmp_path: Path) -> None:
    _publish(tmp_path, "m")
    dead = _run(KILLED_MID_COPY, tmp_path, "m")
    assert dead.wait(timeout=60) == -signal.SIGKILL
    alive = _run(ALIVE, tmp_path, "m", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert alive.stdout is not None
        version = alive.stdout.readline().strip()
        result = registry.prune(tmp_path, "m", keep=1)
        assert result.publishing == [version]
        assert _leftovers(tmp_path, "m") == [f".reserved-{version}", f".staging-{version}"]
    finally:
        assert alive.stdin is not None
        alive.stdin.close()
        alive.wait(timeout=60)
    registry.prune(tmp_path, "m", keep=1)  # its publisher is gone now
    assert _leftovers(tmp_path, "m") == []


def test_a_reservation_without_a_lock_file_is_kept_until_old(tmp_path: Path) -> None:
    """What a publisher of an earlier release reserves carries no lock file: taken for a live one for a while."""
    _publish(tmp_path, "m")
    (tmp_path / "m" / ".reserved-7").mkdir()
    registry.prune(tmp_path, "m", keep=1)
    assert _leftovers(tmp_path, "m") == [".reserved-7"]
    then = time.time() - 2 * 3600
    os.utime(tmp_path / "m" / ".reserved-7", (then, then))
    registry.prune(tmp_path, "m", keep=1)
    assert _leftovers(tmp_path, "m") == []


def test_a_current_switch_cut_short_is_removed(tmp_path: Path) -> None:
    _publish(tmp_path, "m")
    os.symlink("1", tmp_path / "m" / ".current.99999.1")  # a promoter killed between its symlink and the rename
    _publish(tmp_path, "m")
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".current.")]
    assert registry.current_version(tmp_path, "m") == "2"
