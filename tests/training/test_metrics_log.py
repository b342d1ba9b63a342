"""metrics.jsonl: step 1, every ``log_every``-th step and the step a session ends on, each step's line before its
validation's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.training.test_trainer import stop_after, tiny_config
from training.trainer import train


def _logged(folder: Path) -> list[tuple[str, int]]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [(record["kind"], record["step"]) for record in map(json.loads, lines)]


def test_the_last_step_is_logged_even_off_the_log_every_grid(tmp_path: Path, tiny_bert_path: Path) -> None:
    result = train(tiny_config(tmp_path, tiny_bert_path, max_steps=5, log_every=2, eval_every=5))
    assert [record["step"] for record in result.history] == [1, 2, 4, 5]
    assert _logged(result.output_dir) == [
        ("eval", 0), ("train", 1), ("train", 2), ("train", 4), ("train", 5), ("eval", 5)
    ]  # fmt: skip
    assert result.history[-1]["loss"] > 0


def test_a_cancelled_session_logs_its_last_step_and_the_resumed_run_keeps_that_line(
    tmp_path: Path, tiny_bert_path: Path
) -> None:
    settings = {"max_steps": 6, "log_every": 4}
    straight = train(tiny_config(tmp_path, tiny_bert_path, "straight", **settings))
    config = tiny_config(tmp_path, tiny_bert_path, "resumed", **settings)
    first = train(config, should_stop=stop_after(3))
    assert [record["step"] for record in first.history] == [1, 3]
    assert [step for kind, step in _logged(first.output_dir) if kind == "train"] == [1, 3]
    resumed = train(config.replace(resume=True))
    assert _logged(straight.output_dir) == [("train", 1), ("train", 4), ("train", 6), ("eval", 6)]
    # the session's end, step 3, stays in the log with its validation; the rest is the uninterrupted run's
    assert _logged(resumed.output_dir) == [
        ("train", 1), ("train", 3), ("eval", 3), ("train", 4), ("train", 6), ("eval", 6)
    ]  # fmt: skip
    losses = {record["step"]: record["loss"] for record in resumed.history}
    assert [losses[record["step"]] for record in straight.history] == [record["loss"] for record in straight.history]
