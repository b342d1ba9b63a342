"""Resuming a run that was stopped hard (a kill, a second Ctrl-C) after its last checkpoint: what its output folder
holds afterwards is what an uninterrupted run's holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.training.test_trainer import assert_same_weights, tiny_config, weights
from training.trainer import train


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
