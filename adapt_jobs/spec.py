"""What crosses from the API process to the worker: each job's typed spec.

`JobSpec` is one job's full recipe — the request with the defaults of `adapt_jobs.settings.AdaptSettings` filled in —
validated once when the job is queued, stored as JSON with the job, and read back by the worker as the same typed
value (never as a dict read by string keys). Its knobs — each field of `Hyperparameters`, `StudentPlan` and
`StudentBuildSpec` but the job's choice of student — are declared once, in `adapt_jobs.knobs`. Torch-free: the service
imports this module.
"""

from __future__ import annotations

import functools
import importlib.util
import tomllib
from dataclasses import asdict, dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.knobs import (
    ADAPTED_TEACHER,
    JOB_KNOBS,
    STUDENT_BUILD_KNOBS,
    STUDENT_KNOBS,
    knob_problems,
    knob_values,
    spec_fields,
    stored_values,
)
from adapt_jobs.settings import AdaptSettings
from core.registry import RegistryError, validate_name

ADAPT_METHOD = "adapt"  # manifest method.name; /adapt publishes new versions only of models it made
PROMOTE_POLICIES = ("auto", "never")


class SpecError(ValueError):
    """A job spec that cannot run; the message names the field and what to send."""


@functools.cache
def student_recipes() -> tuple[str, ...]:
    """The built-in recipes that build a compact student of a teacher (their ``student`` is set): what the /adapt
    ``student`` field accepts. Read from the recipe files, which are located without importing ``training`` (the
    API side stays free of it and of torch)."""
    found = importlib.util.find_spec("training")
    if found is None or found.origin is None:
        return ()
    recipes = Path(found.origin).parent / "recipes"
    return tuple(sorted(p.stem for p in recipes.glob("*.toml") if tomllib.loads(p.read_text()).get("student")))


def base_student_name(base_model: str, recipe: str) -> str:
    """The registry name of the base student a recipe builds from a base model, built once and kept there
    (``minilm-l6--sct-tiny``): every /adapt job asking for that student starts from it."""
    name = f"{base_model}--{recipe}"
    try:
        return validate_name(name)
    except RegistryError as err:
        raise SpecError(f"base_model {base_model!r} with student {recipe!r}: {err}") from err


def check_student(recipe: str) -> str:
    if recipe not in student_recipes():
        raise SpecError(f"student must be one of {list(student_recipes())}, got {recipe!r}")
    return recipe


@dataclass(frozen=True)
class StudentPlan(make_dataclass("StudentKnobs", [("recipe", str), *spec_fields(STUDENT_KNOBS)], frozen=True)):
    """How an /adapt job turns the model it adapted into a compact student (`adapt_worker.student`): the base student's
    recipe (the job's ``student``; its objective and views are the distillation's, when there is one), then one field
    per knob of `adapt_jobs.knobs.STUDENT_KNOBS` — the distillation's budget (``max_steps``: 0 = none, the crop step
    starts from the base student; ``time_budget_s``), its teacher and texts (``distil_teacher``, ``distil_spans``),
    the general texts it keeps its view of and whose view (``general_texts``, ``general_targets``), and the crop step
    on the student (``adapt_steps``: 0 = distillation only; ``adapt_lr``, ``adapt_time_budget_s``) with its rehearsal
    of the general texts (``rehearsal_weight``, ``rehearsal_temperature``, ``rehearsal_position_weight``)."""

    def __post_init__(self) -> None:
        check_student(self.recipe)
        problems = knob_problems(STUDENT_KNOBS, self)
        if problems:
            raise SpecError("the student's " + "; the student's ".join(problems))
        if self.max_steps is None and self.time_budget_s is None:
            raise SpecError("give the student's max_steps, time_budget_s or both: a distillation needs an end")
        if not self.max_steps and not self.adapt_steps:
            raise SpecError("the student needs distillation steps, crop steps or both: with neither it is the base "
                            "student unchanged")  # fmt: skip

    @classmethod
    def build(cls, settings: AdaptSettings, recipe: str) -> StudentPlan:
        """The plan of a job asking for ``recipe``'s student, with the service's settings."""
        return cls(recipe, **knob_values(STUDENT_KNOBS, settings, {}))

    @property
    def distils(self) -> bool:
        return bool(self.max_steps)

    @property
    def rehearses(self) -> bool:
        """Whether the crop step rehearses general texts (it runs, with a weight and texts to rehearse)."""
        return bool(self.adapt_steps) and self.rehearsal_weight > 0 and self.general_texts > 0

    @property
    def uses_adapted_teacher(self) -> bool:
        """Whether the student learns from the adapted teacher (a distillation of its embeddings, of the customer's
        texts or the general ones, or its view of the general texts rehearsed): when not, the job does not adapt the
        teacher."""
        if self.distils and ADAPTED_TEACHER in (self.distil_teacher, self.general_targets):
            return True
        return self.rehearses and self.general_targets == ADAPTED_TEACHER


_BUILD_FIELDS = [("base_model", str), ("recipe", str), ("name", str), *spec_fields(STUDENT_BUILD_KNOBS)]
_BUILD_FIELDS.append(("seed", int, field(default=0)))


@dataclass(frozen=True)
class StudentBuildSpec(make_dataclass("StudentBuildKnobs", _BUILD_FIELDS, frozen=True)):
    """A one-time job: train a recipe's student of ``base_model`` and publish it as ``name`` (a servable model
    whose bundle keeps the torch checkpoint every student /adapt job starts from); ``max_steps``, ``max_documents``
    (`adapt_jobs.knobs.STUDENT_BUILD_KNOBS`; None: the recipe's own) and ``seed``."""

    def __post_init__(self) -> None:
        check_student(self.recipe)
        problems = knob_problems(STUDENT_BUILD_KNOBS, self)
        if problems:
            raise SpecError("the student build's " + "; the student build's ".join(problems))

    @classmethod
    def build(cls, settings: AdaptSettings, *, base_model: str, recipe: str) -> StudentBuildSpec:
        name = base_student_name(base_model, recipe)
        return cls(base_model, recipe, name, **knob_values(STUDENT_BUILD_KNOBS, settings, {}))

    def to_params(self) -> dict[str, Any]:
        return {"base_model": self.base_model, "name": self.name, "hyperparameters": asdict(self)}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> StudentBuildSpec:
        try:
            return cls(**params["hyperparameters"])
        except (KeyError, TypeError) as err:
            raise SpecError(f"stored student-build spec is incomplete or malformed: {err}") from err


@dataclass(frozen=True)
class Hyperparameters(make_dataclass("JobKnobs", spec_fields(JOB_KNOBS), frozen=True)):
    """How the job trains and is gated (the cropping paper's in-domain recipe, ``papers/000`` §2): one field per knob
    of `adapt_jobs.knobs.JOB_KNOBS` — ``objective``, ``max_steps``, ``time_budget_s``, ``train_last_layers`` (None =
    every layer), ``anchor_weight`` (of the MSE anchor to the base model's embeddings), ``batch_size``, ``lr``,
    ``max_seq_length`` (training crops only; the published bundle keeps the base model's limit), ``seed``,
    ``gate_margin`` (points each general task, and kNN, may drop) and ``general_tasks``."""

    def __post_init__(self) -> None:
        problems = knob_problems(JOB_KNOBS, self)
        if problems:
            raise SpecError("; ".join(problems))
        if self.time_budget_s is None:
            raise SpecError("time_budget_s must be set: every job has a time cap (max_steps alone could run for days)")


@dataclass(frozen=True)
class JobSpec:
    """One job's recipe: what to adapt, to which name, and how."""

    base_model: str
    name: str
    hyperparameters: Hyperparameters
    promote: str = "auto"
    has_labels: bool = False
    usable_documents_estimate: int = 0
    student: StudentPlan | None = None

    def __post_init__(self) -> None:
        if self.promote not in PROMOTE_POLICIES:
            raise SpecError(f"promote must be one of {PROMOTE_POLICIES}, got {self.promote!r}")

    @classmethod
    def build(
        cls,
        settings: AdaptSettings,
        *,
        base_model: str,
        name: str,
        promote: str = "auto",
        has_labels: bool = False,
        usable: int = 0,
        student: str | None = None,
        **knobs: Any,
    ) -> JobSpec:
        """A request's fields with the service's defaults filled in, so the job records exactly what it ran:
        ``knobs`` are the request's values of `adapt_jobs.knobs.JOB_KNOBS` (None or absent: the service's)."""
        try:
            hyperparameters = Hyperparameters(**knob_values(JOB_KNOBS, settings, knobs))
        except TypeError as err:  # a name that is no knob
            raise SpecError(str(err)) from err
        plan = StudentPlan.build(settings, student) if student is not None else None
        return cls(base_model, name, hyperparameters, promote, has_labels, usable, plan)

    def to_params(self) -> dict[str, Any]:
        """The JSON stored with the job (and shown by ``GET /adapt/{id}``)."""
        return {
            "base_model": self.base_model,
            "name": self.name,
            "promote": self.promote,
            "hyperparameters": _json(asdict(self.hyperparameters)),
            "corpus": {"has_labels": self.has_labels, "usable_documents_estimate": self.usable_documents_estimate},
            "student": asdict(self.student) if self.student is not None else None,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> JobSpec:
        """Read a stored job's spec back, validated; a job stored by an older service gets, for each knob it lacks,
        what such jobs ran with (`adapt_jobs.knobs.Knob.absent`: the declared default unless told otherwise — never
        this process's environment)."""
        try:
            hp = stored_values(JOB_KNOBS, params["hyperparameters"])
            corpus = params.get("corpus", {})
            student = params.get("student")
            if student and "general_documents" in student:  # stored before the general texts became the student's own
                student = {**student, "general_texts": student["general_documents"], "general_targets": ADAPTED_TEACHER}
                del student["general_documents"]
            return cls(
                base_model=params["base_model"],
                name=params["name"],
                hyperparameters=Hyperparameters(**hp),
                promote=params.get("promote", "auto"),
                has_labels=bool(corpus.get("has_labels", False)),
                usable_documents_estimate=int(corpus.get("usable_documents_estimate", 0)),
                student=StudentPlan(**stored_values(STUDENT_KNOBS, student)) if student else None,
            )
        except (KeyError, TypeError) as err:
            raise SpecError(f"stored job spec is incomplete or malformed: {err}") from err


def _json(values: dict[str, Any]) -> dict[str, Any]:
    """A spec's values as stored: tuples as JSON lists."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
