"""A model folder built into the cache is on disk before it takes its name: the cache trusts a folder that has its
name (and config.json) for ever, so one a power loss left with empty or cut-short weights would never be rebuilt."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import catalog
from tests.disk_events import position, record_disk_events


def _build(folder: Path) -> None:
    (folder / "config.json").write_text("{}")
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights" * 1000)


def test_a_built_model_folder_is_on_disk_before_it_is_renamed_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "cache" / "models" / "rebuilt"
    events = record_disk_events(monkeypatch)

    assert catalog._publish_dir(_build, target) == target

    renamed = position(events, ("rename", str(target)))
    built = [e for e in events[:renamed] if e[0] == "fsync"]
    assert {Path(path).name for _, path in built} >= {"config.json", "1_Pooling", "model.safetensors"}
    assert ("fsync", str(target.parent)) in events[renamed:]
