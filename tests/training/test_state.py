"""The run's checkpoint: interrupted at any moment of a save, it is still a whole checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.training.interrupts import Interrupted, interrupt_after
from training.state import STATE_FILE, TrainState


def _parts() -> dict[str, Any]:
    torch.manual_seed(0)
    model, objective = nn.Linear(3, 2), nn.Linear(2, 2)
    optimizer = torch.optim.AdamW([*model.parameters(), *objective.parameters()])
    return {"model": model, "objective": objective, "optimizer": optimizer, "layers": 1, "device": torch.device("cpu")}


def test_a_save_interrupted_at_any_moment_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    TrainState(step=1).save(folder, **_parts())
    interrupted = 0
    for operation in range(1, 20):
        with pytest.MonkeyPatch.context() as monkeypatch:
            interrupt_after(monkeypatch, operation, (torch, "save"))
            try:
                TrainState(step=2).save(folder, **_parts())
            except Interrupted:
                interrupted += 1
            else:
                break
        assert (folder / STATE_FILE).is_file(), f"no checkpoint after an interruption at file operation {operation}"
        assert TrainState.restore(folder, **_parts()).step in (1, 2)
    assert interrupted >= 1  # the save does touch files, and each interruption point was tried
    assert TrainState.restore(folder, **_parts()).step == 2
