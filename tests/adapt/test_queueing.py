"""The queue half decides whether a request is queued; the API answers each refusal with its own error kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapt_jobs.queueing import REFUSAL_CODES, JobRefused, check_base_model, check_name
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from service.adapt.api_state import REFUSALS, refusal
from service.errors import ErrorKind


def test_every_refusal_has_one_error_kind_with_its_code() -> None:
    assert set(REFUSALS) == set(REFUSAL_CODES)
    assert all(kind.code == code for code, kind in REFUSALS.items())
    full = refusal(JobRefused("queue_full", "the adapt queue is full", retry_after_s=60))
    assert full.kind is ErrorKind.overloaded and full.headers == {"Retry-After": "60"}
    with pytest.raises(ValueError, match="unknown refusal code"):
        JobRefused("nope", "?")


def test_names_and_base_models_are_refused_with_their_codes(tmp_path: Path) -> None:
    config = AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache",
                         settings=AdaptSettings(base_models={"inhouse": "/models/inhouse"}))  # fmt: skip
    cases = {"Bad Name!": "invalid_name", "minilm-l6": "reserved_name", "inhouse": "reserved_name",
             "acme--sct-tiny": "reserved_name"}  # fmt: skip
    for name, code in cases.items():
        with pytest.raises(JobRefused) as refused:
            check_name(config, name)
        assert refused.value.code == code, name
    check_name(config, "acme")  # a new name
    check_base_model(config.settings, "inhouse")
    with pytest.raises(JobRefused, match="EMBED_ADAPT_BASE_MODELS") as refused:
        check_base_model(config.settings, "gpt-9")
    assert refused.value.code == "model_not_found"
