"""The job spec crosses from the API process to the worker as JSON: built once, validated, read back typed."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from adapt_jobs.settings import AdaptSettings
from adapt_jobs.spec import Hyperparameters, JobSpec, SpecError


def _settings() -> AdaptSettings:
    return AdaptSettings(gate_margin=1.5)


def _hp(**changes: object) -> Hyperparameters:
    return replace(JobSpec.build(_settings(), base_model="b", name="n").hyperparameters, **changes)


def test_build_fills_the_settings_defaults_and_round_trips() -> None:
    spec = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", seed=3, has_labels=True, usable=70)
    hp = spec.hyperparameters
    assert (hp.max_steps, hp.time_budget_s, hp.train_last_layers, hp.gate_margin, hp.seed) == (60, 180.0, 2, 1.5, 3)
    params = spec.to_params()
    assert params["corpus"] == {"has_labels": True, "usable_documents_estimate": 70}
    assert JobSpec.from_params(params) == spec
    everything = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", train_last_layers=0)
    assert everything.hyperparameters.train_last_layers is None  # 0 = every layer
    assert hp.anchor_weight == AdaptSettings().anchor_weight  # the settings' default, recorded in the job
    unanchored = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", anchor_weight=0.0)
    assert unanchored.hyperparameters.anchor_weight == 0.0  # a request's 0 is kept, not replaced by the default


def test_bad_specs_say_what_to_fix() -> None:
    with pytest.raises(SpecError, match="objective must be one of"):
        _hp(objective="triplet")
    with pytest.raises(SpecError, match="anchor_weight must be >= 0"):
        _hp(anchor_weight=-1.0)
    with pytest.raises(SpecError, match="every job has a time cap"):
        _hp(max_steps=None, time_budget_s=None)
    with pytest.raises(SpecError, match="every job has a time cap"):
        _hp(max_steps=20_000, time_budget_s=None)
    with pytest.raises(SpecError, match="promote must be one of"):
        JobSpec("minilm-l6", "acme", _hp(), promote="always")
    with pytest.raises(SpecError, match="stored job spec is incomplete"):
        JobSpec.from_params({"name": "acme"})


def test_a_stored_spec_missing_fields_gets_the_declared_defaults_not_this_environment(monkeypatch) -> None:
    monkeypatch.setenv("EMBED_ADAPT_ANCHOR_WEIGHT", "9")  # this process's setting: not what an old job ran with
    params = JobSpec.build(AdaptSettings.model_construct(), base_model="b", name="n").to_params()
    del params["hyperparameters"]["anchor_weight"]  # a job stored before the field existed
    spec = JobSpec.from_params(params)
    assert spec.hyperparameters.anchor_weight == AdaptSettings.model_fields["anchor_weight"].default
    assert asdict(spec.hyperparameters).keys() == {f for f in asdict(_hp())}


def test_a_student_job_stored_before_general_targets_reads_back_as_it_ran() -> None:
    spec = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", student="sct-tiny")
    params = spec.to_params()
    assert params["student"]["general_texts"] == AdaptSettings().student_general_texts
    assert params["student"]["general_targets"] == AdaptSettings().student_general_targets
    old = {k: v for k, v in params["student"].items() if k not in ("general_texts", "general_targets")}
    params["student"] = {**old, "general_documents": 2000}  # as an older service stored it
    student = JobSpec.from_params(params).student
    assert student is not None and (student.general_texts, student.general_targets) == (2000, "adapted_teacher")
    with pytest.raises(SpecError, match="general_targets must be one of"):
        replace(student, general_targets="the crowd")


def test_a_student_job_stored_before_the_rehearsal_reads_back_without_one() -> None:
    spec = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", student="sct-tiny")
    params = spec.to_params()
    assert params["student"]["rehearsal_weight"] == AdaptSettings().student_rehearsal_weight > 0
    assert params["student"]["max_steps"] == AdaptSettings().student_max_steps
    params["student"] = {k: v for k, v in params["student"].items() if k != "rehearsal_weight"}
    student = JobSpec.from_params(params).student
    assert student is not None and student.rehearsal_weight == 0.0  # what that job ran
    params["student"] = {k: v for k, v in params["student"].items() if k != "rehearsal_temperature"}
    older = JobSpec.from_params(params).student
    assert older is not None and older.rehearsal_temperature == 0.05  # what jobs ran before it was a setting
    params["student"] = {k: v for k, v in params["student"].items() if k != "rehearsal_position_weight"}
    oldest = JobSpec.from_params(params).student
    assert oldest is not None and oldest.rehearsal_position_weight == 0.0  # what jobs ran before the position term
    with pytest.raises(SpecError, match="distillation steps, crop steps or both"):
        replace(student, max_steps=0, adapt_steps=0)
    with pytest.raises(SpecError, match="rehearsal_weight must be >= 0"):
        replace(student, rehearsal_weight=-1.0)
    with pytest.raises(SpecError, match="rehearsal_temperature must be > 0"):
        replace(student, rehearsal_temperature=0.0)
    with pytest.raises(SpecError, match="rehearsal_position_weight must be >= 0"):
        replace(student, rehearsal_position_weight=-1.0)


def test_a_student_job_stored_before_the_base_teachers_distillation_reads_back_as_it_ran() -> None:
    spec = JobSpec.build(_settings(), base_model="minilm-l6", name="acme", student="sct-tiny")
    params = spec.to_params()
    assert params["student"]["distil_teacher"] == "base_teacher" and params["student"]["distil_spans"] > 0
    old = {k: v for k, v in params["student"].items() if k not in ("distil_teacher", "distil_spans")}
    params["student"] = {**old, "max_steps": 40}  # an older job that asked for a distillation
    student = JobSpec.from_params(params).student
    assert student is not None and (student.distil_teacher, student.distil_spans) == ("adapted_teacher", 0)
    assert student.uses_adapted_teacher  # it distilled the adapted teacher, as such jobs did
    with pytest.raises(SpecError, match="distil_teacher must be one of"):
        replace(student, distil_teacher="base_student")
    with pytest.raises(SpecError, match="distil_spans must be >= 0"):
        replace(student, distil_spans=-1)


def test_the_job_adapts_the_teacher_only_when_its_student_learns_from_it() -> None:
    plan = JobSpec.build(AdaptSettings(), base_model="minilm-l6", name="x", student="sct-tiny").student
    assert plan is not None and plan.distils and not plan.adapt_steps  # the base teacher distilled, no crop step
    assert (plan.distil_teacher, plan.general_targets) == ("base_teacher", "base_teacher")
    assert not plan.uses_adapted_teacher
    assert replace(plan, distil_teacher="adapted_teacher").uses_adapted_teacher  # its embeddings distilled
    assert replace(plan, general_targets="adapted_teacher").uses_adapted_teacher  # its view of the general texts
    crops = replace(plan, max_steps=0, adapt_steps=120, general_targets="adapted_teacher")
    assert crops.uses_adapted_teacher  # its view rehearsed in the crop step
    assert not replace(crops, rehearsal_weight=0.0).uses_adapted_teacher
    assert not replace(crops, general_targets="base_student").uses_adapted_teacher
