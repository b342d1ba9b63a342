"""An export killed while it builds (SIGKILL, out of memory: no handler runs) leaves its folder under the temporary
folder; the next export deletes it, never the folder of an export still running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core import held
from export import bundle

REPO = Path(__file__).resolve().parents[2]

# An export whose build writes part of a bundle, then is killed.
KILLED = """
import os, signal, sys
from export import bundle

def build(model, staging, name, **kwargs):
    (staging / "model.onnx").write_bytes(b"w" * 65536)
    os.kill(os.getpid(), signal.SIGKILL)

bundle.build_bundle = build
bundle.export_bundle("unused", sys.argv[1], "tiny")
"""


def _failing_build(*args: object, **kwargs: object) -> dict:
    raise ValueError("no model here")


def test_the_next_export_deletes_the_folders_of_killed_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary, registry = tmp_path / "tmp", tmp_path / "registry"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", KILLED, str(registry)], cwd=REPO, env=env, timeout=300)
        assert done.returncode == -signal.SIGKILL
    assert len(list(temporary.glob(f"{bundle.SCRATCH_PREFIX}*"))) == 1  # each deleted the one killed before it
    running = held.make_held(f"{bundle.SCRATCH_PREFIX}other-", temporary)  # an export under way in this process
    monkeypatch.setattr("tempfile.tempdir", str(temporary))
    monkeypatch.setattr(bundle, "build_bundle", _failing_build)
    try:
        with pytest.raises(ValueError, match="no model here"):
            bundle.export_bundle("unused", registry, "tiny")
        assert list(temporary.glob(f"{bundle.SCRATCH_PREFIX}*")) == [running]
    finally:
        held.let_go(running)
