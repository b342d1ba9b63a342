"""The run's checkpoint: interrupted at any moment of a save, it is still a whole checkpoint."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from training.state import STATE_FILE, TrainState


def _parts() -> dict[str, Any]:
    torch.manual_seed(0)
    model, objective = nn.Linear(3, 2), nn.Linear(2, 2)
    optimizer = torch.optim.AdamW([*model.parameters(), *objective.parameters()])
    return {"model": model, "objective": objective, "optimizer": optimizer, "layers": 1, "device": torch.device("cpu")}


class _Interrupted(BaseException):
    """Stands for a Ctrl-C (a KeyboardInterrupt is a BaseException too) arriving right after one file operation."""


def _interrupt_after(monkeypatch: pytest.MonkeyPatch, operation: int) -> None:
    """Make the ``operation``-th file operation of a save (counted from 1) complete, then interrupt the save."""
    count = {"n": 0}

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            out = function(*args, **kwargs)
            count["n"] += 1
            if count["n"] == operation:
                raise _Interrupted
            return out

        return wrapped

    monkeypatch.setattr(torch, "save", wrap(torch.save))
    monkeypatch.setattr(shutil, "rmtree", wrap(shutil.rmtree))
    monkeypatch.setattr(os, "replace", wrap(os.replace))
    monkeypatch.setattr(os, "rename", wrap(os.rename))
    monkeypatch.setattr(Path, "rename", wrap(Path.rename))
    monkeypatch.setattr(Path, "replace", wrap(Path.replace))


def test_a_save_interrupted_at_any_moment_leaves_a_whole_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    TrainState(step=1).save(folder, **_parts())
    interrupted = 0
    for operation in range(1, 20):
        with pytest.MonkeyPatch.context() as monkeypatch:
            _interrupt_after(monkeypatch, operation)
            try:
                TrainState(step=2).save(folder, **_parts())
            except _Interrupted:
                interrupted += 1
            else:
                break
        assert (folder / STATE_FILE).is_file(), f"no checkpoint after an interruption at file operation {operation}"
        assert TrainState.restore(folder, **_parts()).step in (1, 2)
    assert interrupted >= 1  # the save does touch files, and each interruption point was tried
    assert TrainState.restore(folder, **_parts()).step == 2
