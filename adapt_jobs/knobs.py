"""Every per-job knob of /adapt, declared once: its name, type, default, bounds and what it does.

A `Knob` is one value a job runs with. From its declaration come the service's default (the `AdaptSettings` field
``EMBED_ADAPT_<PREFIX><NAME>``, flag ``--adapt-<prefix><name>``, the chart's ``config`` key), the request's optional
override when a client may set it (`service.adapt.schemas.AdaptRequest`: the same lower bounds, a request's upper one),
the field of the job's spec the worker reads (`adapt_jobs.spec.Hyperparameters`, `StudentPlan`, `StudentBuildSpec`,
filled from the request or the default by `knob_values`, checked by `knob_problems`) and, where the job's crop
training takes it as is, the `training.config.TrainConfig` field it becomes (``train_field``; the worker's
`adapt_worker.stages.crop_train_config` sets it, tests/adapt/test_knobs.py holds the two together). Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode

from core.settings import split_csv

# /adapt objective → (training objective, views): SimCSE is InfoNCE on dropout views (paper 000 §2).
OBJECTIVES = {"crop-infonce": ("infonce", "crop"), "sct": ("sct", "crop"), "simcse": ("simcse", "dropout")}
# The models of a student job (also its evaluation roles); the first three can give the general texts' targets
# (the knob ``general_targets`` of STUDENT_KNOBS).
BASE_STUDENT, BASE_TEACHER, ADAPTED_TEACHER = "base_student", "base_teacher", "adapted_teacher"
GENERAL_TARGETS = (BASE_STUDENT, BASE_TEACHER, ADAPTED_TEACHER)
DISTIL_TEACHERS = (BASE_TEACHER, ADAPTED_TEACHER)  # whose embeddings of the customer's texts a student distils
# The gate's "general" side: offline tasks unrelated to the customer's corpus (evaluation.tasks), of which a job scores
# those out-of-domain for its base model. Short technical text (documentation search, titles by subject) and whole
# news documents; chosen for cost: about 37 CPU-seconds per model on minilm-l6 (PyDocSummaryRetrieval 24,
# PyDocModuleClustering 10, LeeDocSTS 4), where BibleParaphraseRetrieval alone costs 47 and BBCNewsKNN over 100.
DEFAULT_GENERAL_TASKS = ("PyDocSummaryRetrieval", "PyDocModuleClustering", "LeeDocSTS")

_DEFAULT: Any = object()  # Knob.absent: a job stored before the knob existed ran with its default


def _zero_is_none(value: int | None) -> int | None:
    """0 in a setting or a request means "none" (every layer, the recipe's own): the spec holds None."""
    return value or None


@dataclass(frozen=True)
class Override:
    """How a request may override a knob: its most (``le``) and its description in the API's schema."""

    le: float | None = None
    description: str | None = None


@dataclass(frozen=True)
class Knob:
    """One value a job runs with. ``type`` and ``default`` are the setting's (the request's, for a knob without a
    setting); ``ge``/``gt`` bound it everywhere — the setting, the request, the spec."""

    name: str  # the spec's attribute
    type: Any
    default: Any
    ge: float | None = None
    gt: float | None = None
    help: str | None = None  # the setting's description (flags, chart, docs/DEPLOY.md); None: no setting
    prefix: str = ""  # the setting is named prefix + name
    request: Override | None = None  # None: a client cannot set it
    train_field: str | None = None  # the TrainConfig field the job's crop training sets from it
    spec_type: Any = None  # the spec field's type when it differs from the setting's
    to_spec: Callable[[Any], Any] | None = None  # the setting's (or request's) value as the spec holds it
    joint: bool = False  # the defaults of joint knobs apply only when a request gives none of them
    capped: bool = False  # a joint knob every job has: given only another joint knob, the request's most (request.le)
    absent: Any = _DEFAULT  # what a job stored before this knob existed ran with

    @property
    def setting(self) -> str | None:
        """The `AdaptSettings` field holding the service's default; None for a knob only a request sets."""
        return None if self.help is None else f"{self.prefix}{self.name}"

    def as_spec(self, value: Any) -> Any:
        return self.to_spec(value) if self.to_spec is not None and value is not None else value

    @property
    def cap(self) -> Any:
        """A capped knob's value when a request gives another joint knob and not this one: the most a request may
        ask, so the job ends on what the request gave (its steps) yet never runs unbounded."""
        if not self.capped or self.request is None or self.request.le is None:
            raise ValueError(f"knob {self.name!r} has no cap: it needs capped=True and a request's most (le)")
        return self.type(self.request.le)

    @property
    def stored_default(self) -> Any:
        """The spec's value when the stored job lacks the field."""
        return self.as_spec(self.default if self.absent is _DEFAULT else self.absent)

    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt)) if v is not None}

    def problem(self, value: Any) -> str | None:
        """What is wrong with a spec's value of this knob (None: nothing); None values are checked elsewhere."""
        if value is None:
            return None
        choices = get_args(self.type) if get_origin(self.type) is Literal else ()
        if choices and value not in choices:
            return f"{self.name} must be one of {list(choices)}, got {value!r}"
        if self.ge is not None and value < self.ge:
            return f"{self.name} must be >= {self.ge:g}, got {value}"
        if self.gt is not None and value <= self.gt:
            return f"{self.name} must be > {self.gt:g}, got {value}"
        return None


# `Hyperparameters`: how the job trains and is gated (the cropping paper's in-domain recipe, ``papers/000`` §2).
JOB_KNOBS = (
    Knob("objective", Literal[tuple(OBJECTIVES)], "crop-infonce", request=Override()),
    Knob("max_steps", int, 60, ge=1, train_field="max_steps", joint=True, spec_type=int | None,
         help="Default training steps of a job; most of the gain comes within ~100 batches.",
         request=Override(le=20_000, description="training steps (batches)")),
    Knob("time_budget_s", float, 180.0, gt=0, train_field="time_budget_s", joint=True, capped=True,
         spec_type=float | None,
         help="Default training time budget of a job (whichever of steps/time ends first).",
         request=Override(le=6 * 3600, description="training time budget in seconds; a request giving max_steps "
                          "without it runs with this most, 21600: every job has a time cap")),
    Knob("train_last_layers", int, 2, ge=0, train_field="train_last_layers", spec_type=int | None,
         to_spec=_zero_is_none,
         help="Default number of top layers trained (0 = all). Fewer is faster and forgets less general quality; all "
         "layers gain most in-domain.",
         request=Override(le=48, description="train only the last k transformer layers; 0 = all layers")),
    Knob("anchor_weight", float, 3.0, ge=0, train_field="anchor_weight",
         help="Default weight of the MSE anchor to the base model's embeddings while adapting (0 = none). Higher "
         "forgets less off the customer's domain and gains less on it.",
         request=Override(le=1000, description="MSE anchor to the base model's embeddings; 0 = none")),
    Knob("batch_size", int, 32, ge=2, train_field="batch_size",
         help="Default batch (in-batch negatives). Larger is a harder task but slower per step.",
         request=Override(le=512)),
    Knob("lr", float, 2e-5, gt=0, train_field="lr",
         help="Peak learning rate of a job (the cropping paper's 2e-5); higher forgets more."),
    Knob("max_seq_length", int, 64, ge=16, train_field="max_seq_length",
         help="Token limit of training crops (two sentences fit). The published model keeps the base limit."),
    Knob("seed", int, 0, ge=0, train_field="seed", request=Override(le=2**31 - 1)),
    Knob("gate_margin", float, 2.0, ge=0.0,
         help="Points the general offline suite may drop and still promote an adapted model."),
    Knob("general_tasks", Annotated[list[str], NoDecode, BeforeValidator(split_csv)], DEFAULT_GENERAL_TASKS,
         spec_type=tuple[str, ...], to_spec=tuple,
         help="Offline tasks (evaluation.tasks) of the gate's general side (comma-separated); a job scores those "
         "out-of-domain for its base model (a task drawn from text the base was trained on is left out). More tasks "
         "guard general quality better; each costs evaluation time per job (the base model's scores are cached; the "
         "default costs about 37 CPU-seconds on minilm-l6, BibleParaphraseRetrieval would add 47, BBCNewsKNN over "
         "100)."),
)  # fmt: skip

# `StudentPlan`: how a job asking for a student turns the model it adapted into that compact student.
STUDENT_KNOBS = (
    Knob("max_steps", int, 300, ge=0, prefix="student_", spec_type=int | None, absent=0,
         help="Distillation steps into the student (batch of the student's recipe): the distil_teacher's embeddings "
         "of the customer's training texts (whole documents, a sentence of each and, with distil_spans, their short "
         "pieces, every sentence and word runs) and of the general texts; before the crop step when there is one. "
         "0 = none, the crop step starts from the base student. On three unseen domains, five seeds each, the "
         "distillation alone (no crop step) raised their real task over the base student by 2.5-20.3 points, where "
         "the crop step moved it by -3.3 to +6.3 (docs/BENCHMARKS.md)."),
    Knob("time_budget_s", float, 330.0, gt=0, prefix="student_", spec_type=float | None, absent=120.0,
         help="Distillation time budget (whichever of steps/time ends first). The 300 steps took 239-1365 s on 2 "
         "shared AVX-512 VNNI cores, the teacher's embeddings computed as drawn; with 330 s whole jobs took 364-379 "
         "s. A slower CPU runs fewer steps in the same budget, so the job stays within 8 minutes: on 2 AVX2 cores "
         "137-188 steps, whole jobs 399-402 s, at some cost in domain (docs/BENCHMARKS.md)."),
    Knob("distil_teacher", Literal[tuple(sorted(DISTIL_TEACHERS))], BASE_TEACHER, prefix="student_",
         absent=ADAPTED_TEACHER,
         help="Whose embeddings of the customer's texts the student learns: the base teacher (no crop fine-tune of "
         "the teacher is run) or the adapted teacher (the job's crop fine-tune of the teacher first). The crop "
         "fine-tune raises the teacher's crop pairs, not its real tasks: on CWE distilling the adapted teacher "
         "scored 72.1 on the domain's real task with the crop step after it, the base teacher 75.2-75.7 without (five "
         "seeds; docs/ADAPT.md, docs/BENCHMARKS.md)."),
    Knob("distil_spans", int, 8, ge=0, prefix="student_", absent=0,
         help="Seeded runs of 3-12 words per training document (name-like phrases) the distillation adds, with each "
         "document's short pieces (its first sentence, first words, most central sentence) and every sentence: "
         "text shaped like a customer's queries, whose teacher embeddings the student learns too; 0 = whole "
         "documents and a sentence of each only."),
    Knob("distil_pull", float, 2.0, ge=0, prefix="student_", absent=0.0,
         help="Weight of a piece's source document in the piece's distillation target: the teacher's embedding of each "
         "piece (distil_spans) is turned toward its document's, unit(piece) + w * unit(document), so the student "
         "learns to put a query-shaped piece near the document that answers it; a piece whose words another "
         "training document holds too (boilerplate) keeps the teacher's embedding. The teacher embeds the "
         "documents and pieces up front, inside the time budget; 0 = the teacher's embeddings as they are. On the "
         "recipe's base student, the real task against minilm-l6 not adapted, with 2 (with 0): SPDX licences, a "
         "licence's name finding its text, +4.83 to +6.73 (+2.81 to +4.45); CWE weaknesses -0.10 to +0.77 (-4.56 "
         "to -3.23); drug reviews' kNN -1.00 to +2.00 (-3.00 to -0.67) (five seeds each, at the recipe's learning "
         "rate; docs/BENCHMARKS.md)."),
    Knob("distil_lr", float, 2e-4, ge=0, prefix="student_", absent=0.0,
         help="Peak learning rate of the distillation (linear warm-up and decay, as the student's recipe runs it); 0 "
         "= the recipe's own (sct-tiny: 1e-4, set for its 1,200-step build). 300 steps on the customer's texts "
         "take more: with 2e-4 against 1e-4, five seeds each, the real task rose on CWE (+0.75 to +1.16) and SPDX "
         "(+0.60 to +1.28) and rose or held on the drug reviews' kNN (0.00 to +1.17, every review classified once), "
         "every run at or above minilm-l6 not adapted; out of domain within 0.55 of the base student or above it "
         "(docs/BENCHMARKS.md)."),
    Knob("general_texts", int, 4000, ge=0, prefix="student_",
         help="General texts (a seeded sample of the texts the base student was built on) the student keeps its "
         "view of off the customer's domain: rehearsed in the crop step and distilled beside the customer's texts; "
         "0 = none."),
    Knob("general_targets", Literal[tuple(sorted(GENERAL_TARGETS))], BASE_TEACHER, prefix="student_",
         absent=BASE_STUDENT,
         help="Whose view of the general texts the student keeps: a distillation learns that model's embeddings of "
         "them (a frozen model's computed before the clock starts and kept in the cache, the adapted teacher's when "
         "first drawn, inside the time budget), a crop step's rehearsal its similarities: the base teacher, the base "
         "student itself or the adapted teacher. The default is the distillation's own teacher: the student learns "
         "one model's view on and off the customer's domain. With a crop step and no distillation, the base "
         "student's own view kept 0.4-0.5 more points out of domain than the adapted teacher's on IMDB, two seeds "
         "(docs/BENCHMARKS.md)."),
    Knob("adapt_steps", int, 0, ge=0, prefix="student_", absent=120,
         help="Steps of the job's own recipe (crop InfoNCE with the MSE anchor) on the student, every layer trained, "
         "with the rehearsal of the general texts; 0 = distillation only."),
    Knob("adapt_lr", float, 2e-4, gt=0, prefix="student_",
         help="Peak learning rate of that step (a 2-layer student takes more than 2e-5)."),
    Knob("adapt_time_budget_s", float, 360.0, gt=0, prefix="student_",
         help="Time budget of that step (whichever of steps/time ends first). 120 steps take ~220 s on 2 AVX-512 "
         "VNNI cores and ~1.4x that on 2 AVX2 cores (docs/BENCHMARKS.md)."),
    Knob("rehearsal_weight", float, 1.0, ge=0, prefix="student_", absent=0.0,
         help="Weight of the crop step's similarity rehearsal: each step 64 general texts keep the similarities the "
         "general-targets model gives them (SCT's KL between similarity distributions, papers/001 §3.4); 0 = none."),
    Knob("rehearsal_temperature", float, 0.2, gt=0, prefix="student_", absent=0.05,
         help="Temperature of that rehearsal's similarity distributions: lower holds each general text's nearest "
         "neighbours, higher its coarser relations to all the others. On IMDB, three seeds, 0.2 and 0.05 kept as much "
         "out of domain on average (-0.84, -0.87 points) and 0.2 scored 0.2 points more in domain "
         "(docs/BENCHMARKS.md)."),
    Knob("rehearsal_position_weight", float, 10.0, ge=0, prefix="student_", absent=0.0,
         help="Weight of the rehearsal's position term: each general text's normalised embedding is also held to the "
         "general-targets model's (mean squared distance; that model must have the student's width: the base "
         "student, or a teacher as wide); 0 = relations only. On IMDB, five seeds, weight 10 kept more of the "
         "out-of-domain average on every seed (+0.31 points on average with BBC clustering averaged over its seeds; "
         "-0.94 instead of -1.12 as reported) for 0.35 points in domain (docs/BENCHMARKS.md)."),
)  # fmt: skip

# `StudentBuildSpec`: the one-time build of a base student.
STUDENT_BUILD_KNOBS = (
    Knob("max_steps", int, 0, ge=0, prefix="student_build_", spec_type=int | None, to_spec=_zero_is_none,
         absent=None,
         help="Steps of the one-time build of a base student; 0 = its recipe's own (sct-tiny: 1,200, 2,491 s on 2 "
         "shared AVX-512 VNNI cores, 3,022 s on 2 AVX2 cores, plus the teacher's pass). Fewer builds sooner and a "
         "weaker student."),
    Knob("max_documents", int, 0, ge=0, prefix="student_build_", spec_type=int | None, to_spec=_zero_is_none,
         absent=None, help="Documents the base-student build reads; 0 = its recipe's own."),
)  # fmt: skip

KNOBS = (*JOB_KNOBS, *STUDENT_KNOBS, *STUDENT_BUILD_KNOBS)


def setting_fields() -> dict[str, Any]:
    """``create_model`` fields of every knob with a setting: the service's defaults (`AdaptSettings`)."""
    fields: dict[str, Any] = {}
    for knob in KNOBS:
        if knob.setting is None:
            continue
        if isinstance(knob.default, tuple):  # a list setting: a fresh list per settings object
            default = Field(default_factory=lambda d=knob.default: list(d), description=knob.help)
        else:
            default = Field(default=knob.default, description=knob.help, **knob.bounds())
        fields[knob.setting] = (knob.type, default)
    return fields


def request_fields() -> dict[str, Any]:
    """``create_model`` fields of the knobs a request may set: optional overrides of the service's defaults (a
    knob without a setting has its own default), within the knob's bounds and the request's most."""
    fields: dict[str, Any] = {}
    for knob in JOB_KNOBS:
        if knob.request is None:
            continue
        le = {"le": knob.request.le} if knob.request.le is not None else {}
        extra = {"description": knob.request.description} if knob.request.description is not None else {}
        if knob.setting is None:
            fields[knob.name] = (knob.type, Field(default=knob.default, **knob.bounds(), **le, **extra))
        else:
            fields[knob.name] = (knob.type | None, Field(default=None, **knob.bounds(), **le, **extra))
    return fields


def spec_fields(knobs: Iterable[Knob]) -> list[tuple[str, Any, Any]]:
    """``make_dataclass`` fields of a spec, each defaulting to what a job stored without it ran with."""
    return [(k.name, k.spec_type or k.type, field(default=k.stored_default)) for k in knobs]


def knob_values(knobs: Iterable[Knob], settings: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Each knob's value for a new job: the request's (``overrides``; None = not given) or the service's default
    from ``settings`` (an `AdaptSettings`), as the spec holds it. Joint knobs take their defaults only together, and
    a capped one is never left out: a request giving ``max_steps`` alone runs its steps, not the default time budget,
    with ``time_budget_s`` at the most a request may ask (6 h), so every job has a time cap; one giving
    ``time_budget_s`` alone runs on time, with no step count."""
    knobs = tuple(knobs)
    unknown = set(overrides) - {k.name for k in knobs}
    if unknown:
        raise TypeError(f"no knobs named {sorted(unknown)}; knobs: {[k.name for k in knobs]}")
    joint_given = any(overrides.get(k.name) is not None for k in knobs if k.joint)
    values = {}
    for knob in knobs:
        value = overrides.get(knob.name)
        if value is None and not (knob.joint and joint_given):
            value = knob.default if knob.setting is None else getattr(settings, knob.setting)
        elif value is None and knob.capped:
            value = knob.cap
        values[knob.name] = knob.as_spec(value)
    return values


def stored_values(knobs: Iterable[Knob], stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored spec's values as the spec holds them (JSON gives lists for tuples); unknown keys are kept, for the
    spec to refuse. A capped knob stored as None — a job queued when a request's ``max_steps`` alone left it without
    a time cap — reads back as its cap, so the job runs with one."""
    by_name = {k.name: k for k in knobs}
    values = {name: by_name[name].as_spec(value) if name in by_name else value for name, value in stored.items()}
    for knob in by_name.values():
        if knob.capped and knob.name in values and values[knob.name] is None:
            values[knob.name] = knob.cap
    return values


def knob_problems(knobs: Iterable[Knob], spec: object) -> list[str]:
    """What is wrong with a spec's knob values (out of bounds, not one of the choices)."""
    problems = (knob.problem(getattr(spec, knob.name)) for knob in knobs)
    return [p for p in problems if p is not None]
