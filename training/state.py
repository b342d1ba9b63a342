"""The run's state: where a training run is, what it has found, and how to save and restore it.

`TrainState` is everything that changes from step to step apart from the tensors (model, objective, optimiser):
the position in the data, the best validation so far, the logs, and the clock. `save` writes it with those
tensors, the state the regularisers keep outside their registered tensors (`extra_states`: the rehearsal's draw of
texts and its kept reference embeddings) and every RNG to ``DIR/checkpoint/state.pt`` (written aside, then renamed
over the last one); `restore` reads it back, so a resumed run continues bit-for-bit where the interrupted one stopped.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from core.durable import sync_folder
from core.model_folder import BEST_DIR, RECIPE_FILE
from training.config import ConfigError, TrainConfig
from training.recipe_values import show_value

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
METRICS_FILE = "metrics.jsonl"  # in the run's output folder, next to the checkpoint folder

T = TypeVar("T")


@dataclass
class TrainState:
    """Position, best score and logs of a run; ``elapsed()`` counts every session of it, resumed ones included."""

    step: int = 0  # optimiser steps taken
    epoch: int = 0  # epoch of the next batch
    index: int = 0  # index of the next batch within its epoch
    best_score: float | None = None
    best_step: int | None = None
    bad_evaluations: int = 0  # validations in a row without improvement (early stopping's patience counter)
    history: list[dict[str, Any]] = field(default_factory=list)  # logged training steps
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # validations
    elapsed_before: float = 0.0  # seconds spent by earlier sessions of this run
    session_start: float = field(default_factory=time.perf_counter)

    def start_clock(self) -> None:
        """Start this run's clock (after loading: setting up is not training time)."""
        self.session_start = time.perf_counter()

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.session_start

    def fraction_done(self, total_steps: int | None, time_budget_s: float | None) -> float:
        """How far the run is, in [0, 1] when it has an end: whichever of steps and time budget is further."""
        fractions = [0.0]
        if total_steps:
            fractions.append(self.step / total_steps)
        if time_budget_s:
            fractions.append(self.elapsed() / time_budget_s)
        return max(fractions)

    def record_validation(self, score: float) -> bool:
        """Count a validation score; True when it is the best so far (the caller then saves the model)."""
        improved = self.best_score is None or score > self.best_score
        if improved:
            self.best_score, self.best_step, self.bad_evaluations = score, self.step, 0
        else:
            self.bad_evaluations += 1
        return improved

    def save(
        self,
        folder: Path,
        *,
        model: nn.Module,
        objective: nn.Module,
        optimizer: torch.optim.Optimizer,
        layers: int,
        device: torch.device,
        regularisers: dict[str, nn.Module] | None = None,
    ) -> None:
        """Write ``folder/state.pt`` with the tensors, the regularisers' `extra_states` and every torch RNG. The file
        is written next to its place and renamed over the previous one, which replaces it in one step: interrupted at
        any moment (Ctrl-C, a kill, a full disk), the folder holds either the previous checkpoint or this one,
        whole."""
        folder.mkdir(parents=True, exist_ok=True)
        staging = folder / (STATE_FILE + ".tmp")
        state = {
            "model": model.state_dict(),
            "objective": objective.state_dict(),
            "regularisers": extra_states(regularisers or {}),
            "optimizer": optimizer.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "index": self.index,
            "layers": layers,
            "elapsed": self.elapsed(),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "bad_evaluations": self.bad_evaluations,
            "history": self.history,
            "evaluations": self.evaluations,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        }
        with staging.open("wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, folder / STATE_FILE)
        sync_folder(folder)  # the rename too: a run resumed after a power loss starts from this checkpoint

    @classmethod
    def restore(
        cls,
        folder: Path,
        *,
        model: nn.Module,
        objective: nn.Module,
        optimizer: torch.optim.Optimizer,
        layers: int,
        device: torch.device,
        regularisers: dict[str, nn.Module] | None = None,
    ) -> TrainState:
        """Load ``folder/state.pt`` into the tensors, the regularisers and the torch RNGs and return the run's state.

        The run's metrics log (``metrics.jsonl`` next to ``folder``) is cut back to the lines of the steps and
        validations the checkpoint holds: a session killed after its last checkpoint had logged steps that the
        resumed run takes, and logs, again. Without the run's ``best/`` folder the best score is forgotten."""
        state = torch.load(folder / STATE_FILE, map_location=device, weights_only=False)
        if state["layers"] != layers:
            raise ValueError(
                f"checkpoint in {folder} has {state['layers']} layers but this config builds {layers}: "
                "resume with the config that wrote it"
            )
        model.load_state_dict(state["model"])
        if state["objective"] is not None:  # None: written when CoSENT was not yet a module (it has no state)
            objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        load_extra_states(regularisers or {}, state.get("regularisers", {}))
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        restored = cls(
            step=state["step"],
            epoch=state["epoch"],
            index=state["index"],
            best_score=state["best_score"],
            best_step=state["best_step"],
            bad_evaluations=state["bad_evaluations"],
            history=state["history"],
            evaluations=state["evaluations"],
            elapsed_before=state["elapsed"],
        )
        restored.rewrite_metrics_log(folder.parent / METRICS_FILE)
        if restored.best_step is not None and not (folder.parent / BEST_DIR).is_dir():
            # best/ is gone (deleted, or its save interrupted): the next validation writes it again, or the run would
            # name a best model that no folder holds
            restored.best_score, restored.best_step, restored.bad_evaluations = None, None, 0
        return restored

    def rewrite_metrics_log(self, path: Path) -> None:
        """Write ``path`` with this state's logged steps and validations, in the order the run logged them (a step's
        line, then its validation's), as the trainer writes them."""
        records = sorted(
            [*self.history, *self.evaluations], key=lambda record: (record["step"], record.get("kind") != "train")
        )
        staging = path.with_name(path.name + ".tmp")
        staging.write_text("".join(json.dumps(record, default=float) + "\n" for record in records))
        os.replace(staging, path)


def _keeps_extra_state(module: nn.Module) -> bool:
    return type(module).get_extra_state is not nn.Module.get_extra_state


def extra_states(modules: dict[str, nn.Module]) -> dict[str, Any]:
    """The state ``modules`` (and their submodules) keep outside their registered tensors, through torch's
    ``get_extra_state`` hook — a random generator's position, values computed as they ran —, by ``key.submodule``.
    Regularisers are rebuilt from the recipe on resume and their registered tensors are frozen copies (the anchor's
    start model, the rehearsal's reference), so this is all of theirs a checkpoint needs; an objective's extra state is
    in its ``state_dict`` already."""
    return {
        f"{key}.{name}": sub.get_extra_state()
        for key, module in modules.items()
        for name, sub in module.named_modules()
        if _keeps_extra_state(sub)
    }


def load_extra_states(modules: dict[str, nn.Module], states: dict[str, Any]) -> None:
    """Give ``modules`` back the `extra_states` a checkpoint holds. A checkpoint written before a term's state was
    kept has none: the term starts afresh (the run goes on, no longer bit-for-bit), and the log says so."""
    for key, module in modules.items():
        for name, sub in module.named_modules():
            if not _keeps_extra_state(sub):
                continue
            if f"{key}.{name}" in states:
                sub.set_extra_state(states[f"{key}.{name}"])
            else:
                log.warning("the checkpoint holds no state for the %r term: it starts from its seed again", key)


# what a resumed run may set differently from the session that wrote its checkpoint: how long it runs, how often it
# validates, logs and checkpoints, and where and how fast it computes. Anything else changes what the checkpoint's
# steps meant (the data, its order, the model, the objective, the optimiser, the validation that chose best/).
RESUMABLE_CHANGES = frozenset({
    "name", "output_dir", "resume", "progress_bar", "num_threads", "device", "max_steps", "epochs", "time_budget_s",
    "eval_every", "early_stopping_patience", "checkpoint_every", "log_every",
})  # fmt: skip


def check_resume(config: TrainConfig, out: Path) -> None:
    """Refuse to resume the run in ``out`` with settings that change what its checkpoint's steps meant (see
    `RESUMABLE_CHANGES`): `ConfigError` naming the keys, ``key = old → new``. `train` calls it before any work, so
    every caller gets it."""
    conflicts = resume_conflicts(config, out / RECIPE_FILE)
    if conflicts:
        raise ConfigError(
            f"cannot resume {out}: its checkpoint was trained with other settings ({'; '.join(conflicts)}): resume "
            "with the recipe that wrote it, or set another output_dir for a new run"
        )


def resume_conflicts(config: TrainConfig, recorded: Path) -> list[str]:
    """The settings of ``config`` that differ from the run recorded in ``recorded`` (its ``recipe.json``), outside
    `RESUMABLE_CHANGES`, as ``key = old → new``; empty when the file is missing."""
    if not recorded.is_file():
        return []
    before = json.loads(recorded.read_text())
    now = json.loads(json.dumps(config.to_dict()))  # lists and floats as the file holds them
    return [
        f"{key} = {_brief(before[key])} → {_brief(value)}"
        for key, value in now.items()
        if key not in RESUMABLE_CHANGES and key in before and before[key] != value
    ]


def _brief(value: Any, width: int = 60) -> str:
    text = show_value(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def without_rng_side_effects(device: torch.device, fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn`` and restore every RNG afterwards: validation (mteb seeds its own generators) must not change
    the training run, or a resumed run would differ from an uninterrupted one."""
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        return fn(*args)
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)
