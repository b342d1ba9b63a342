"""The base-student build trains by its steps: a slow or busy machine builds the same student, only later."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from adapt_jobs.settings import AdaptSettings
from adapt_jobs.spec import StudentBuildSpec
from adapt_worker.student_build import build_config
from training.config import load_config


def test_the_build_ignores_the_recipes_time_cap_and_keeps_its_steps(tmp_path: Path) -> None:
    settings = AdaptSettings(dir=tmp_path / "adapt")
    spec = StudentBuildSpec.build(settings, base_model="minilm-l6", recipe="sct-tiny")
    attempt = SimpleNamespace(spec=spec, teacher=tmp_path / "teacher", work=tmp_path / "work",
                              config=SimpleNamespace(settings=settings))  # fmt: skip
    recipe = load_config("sct-tiny")
    assert recipe.time_budget_s is not None  # `embedder train sct-tiny` keeps its cap
    config = build_config(attempt)  # type: ignore[arg-type]
    assert config.time_budget_s is None
    assert config.max_steps == (spec.max_steps or recipe.max_steps) and config.max_steps
    assert config.output_dir == str(tmp_path / "work" / "train")
