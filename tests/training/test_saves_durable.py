"""What a power loss can leave of a run's saves: the checkpoint never names a best/ model whose files are not on disk.

A validation saves best/ (written to best.tmp, renamed in), then the checkpoint records that step as the best one, with
an fsync. Unless best.tmp's files are fsynced before the rename and the run folder after it, a power loss can leave
a checkpoint naming a best/ of empty or cut-short files, or the old best/, which a resume and the export then use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.disk_events import position, record_disk_events
from training.assembly import save_model
from training.encoder import Encoder
from training.state import STATE_FILE, TrainState


def test_a_saved_model_is_on_disk_before_it_takes_its_folders_name(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    folder = tmp_path / "run" / "best"
    save_model(encoder, folder, 32)  # an older best/, replaced below
    staging = folder.with_name("best.tmp")
    events = record_disk_events(monkeypatch)

    save_model(encoder, folder, 32)

    renamed = position(events, ("rename", str(folder)))
    for path in sorted(folder.rglob("*")):
        assert position(events, ("fsync", str(staging / path.relative_to(folder)))) < renamed
    assert position(events, ("fsync", str(staging))) < renamed
    assert ("fsync", str(folder.parent)) in events[renamed:]


def test_the_checkpoints_rename_is_on_disk_when_the_save_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(2, 2)
    folder = tmp_path / "run" / "checkpoint"
    events = record_disk_events(monkeypatch)

    TrainState(step=3).save(folder, model=model, objective=torch.nn.Identity(),
                            optimizer=torch.optim.SGD(model.parameters(), lr=0.1), layers=1,
                            device=torch.device("cpu"))  # fmt: skip

    renamed = position(events, ("rename", str(folder / STATE_FILE)))
    assert ("fsync", str(folder)) in events[renamed:]
