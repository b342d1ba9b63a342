"""A run's output folder: what a new run clears, what a resumed one repairs first, and the recipe it records
(``recipe.json``, with ``trained_on``: the corpora the run's weights saw)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from core.corpora import CUSTOM_CORPUS
from core.durable import write_atomic
from core.model_folder import BEST_DIR, FINAL_DIR, RECIPE_FILE, TRAINED_ON_KEY, read_trained_on
from training.assembly import recover_model_folder
from training.config import TrainConfig
from training.data import corpus_names
from training.state import METRICS_FILE


def prepare_output(config: TrainConfig, out: Path, *, fresh: bool) -> None:
    """Clear a previous run's outputs unless resuming it (then finish or undo a model save it left half-done, before
    the checkpoint is read: it looks for best/); record the recipe."""
    for folder in (BEST_DIR, FINAL_DIR):
        recover_model_folder(out / folder)
    if fresh:
        for stale in ("checkpoint", BEST_DIR, FINAL_DIR, METRICS_FILE, "result.json"):
            target = out / stale
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    recipe = {**config.to_dict(), TRAINED_ON_KEY: trained_on(config)}
    # replaced in one step: a resumed run killed while recording it leaves the recipe its checkpoint was trained with
    write_atomic(out / RECIPE_FILE, json.dumps(recipe, indent=2))


def trained_on(config: TrainConfig) -> list[str]:
    """The corpora the run's weights are trained on: those the start model's recipe declares, then the run's own
    (built-in names, or ``custom`` for scored pairs, a path or texts), the rehearsal's texts included. Evaluation
    judges domains by them."""
    own = [CUSTOM_CORPUS] if config.pairs else corpus_names(config.corpus)
    if config.rehearsal_weight > 0 and config.rehearsal_texts:
        own += corpus_names(config.rehearsal_texts)
    return list(dict.fromkeys(read_trained_on(config.model) + own))
