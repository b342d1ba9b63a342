"""The evaluation cache keeps the general scores of the models later jobs score again (a job's base model), not those
of the model each job trains: scored once, they would pile up, one folder per job, for the life of the cache."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapt_worker import release
from adapt_worker.attempt import Baseline, Exported, Trained
from tests.evaluation.conftest import FakeModel


def _embed(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255 for b in digest[:8]]


def _attempt(cache: Path) -> SimpleNamespace:
    ctx = SimpleNamespace(set_state=lambda state: None, check=lambda: None, stage=lambda *a, **k: None)
    config = SimpleNamespace(cache_dir=cache, settings=SimpleNamespace(general_fast=True))
    spec = SimpleNamespace(hyperparameters=SimpleNamespace(general_tasks=["LeeDocSTS"]))
    return SimpleNamespace(ctx=ctx, config=config, spec=spec, checks=None, labelled=None)


def test_only_the_base_models_general_scores_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = tmp_path / "base"
    trained = Trained(checkpoint=tmp_path / "best", source="base", trained_on=(), role="adapted",
                      baselines=(Baseline("base", base),), compared_with=("base",))  # fmt: skip
    monkeypatch.setattr(release.Encoder, "from_pretrained", lambda path: path)
    monkeypatch.setattr(release, "TorchModel", lambda path: FakeModel(f"torch {path}", _embed, 8))
    cache = tmp_path / "cache"
    for job in range(3):
        monkeypatch.setattr(release, "load_model", lambda *a, job=job, **k: FakeModel(f"adapted {job}", _embed, 8))
        evaluation = release.evaluate(_attempt(cache), trained, Exported(tmp_path / f"bundle-{job}"))  # type: ignore[arg-type]
        assert set(evaluation.general_tasks) == {"base", "adapted"}
    cached = list((cache / "evaluation").iterdir())
    assert [p.name for p in cached] == [FakeModel(f"torch {base}", _embed, 8).hash[:24]]
