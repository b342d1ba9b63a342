"""What crosses from the API process to the worker: each job's typed spec.

`JobSpec` is one job's full recipe — the request with the defaults of `adapt_jobs.settings.AdaptSettings` filled in —
validated once when the job is queued, stored as JSON with the job, and read back by the worker as the same typed
value (never as a dict read by string keys). Torch-free: the service imports this module.
"""

from __future__ import annotations

import functools
import importlib.util
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from adapt_jobs.settings import AdaptSettings
from core.registry import RegistryError, validate_name

ADAPT_METHOD = "adapt"  # manifest method.name; /adapt publishes new versions only of models it made
# /adapt objective → (training objective, views): SimCSE is InfoNCE on dropout views (paper 000 §2).
OBJECTIVES = {"crop-infonce": ("infonce", "crop"), "sct": ("sct", "crop"), "simcse": ("simcse", "dropout")}
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


# The models of a student job (also its evaluation roles); the first three can give the general texts' targets
# (AdaptSettings.student_general_targets).
BASE_STUDENT, BASE_TEACHER, ADAPTED_TEACHER = "base_student", "base_teacher", "adapted_teacher"
GENERAL_TARGETS = (BASE_STUDENT, BASE_TEACHER, ADAPTED_TEACHER)


def check_student(recipe: str) -> str:
    if recipe not in student_recipes():
        raise SpecError(f"student must be one of {list(student_recipes())}, got {recipe!r}")
    return recipe


@dataclass(frozen=True)
class StudentPlan:
    """How an /adapt job turns the model it adapted into a compact student (`adapt_worker.student`): the base student's
    recipe (its objective and views are the distillation's, when there is one), the distillation's budget, and the
    crop step on the student with its rehearsal of general texts."""

    recipe: str
    max_steps: int | None  # distillation steps (0: none, the crop step starts from the base student)
    time_budget_s: float | None
    general_texts: int  # general texts (of the base student's own, a seeded sample) distilled and rehearsed
    general_targets: str  # whose view of them the student keeps: base_student, base_teacher or adapted_teacher
    adapt_steps: int  # the job's crop recipe on the student itself (0: distillation only)
    adapt_lr: float
    adapt_time_budget_s: float
    rehearsal_weight: float = 0.0  # of the similarity rehearsal in the crop step (stored before it existed: none)
    rehearsal_temperature: float = 0.05  # of its similarity distributions (stored before it was a setting: 0.05)
    rehearsal_position_weight: float = 0.0  # of its position term (stored before it existed: none)

    def __post_init__(self) -> None:
        check_student(self.recipe)
        if self.general_targets not in GENERAL_TARGETS:
            raise SpecError(f"general_targets must be one of {list(GENERAL_TARGETS)}, got {self.general_targets!r}")
        if self.max_steps is None and self.time_budget_s is None:
            raise SpecError("give the student's max_steps, time_budget_s or both: a distillation needs an end")
        if not self.max_steps and not self.adapt_steps:
            raise SpecError("the student needs distillation steps, crop steps or both: with neither it is the base "
                            "student unchanged")  # fmt: skip
        if self.rehearsal_weight < 0:
            raise SpecError(f"the student's rehearsal_weight must be >= 0, got {self.rehearsal_weight}")
        if self.rehearsal_temperature <= 0:
            raise SpecError(f"the student's rehearsal_temperature must be > 0, got {self.rehearsal_temperature}")
        if self.rehearsal_position_weight < 0:
            raise SpecError(
                f"the student's rehearsal_position_weight must be >= 0, got {self.rehearsal_position_weight}"
            )

    @property
    def distils(self) -> bool:
        return bool(self.max_steps)

    @property
    def rehearses(self) -> bool:
        """Whether the crop step rehearses general texts (it runs, with a weight and texts to rehearse)."""
        return bool(self.adapt_steps) and self.rehearsal_weight > 0 and self.general_texts > 0

    @property
    def uses_adapted_teacher(self) -> bool:
        """Whether the student learns from the adapted teacher (a distillation, or the adapted teacher's view of the
        general texts rehearsed): when not, the job does not adapt the teacher."""
        return self.distils or (self.rehearses and self.general_targets == ADAPTED_TEACHER)


@dataclass(frozen=True)
class StudentBuildSpec:
    """A one-time job: train a recipe's student of ``base_model`` and publish it as ``name`` (a servable model
    whose bundle keeps the torch checkpoint every student /adapt job starts from)."""

    base_model: str
    recipe: str
    name: str
    max_steps: int | None = None  # None: the recipe's own
    max_documents: int | None = None  # None: the recipe's own
    seed: int = 0

    def __post_init__(self) -> None:
        check_student(self.recipe)

    @classmethod
    def build(cls, settings: AdaptSettings, *, base_model: str, recipe: str) -> StudentBuildSpec:
        return cls(
            base_model, recipe, base_student_name(base_model, recipe),
            settings.student_build_max_steps or None, settings.student_build_max_documents or None,
        )  # fmt: skip

    def to_params(self) -> dict[str, Any]:
        return {"base_model": self.base_model, "name": self.name, "hyperparameters": asdict(self)}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> StudentBuildSpec:
        try:
            return cls(**params["hyperparameters"])
        except (KeyError, TypeError) as err:
            raise SpecError(f"stored student-build spec is incomplete or malformed: {err}") from err


@dataclass(frozen=True)
class Hyperparameters:
    """How the job trains and is gated (the cropping paper's in-domain recipe, ``papers/000`` §2)."""

    objective: str
    max_steps: int | None
    time_budget_s: float | None
    train_last_layers: int | None  # None = every layer
    anchor_weight: float  # MSE anchor to the base model's embeddings (training.config.TrainConfig)
    batch_size: int
    lr: float
    max_seq_length: int  # training crops only; the published bundle keeps the base model's limit
    seed: int
    gate_margin: float  # points each general task (and kNN) may drop
    general_tasks: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise SpecError(f"objective must be one of {sorted(OBJECTIVES)}, got {self.objective!r}")
        if self.max_steps is None and self.time_budget_s is None:
            raise SpecError("give max_steps, time_budget_s or both: a job needs an end")
        if self.batch_size < 2:
            raise SpecError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if self.anchor_weight < 0:
            raise SpecError(f"anchor_weight must be >= 0 (0 = no anchor), got {self.anchor_weight}")


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
        objective: str = "crop-infonce",
        max_steps: int | None = None,
        time_budget_s: float | None = None,
        train_last_layers: int | None = None,
        anchor_weight: float | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        promote: str = "auto",
        has_labels: bool = False,
        usable: int = 0,
        student: str | None = None,
    ) -> JobSpec:
        """A request's fields with the service's defaults filled in, so the job records exactly what it ran."""
        if max_steps is None and time_budget_s is None:
            max_steps, time_budget_s = settings.max_steps, settings.time_budget_s
        train_last = settings.train_last_layers if train_last_layers is None else train_last_layers
        hyperparameters = Hyperparameters(
            objective=objective,
            max_steps=max_steps,
            time_budget_s=time_budget_s,
            train_last_layers=train_last or None,
            anchor_weight=settings.anchor_weight if anchor_weight is None else anchor_weight,
            batch_size=batch_size or settings.batch_size,
            lr=settings.lr,
            max_seq_length=settings.max_seq_length,
            seed=seed,
            gate_margin=settings.gate_margin,
            general_tasks=tuple(settings.general_tasks),
        )
        plan = None
        if student is not None:
            plan = StudentPlan(
                student, settings.student_max_steps, settings.student_time_budget_s,
                settings.student_general_texts, settings.student_general_targets, settings.student_adapt_steps,
                settings.student_adapt_lr, settings.student_adapt_time_budget_s, settings.student_rehearsal_weight,
                settings.student_rehearsal_temperature, settings.student_rehearsal_position_weight,
            )  # fmt: skip
        return cls(base_model, name, hyperparameters, promote, has_labels, usable, plan)

    def to_params(self) -> dict[str, Any]:
        """The JSON stored with the job (and shown by ``GET /adapt/{id}``)."""
        return {
            "base_model": self.base_model,
            "name": self.name,
            "promote": self.promote,
            "hyperparameters": asdict(self.hyperparameters)
            | {"general_tasks": list(self.hyperparameters.general_tasks)},
            "corpus": {"has_labels": self.has_labels, "usable_documents_estimate": self.usable_documents_estimate},
            "student": asdict(self.student) if self.student is not None else None,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> JobSpec:
        """Read a stored job's spec back, validated; a job stored by an older service gets the settings' defaults
        (`AdaptSettings`'s, not this process's environment) for fields it lacks."""
        try:
            hp = {**_default_hyperparameters(), **params["hyperparameters"]}
            hp["general_tasks"] = tuple(hp["general_tasks"])
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
                student=StudentPlan(**student) if student else None,
            )
        except (KeyError, TypeError) as err:
            raise SpecError(f"stored job spec is incomplete or malformed: {err}") from err


def _default_hyperparameters() -> dict[str, Any]:
    """Every `Hyperparameters` field at the defaults of `AdaptSettings` (the one place a default is written)."""
    settings = AdaptSettings.model_construct()  # the declared defaults, without reading the environment
    built = JobSpec.build(settings, base_model="-", name="-").hyperparameters
    return {f.name: getattr(built, f.name) for f in fields(Hyperparameters)}
