"""Each per-job knob is declared once (`adapt_jobs.knobs`), and the service's default, the request's override, the
job's spec and the training config it feeds all say the same about it."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from adapt_jobs.knobs import JOB_KNOBS, KNOBS, STUDENT_BUILD_KNOBS, STUDENT_KNOBS, Knob
from adapt_jobs.settings import AdaptSettings
from adapt_jobs.spec import Hyperparameters, JobSpec, SpecError, StudentBuildSpec, StudentPlan
from service.adapt.schemas import AdaptRequest
from service.settings import ServiceSettings

SETTINGS = AdaptSettings.model_json_schema()["properties"]
REQUEST = AdaptRequest.model_json_schema()["properties"]
BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum"}


def _schema_bounds(schema: dict) -> dict[str, float]:
    if "anyOf" in schema:  # an optional field: the bounds are on its non-null branch
        schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
    return {ours: schema[theirs] for ours, theirs in BOUNDS.items() if theirs in schema}


def test_every_knob_is_declared_once_and_each_setting_named_once() -> None:
    for group in (JOB_KNOBS, STUDENT_KNOBS, STUDENT_BUILD_KNOBS):
        names = [k.name for k in group]
        assert len(names) == len(set(names)), names
    settings = [k.setting for k in KNOBS if k.setting is not None]
    assert len(settings) == len(set(settings)), settings
    assert all(k.setting is not None or k.request is not None for k in KNOBS), "a knob nobody can set"


@pytest.mark.parametrize("knob", [k for k in KNOBS if k.setting is not None], ids=lambda k: k.setting)
def test_each_setting_is_its_knobs_default_bounds_and_description(knob: Knob) -> None:
    assert knob.setting is not None
    field = AdaptSettings.model_fields[knob.setting]
    default = field.get_default(call_default_factory=True)
    assert (tuple(default) if isinstance(default, list) else default) == knob.default
    assert field.description == knob.help
    assert _schema_bounds(SETTINGS[knob.setting]) == knob.bounds()
    assert f"adapt_{knob.setting}" in ServiceSettings.flat_fields()  # the flag, the chart key, the env variable


@pytest.mark.parametrize("knob", [k for k in JOB_KNOBS if k.request is not None], ids=lambda k: k.name)
def test_each_request_override_has_its_knobs_bounds(knob: Knob) -> None:
    assert knob.request is not None
    schema = REQUEST[knob.name]
    assert schema.get("description") == knob.request.description
    assert schema.get("default") == (None if knob.setting is not None else knob.default)
    assert _schema_bounds(schema) == knob.bounds()
    body = {"base_model": "minilm-l6", "name": "acme"}
    for bound, value in knob.bounds().items():
        outside = value - 1 if bound == "ge" else value
        with pytest.raises(ValidationError):
            AdaptRequest(**body, **{knob.name: outside})
    if knob.request.le is not None:
        AdaptRequest(**body, **{knob.name: knob.request.le})
        with pytest.raises(ValidationError):
            AdaptRequest(**body, **{knob.name: knob.request.le + 1})


def test_the_specs_fields_are_the_knobs() -> None:
    assert [f.name for f in fields(Hyperparameters)] == [k.name for k in JOB_KNOBS]
    assert [f.name for f in fields(StudentPlan)] == ["recipe", *(k.name for k in STUDENT_KNOBS)]
    assert [f.name for f in fields(StudentBuildSpec)] == [
        "base_model", "recipe", "name", *(k.name for k in STUDENT_BUILD_KNOBS), "seed",
    ]  # fmt: skip


def test_a_spec_takes_each_knob_from_the_request_or_the_settings() -> None:
    settings = AdaptSettings(
        max_steps=7, time_budget_s=11.0, train_last_layers=0, anchor_weight=0.5, batch_size=5, lr=3e-5,
        max_seq_length=40, gate_margin=1.0, general_tasks="LeeDocSTS,PyDocModuleClustering",
        student_adapt_steps=9, student_rehearsal_temperature=0.1, student_build_max_steps=5,
    )  # fmt: skip
    spec = JobSpec.build(settings, base_model="minilm-l6", name="acme", student="sct-tiny")
    hp = spec.hyperparameters
    assert (hp.max_steps, hp.time_budget_s, hp.anchor_weight, hp.batch_size, hp.lr) == (7, 11.0, 0.5, 5, 3e-5)
    assert hp.train_last_layers is None  # 0 = every layer
    assert hp.general_tasks == ("LeeDocSTS", "PyDocModuleClustering")  # a comma-separated setting
    assert (hp.objective, hp.seed) == ("crop-infonce", 0)  # knobs only a request sets: their declared defaults
    assert spec.student is not None and (spec.student.adapt_steps, spec.student.rehearsal_temperature) == (9, 0.1)
    build = StudentBuildSpec.build(settings, base_model="minilm-l6", recipe="sct-tiny")
    assert (build.max_steps, build.max_documents) == (5, None)  # 0: the recipe's own
    request = AdaptRequest(base_model="minilm-l6", name="acme", max_steps=3, anchor_weight=0.0, seed=4, objective="sct")
    asked = JobSpec.build(settings, **request.job_fields()).hyperparameters
    assert (asked.max_steps, asked.anchor_weight, asked.seed, asked.objective) == (3, 0.0, 4, "sct")
    assert asked.time_budget_s == 6 * 3600  # the request gave the job's end: the time cap is the most it may ask
    assert asked.batch_size == 5  # not asked: the service's
    with pytest.raises(SpecError, match="no knobs named"):
        JobSpec.build(settings, base_model="minilm-l6", name="acme", anchor=1.0)


def test_a_job_stored_before_this_declaration_reads_back_as_it_ran() -> None:
    stored = {
        "base_model": "minilm-l6", "name": "acme", "promote": "auto",
        "hyperparameters": {
            "objective": "crop-infonce", "max_steps": 60, "time_budget_s": 180.0, "train_last_layers": 2,
            "anchor_weight": 3.0, "batch_size": 32, "lr": 2e-05, "max_seq_length": 64, "seed": 0, "gate_margin": 2.0,
            "general_tasks": ["PyDocSummaryRetrieval", "PyDocModuleClustering", "LeeDocSTS"],
        },
        "corpus": {"has_labels": False, "usable_documents_estimate": 0},
        "student": {
            "recipe": "sct-tiny", "max_steps": 0, "time_budget_s": 120.0, "general_texts": 4000,
            "general_targets": "base_student", "adapt_steps": 120, "adapt_lr": 0.0002, "adapt_time_budget_s": 360.0,
            "rehearsal_weight": 1.0, "rehearsal_temperature": 0.2, "rehearsal_position_weight": 10.0,
        },
    }  # fmt: skip
    spec = JobSpec.from_params(stored)
    # what a distillation ran with then
    ran = {"distil_teacher": "adapted_teacher", "distil_spans": 0, "distil_pull": 0.0, "distil_lr": 0.0}
    assert spec.to_params() == {**stored, "student": {**stored["student"], **ran}}
    today = JobSpec.build(AdaptSettings.model_construct(), base_model="minilm-l6", name="acme", student="sct-tiny")
    assert spec.hyperparameters == today.hyperparameters
    old_defaults = {k: stored["student"][k] for k in ("max_steps", "time_budget_s", "general_targets", "adapt_steps")}
    assert spec.student == replace(today.student, **old_defaults, **ran)


def test_each_knob_that_feeds_training_sets_its_train_config_field(tmp_path: Path) -> None:
    from adapt_worker.stages import crop_train_config

    settings = AdaptSettings(max_steps=7, time_budget_s=11.0, train_last_layers=3, anchor_weight=0.5, batch_size=5,
                             lr=3e-5, max_seq_length=40)  # fmt: skip
    spec = JobSpec.build(settings, base_model="minilm-l6", name="acme", seed=9)
    config = crop_train_config(spec, tmp_path / "model", ["a document."] * 10, tmp_path / "out", threads=1)
    fed = [k for k in JOB_KNOBS if k.train_field is not None]
    assert {k.name for k in fed} >= {"max_steps", "time_budget_s", "anchor_weight", "batch_size", "lr", "seed"}
    for knob in fed:
        assert getattr(config, knob.train_field) == getattr(spec.hyperparameters, knob.name), knob.name


def test_every_job_keeps_a_time_cap(tmp_path: Path) -> None:
    """Joint knobs: a request giving max_steps alone ends on its steps, not the default time budget, yet its time is
    capped at the most a request may ask; giving time_budget_s alone, no step count stops it first."""
    from adapt_worker.stages import crop_train_config

    (time_knob,) = [k for k in JOB_KNOBS if k.name == "time_budget_s"]
    cap = time_knob.request.le
    assert cap == 6 * 3600
    settings = AdaptSettings(max_steps=7, time_budget_s=11.0)
    steps = JobSpec.build(settings, **AdaptRequest(base_model="minilm-l6", name="acme", max_steps=20_000).job_fields())
    assert (steps.hyperparameters.max_steps, steps.hyperparameters.time_budget_s) == (20_000, cap)
    config = crop_train_config(steps, tmp_path / "model", ["a document."] * 10, tmp_path / "out", threads=1)
    assert (config.max_steps, config.time_budget_s) == (20_000, cap)
    timed = JobSpec.build(settings, base_model="minilm-l6", name="acme", time_budget_s=30.0).hyperparameters
    assert (timed.max_steps, timed.time_budget_s) == (None, 30.0)
    with pytest.raises(SpecError, match="every job has a time cap"):
        replace(steps.hyperparameters, time_budget_s=None)
    stored = steps.to_params()  # a job queued when max_steps alone left it without a time cap
    stored["hyperparameters"]["time_budget_s"] = None
    assert JobSpec.from_params(stored).hyperparameters.time_budget_s == cap
