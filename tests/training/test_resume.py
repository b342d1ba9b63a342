"""Resuming a run: after a hard stop (a kill, a second Ctrl-C) past its last checkpoint its output folder ends as an
uninterrupted run's; without its best/ folder, the resumed run writes one again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.model_folder import RECIPE_FILE
from tests.training.test_trainer import assert_same_weights, stop_after, tiny_config, weights
from training.config import ConfigError
from training.encoder import Encoder
from training.state import STATE_FILE
from training.trainer import train
from training.validation import CropPairValidation


def _logged(folder: Path) -> list[tuple[str, int]]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [(record["kind"], record["step"]) for record in map(json.loads, lines)]


def _killed_at(step: int):
    """A progress hook that stops the run the hard way once ``step`` is logged, as a kill would."""

    def hook(record: dict) -> None:
        if record["kind"] == "train" and record["step"] == step:
            raise KeyboardInterrupt

    return hook


def test_a_run_killed_after_its_checkpoint_resumes_with_one_log_line_per_step(
    tmp_path: Path, tiny_bert_path: Path
) -> None:
    settings = {"max_steps": 6, "log_every": 1, "eval_every": 2, "checkpoint_every": 2}
    straight = train(tiny_config(tmp_path, tiny_bert_path, "straight", **settings))
    config = tiny_config(tmp_path, tiny_bert_path, "killed", **settings)
    with pytest.raises(KeyboardInterrupt):
        train(config, progress=_killed_at(3))  # step 3 is logged; the checkpoint is at step 2
    resumed = train(config.replace(resume=True))
    assert _logged(resumed.output_dir) == _logged(straight.output_dir)
    assert [r["step"] for r in resumed.history] == [r["step"] for r in straight.history]
    assert_same_weights(weights(resumed.final_dir), weights(straight.final_dir), atol=0)


def test_a_resumed_run_whose_best_folder_is_gone_writes_it_again(
    tmp_path: Path, tiny_bert_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = iter([0.5, 0.9, 0.2, 0.1])  # validations at steps 0 and 1; after resuming, at steps 2 and 3

    def fake_evaluate(self: CropPairValidation, encoder: Encoder) -> dict[str, float]:
        return {CropPairValidation.metric: next(scripted)}

    monkeypatch.setattr(CropPairValidation, "evaluate", fake_evaluate)
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=1, eval_every=1)
    first = train(config)
    shutil.rmtree(first.best_dir)  # removed to save space, or its save was interrupted
    resumed = train(config.replace(resume=True, max_steps=3))
    assert resumed.best_dir.is_dir()
    assert (resumed.best_step, resumed.best_score) == (2, 0.2)
    assert [(e["step"], e["best"]) for e in resumed.evaluations] == [(0, True), (1, True), (2, True), (3, False)]


def test_a_rehearsing_run_resumes_bit_for_bit(tmp_path: Path, tiny_bert_path: Path) -> None:
    """The rehearsal draws its general texts from its own random generator and keeps its reference's embedding of each
    (a text embedded in another batch, padded otherwise, differs in its last bits): the checkpoint carries both, so
    the resumed run rehearses the texts, and the vectors, the uninterrupted run does."""
    general = [f"General sentence {i} about topic {i}" + ", written to be rehearsed" * (i % 4) for i in range(12)]
    settings = {"max_steps": 6, "log_every": 1, "rehearsal_weight": 5.0, "rehearsal_texts": tuple(general),
                "rehearsal_batch_size": 4}  # fmt: skip
    straight = train(tiny_config(tmp_path, tiny_bert_path, "straight", **settings))
    config = tiny_config(tmp_path, tiny_bert_path, "resumed", **settings)
    assert train(config, should_stop=stop_after(3)).steps == 3
    resumed = train(config.replace(resume=True))
    assert [r["rehearsal_loss"] for r in resumed.history] == [r["rehearsal_loss"] for r in straight.history]
    assert_same_weights(weights(resumed.final_dir), weights(straight.final_dir), atol=0)


def test_train_refuses_to_resume_with_settings_that_change_what_the_checkpoint_trained(
    tmp_path: Path, tiny_bert_path: Path
) -> None:
    """The guard is train()'s own, so every caller (the CLI, /adapt, a script) gets it, before any work."""
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=2)
    first = train(config)
    recipe = (first.output_dir / RECIPE_FILE).read_text()
    checkpoint = (first.output_dir / "checkpoint" / STATE_FILE).read_bytes()
    with pytest.raises(ConfigError) as refused:
        train(config.replace(resume=True, max_steps=3, batch_size=6, lr=1e-4))
    assert str(refused.value) == (
        f"cannot resume {first.output_dir}: its checkpoint was trained with other settings (batch_size = 4 → 6; "
        "lr = 0.001 → 0.0001): resume with the recipe that wrote it, or set another output_dir for a new run"
    )
    assert (first.output_dir / RECIPE_FILE).read_text() == recipe
    assert (first.output_dir / "checkpoint" / STATE_FILE).read_bytes() == checkpoint
    assert train(config.replace(resume=True, max_steps=3, eval_every=1)).steps == 3  # how long, how often: allowed


def _snapshot(folder: Path) -> dict[str, bytes]:
    """The bytes of every file a run wrote that a resumed run that trains nothing must leave as they were."""
    return {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name not in (RECIPE_FILE, "result.json")
    }


def test_resuming_a_run_that_stopped_early_trains_nothing_more(
    tmp_path: Path, tiny_bert_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted = iter([0.5, 0.4, 0.3, 0.6])  # steps 0 and 1: no improvement, patience 1 runs out at step 1

    def fake_evaluate(self: CropPairValidation, encoder: Encoder) -> dict[str, float]:
        return {CropPairValidation.metric: next(scripted)}

    monkeypatch.setattr(CropPairValidation, "evaluate", fake_evaluate)
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=10, eval_every=1, early_stopping_patience=1)
    first = train(config)
    assert (first.steps, first.stopped_by, first.already_ended) == (1, "early_stopping", False)
    before = _snapshot(first.output_dir)
    events: list[dict] = []
    again = train(config.replace(resume=True), progress=events.append)
    assert (again.steps, again.stopped_by, again.already_ended) == (1, "early_stopping", True)
    assert (again.best_step, again.best_score, len(again.evaluations)) == (0, 0.5, 2)
    assert events == [] and _snapshot(again.output_dir) == before  # no step, no validation, nothing rewritten
    assert json.loads((again.output_dir / "result.json").read_text())["stopped_by"] == "early_stopping"
    # more patience is a reason to go on: the run continues where it stopped
    longer = train(config.replace(resume=True, early_stopping_patience=2))
    assert (longer.steps, longer.stopped_by, longer.already_ended) == (2, "early_stopping", False)


def test_resuming_a_run_that_reached_max_steps_trains_nothing_more(tmp_path: Path, tiny_bert_path: Path) -> None:
    config = tiny_config(tmp_path, tiny_bert_path, max_steps=2)
    first = train(config)
    before = _snapshot(first.output_dir)
    again = train(config.replace(resume=True))
    assert (again.steps, again.stopped_by, again.already_ended) == (2, "max_steps", True)
    assert _snapshot(again.output_dir) == before
    assert again.history == first.history and again.evaluations == first.evaluations
    shutil.rmtree(first.final_dir)  # removed, or its save cut short: the ended run writes it again
    assert train(config.replace(resume=True)).final_dir.is_dir()
    assert train(config.replace(resume=True, max_steps=3)).steps == 3
