"""The job spec crosses from the API process to the worker as JSON: built once, validated, read back typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapt.spec import AdaptConfig, Hyperparameters, JobSpec, SpecError


def _config(tmp_path: Path) -> AdaptConfig:
    return AdaptConfig(registry_dir=tmp_path / "reg", data_dir=tmp_path / "jobs", gate_margin=1.5)


def test_build_fills_the_service_defaults_and_round_trips(tmp_path: Path) -> None:
    spec = JobSpec.build(_config(tmp_path), base_model="minilm-l6", name="acme", seed=3, has_labels=True, usable=70)
    hp = spec.hyperparameters
    assert (hp.max_steps, hp.time_budget_s, hp.train_last_layers, hp.gate_margin, hp.seed) == (60, 180.0, 2, 1.5, 3)
    params = spec.to_params()
    assert params["corpus"] == {"has_labels": True, "usable_documents_estimate": 70}
    assert JobSpec.from_params(params) == spec
    everything = JobSpec.build(_config(tmp_path), base_model="minilm-l6", name="acme", train_last_layers=0)
    assert everything.hyperparameters.train_last_layers is None  # 0 = every layer
    assert hp.anchor_weight == AdaptConfig.default_anchor_weight  # the service's default, recorded in the job
    unanchored = JobSpec.build(_config(tmp_path), base_model="minilm-l6", name="acme", anchor_weight=0.0)
    assert unanchored.hyperparameters.anchor_weight == 0.0  # a request's 0 is kept, not replaced by the default


def test_bad_specs_say_what_to_fix() -> None:
    with pytest.raises(SpecError, match="objective must be one of"):
        Hyperparameters(objective="triplet")
    with pytest.raises(SpecError, match="anchor_weight must be >= 0"):
        Hyperparameters(anchor_weight=-1.0)
    with pytest.raises(SpecError, match="a job needs an end"):
        Hyperparameters(max_steps=None, time_budget_s=None)
    with pytest.raises(SpecError, match="promote must be one of"):
        JobSpec("minilm-l6", "acme", Hyperparameters(), promote="always")
    with pytest.raises(SpecError, match="stored job spec is incomplete"):
        JobSpec.from_params({"name": "acme"})
