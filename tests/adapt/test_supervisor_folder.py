"""The folder of the workers' config file (it may hold the store's password): a service killed before it stopped
its supervisor leaves it; the next supervisor deletes it, never the folder of one still running."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from adapt_jobs.settings import AdaptConfig, AdaptSettings
from service.adapt import supervisor as supervision

REPO = Path(__file__).resolve().parents[2]

# A service that made its supervisor (config file written), then was killed.
KILLED = """
import os, signal, sys
from pathlib import Path
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from service.adapt.supervisor import WorkerSupervisor

root = Path(sys.argv[1])
config = AdaptConfig(registry_dir=root / "registry", cache_dir=root / "cache", settings=AdaptSettings(dir=root / "a"))
WorkerSupervisor(config, None)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_services_config_folder_is_deleted_by_the_next_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary)}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], cwd=REPO, env=env, timeout=120)
        assert done.returncode == -signal.SIGKILL
    pattern = f"{supervision.CONFIG_PREFIX}*"
    assert len(list(temporary.glob(pattern))) == 1  # each deleted the one killed before it
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    config = AdaptConfig(
        registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=AdaptSettings(dir=tmp_path / "a")
    )
    running = supervision.WorkerSupervisor(config, None)  # type: ignore[arg-type]
    try:
        assert [p.name for p in temporary.glob(pattern)] == [running.config_file.parent.name]
        other = supervision.WorkerSupervisor(config, None)  # type: ignore[arg-type]
        assert sorted(temporary.glob(pattern)) == sorted([running.config_file.parent, other.config_file.parent])
        asyncio.run(other.stop())
    finally:
        asyncio.run(running.stop())
    assert list(temporary.glob(pattern)) == []
