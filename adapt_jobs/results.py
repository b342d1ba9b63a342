"""What an /adapt job reports, declared once: `JobResult` and its sections, filled stage by stage by the worker
(`adapt_worker.context.JobContext.result` merges each partial result into the job's record) and read back by the API
(`service.adapt.schemas.AdaptJob`, whose OpenAPI schema is generated from these models).

Torch-free: the service imports this module. Every field is optional — a job fills its result one stage at a time,
and a job of another kind fills other sections — and a section leaves out of its JSON what it did not report (stored
and served alike), so a client sees the keys a job wrote and no others. Keys a stored result holds that are not
declared here are ignored when read back.

Scores are points (× 100), rounded to 3 decimals, keyed by model role: ``base`` and ``adapted`` for an /adapt job;
``base_teacher``, ``adapted_teacher``, ``base_student`` and ``adapted_student`` for a job that asks for a student;
``teacher`` and ``student`` for the build of a base student.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer


class Section(BaseModel):
    """A part of a job's result: fields it did not report (None) are left out of its JSON."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_serializer(mode="wrap")
    def _reported_only(self, handler: SerializerFunctionWrapHandler):  # unannotated: its JSON schema stays the fields'
        return {key: value for key, value in handler(self).items() if value is not None}


class CorpusReport(Section):
    """How the job split its corpus and cropped it (`core.text.choose_crop_rule` of the training documents)."""

    train_documents: int | None = None
    held_out_documents: int | None = None
    crop_rule: str | None = None
    crop_yield: float | None = Field(default=None, description="share of the training documents that yield two crops")
    usable_train_documents: int | None = None


class TrainingReport(Section):
    """One training run of the job (the teacher's adaptation, a distillation, the student's crop step)."""

    steps: int
    seconds: float
    stopped_by: str | None = Field(default=None, description="what ended it: steps, time budget, cancelled…")


class TeacherAdaptation(Section):
    """Written when a student job does not adapt its teacher (the student does not learn from it)."""

    skipped: bool
    why: str


class StudentRehearsal(Section):
    """The general texts a student's crop step rehearses, and under which model's similarities."""

    general_texts: int
    reference: str = Field(description="the model whose similarities the rehearsal keeps (a role)")
    weight: float
    temperature: float
    position_weight: float


class EmbeddedTargets(Section):
    embedded: int = Field(description="general texts the frozen model embedded (the rest came from the cache)")
    seconds: float


class PulledPieces(Section):
    pieces: int = Field(description="pieces of the training documents whose targets were turned toward their document")
    shared: int = Field(0, description="pieces whose words another training document also holds: left at the "
                        "teacher's embedding, since they do not say which document they belong to")
    weight: float = Field(description="the document's weight in a piece's target (student_distil_pull)")
    seconds: float = Field(description="the teacher's pass over the documents and pieces, out of the time budget")


class DistillationTargets(Section):
    """What a student's distillation learns toward: the customer's texts (``distil_teacher``'s embeddings, computed
    when drawn, or up front for the documents and their pieces, each piece's turned toward its document:
    ``pulled_pieces``; absent in jobs that ran before it could be chosen: the adapted teacher's) and the general ones
    (``general_targets``; another model than the distillation's teacher embeds them before the clock, its count and
    seconds under its role)."""

    customer_texts: int
    general_texts: int
    general_targets: str
    distil_teacher: str | None = None
    base_student: EmbeddedTargets | None = None
    base_teacher: EmbeddedTargets | None = None
    adapted_teacher: EmbeddedTargets | None = None
    pulled_pieces: PulledPieces | None = None


class CropStats(Section):
    """The held-out crop pairs: documents, pairs cropped, the rule, its yield (`CropPairRetrieval.crop_stats`)."""

    model_config = ConfigDict(extra="ignore", frozen=True, validate_by_name=True, serialize_by_alias=True)

    documents: int | None = None
    pairs: int | None = None
    rule: str | None = None
    yield_: float | None = Field(default=None, alias="yield")


class Evaluation(Section):
    """The job's scores by model role, in points."""

    in_domain: dict[str, float] | None = Field(
        default=None, description="crop-pair retrieval over the held-out documents (nDCG@10)"
    )
    in_domain_task: str | None = None
    pieces: dict[str, float] | None = Field(
        default=None,
        description="short pieces of each held-out document (lead sentence, title-like line, summary-like span) "
        "retrieving the rest of it (nDCG@10, the mean of the checks): what decides promotion",
    )
    piece_checks: dict[str, dict[str, float]] | None = Field(
        default=None, description="each short-piece check by role: {role: {lead, title, summary}}"
    )
    pieces_task: str | None = None
    teacher_agreement: dict[str, float] | None = Field(
        default=None,
        description="a student job's: how closely each model's retrieval of the lead and title pieces follows the "
        "base teacher's (nDCG@10 against the teacher's ten nearest documents); the adapted student must improve on the "
        "base student's",
    )
    teacher_agreement_task: str | None = None
    general_in_domain: list[str] | None = Field(
        default=None, description="general tasks left out: the scored model was trained on their domain"
    )
    general_tasks: dict[str, dict[str, float]] | None = Field(default=None, description="{role: {task: points}}")
    general: dict[str, float] | None = Field(default=None, description="the mean of general_tasks by role")
    knn: dict[str, float] | None = Field(
        default=None,
        description="{role: points}: kNN accuracy of the labels (labels given), k = 10 cosine neighbours, 10-fold "
        "cross-validation repeated ten times over knn_documents",
    )
    knn_documents: int | None = Field(default=None, description="labelled documents the kNN check scored")
    crops: CropStats | None = None


class GateRow(BaseModel):
    """One check of the gate: ``status`` ok, FAIL, new, skipped or headline."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    task: str
    candidate: float | None = None
    baseline: float | None = None
    delta: float | None = None
    status: str


class GateDecision(Section):
    """Whether the model may be promoted: ``decided_on`` must improve, every other check may drop at most ``margin``
    points (`evaluation.gate.adapt_gate`)."""

    passed: bool
    margin: float | None = None
    reasons: list[str] = Field(default_factory=list)
    table: list[GateRow] | None = None
    decided_on: str | None = Field(default=None, description="the in-domain check that must improve")
    gated: bool | None = Field(default=None, description="false: published as built, not gated (a base student)")
    note: str | None = None
    compared_with: dict[str, GateComparison] | None = Field(
        default=None,
        description="a student job: the adapted student against the base student (decides) and the base teacher "
        "(reported)",
    )


class GateComparison(GateDecision):
    decides: bool


class Published(Section):
    name: str
    version: str
    promoted: bool
    already_built: bool | None = Field(default=None, description="a base student that was built before: not rebuilt")


class JobResult(Section):
    """The whole result of a job; each stage writes its own sections."""

    corpus: CorpusReport | None = None
    training: TrainingReport | None = None
    teacher_adaptation: TeacherAdaptation | None = None
    distillation_targets: DistillationTargets | None = None
    distillation: TrainingReport | None = None
    student_rehearsal: StudentRehearsal | None = None
    student_adaptation: TrainingReport | None = None
    evaluation: Evaluation | None = None
    gate: GateDecision | None = None
    model: Published | None = None

    def to_json(self) -> dict[str, Any]:
        """What the job store keeps (and merges into the job's record, section by section)."""
        return self.model_dump(mode="json", exclude_none=True)
