"""Request and response bodies of /adapt (shape after OpenAI's fine-tuning jobs)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from adapt_jobs.jobs import Job
from adapt_jobs.knobs import request_fields
from adapt_jobs.results import CorpusReport, Evaluation, GateDecision, JobResult, Published
from adapt_jobs.spec import check_student

PromotePolicy = Literal["auto", "never"]


class AdaptRequestFields(BaseModel):
    """The fields of `AdaptRequest` that are not knobs: what to adapt, into which name, on which corpus."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = Field(description="built-in model (minilm-l6, minilm-l3, mpnet-base) or a configured base model")
    name: str = Field(description="name of the adapted model; a new version is published under it")
    texts: list[str] | None = Field(default=None, description="the corpus, one document per item")
    labels: list[str | int] | None = Field(
        default=None, description="optional class label per document: adds a kNN-accuracy check"
    )
    promote: PromotePolicy = "auto"
    student: str | None = Field(
        default=None,
        description="a student recipe (sct-tiny, distil-tiny: 2 x 384, about 2.9x minilm-l6's texts/s in fp32; "
        "distil-tiny-pca: 2 x 128; sct-small: 3 x 384, minilm-l3's shape, about 1.85x, keeps more of the teacher on "
        "new domains): "
        "after adapting base_model, distil it into that compact student and publish the student as `name`. The base "
        "student is built once per base model and recipe, as a job of its own that this job waits for (`after_job`).",
    )

    @field_validator("student")
    @classmethod
    def _known_student(cls, value: str | None) -> str | None:
        return None if value is None else check_student(value)

    @model_validator(mode="after")
    def _labels_match(self) -> AdaptRequestFields:
        if self.labels is not None and self.texts is not None and len(self.labels) != len(self.texts):
            raise ValueError(f"got {len(self.labels)} labels for {len(self.texts)} texts: give one label per text")
        return self

    def job_fields(self) -> dict[str, Any]:
        """What the job's spec is built from (`adapt_jobs.queueing.spec_for`): every field but the corpus."""
        return self.model_dump(exclude={"texts", "labels"})


# Besides those, a request may set each knob of `adapt_jobs.knobs.JOB_KNOBS` that has an `Override` (max_steps,
# anchor_weight, ...; unset: the service's default), within the knob's bounds and the override's most.
AdaptRequest = create_model(
    "AdaptRequest",
    __base__=AdaptRequestFields,
    __module__=__name__,
    __doc__="``POST /adapt`` as JSON. The multipart form takes the same fields plus a ``file`` upload.",
    **request_fields(),
)


def adapt_request_body() -> dict[str, Any]:
    """The OpenAPI ``requestBody`` of ``POST /adapt``, which reads its body itself (JSON, or a multipart form whose
    ``file`` is read by the corpus reader): `AdaptRequest` as JSON, and its fields but the corpus as a form."""
    schema = AdaptRequest.model_json_schema()
    form = {key: value for key, value in schema["properties"].items() if key not in ("texts", "labels")}
    form["file"] = {"type": "string", "format": "binary", "description": "the corpus (docs/ADAPT.md: the formats)"}
    return {
        "required": True,
        "content": {
            "application/json": {"schema": schema},
            "multipart/form-data": {
                "schema": {"title": "AdaptUpload", "type": "object", "properties": form,
                           "required": ["base_model", "name", "file"]},
            },
        },
    }  # fmt: skip


class JobProgress(BaseModel):
    stage: str | None = None  # preparing, training, trained, exporting, evaluating, publishing, done
    detail: str | None = None
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    elapsed_s: float | None = None
    cpu_s: float | None = None  # worker CPU seconds (all threads) since the job started
    eta_s: float | None = None


class JobError(BaseModel):
    reason: str
    message: str


class JobAttempt(BaseModel):
    """One run of the job by one worker. ``outcome``: none while it runs; ``interrupted`` (its worker died: counted
    against ``max_attempts``), ``handed_back`` (its worker stopped on purpose: not counted), or the job's end state."""

    attempt: int
    worker_id: str
    started_at: int
    ended_at: int | None = None
    outcome: str | None = None


class JobCorpus(CorpusReport):
    """The corpus as queued (``documents``, labels, the API's estimate) and as the job split and cropped it."""

    documents: int
    has_labels: bool | None = None
    usable_documents_estimate: int | None = Field(
        default=None, description="documents the API found that yield two crops"
    )


class AdaptJob(BaseModel):
    """``GET /adapt/{id}``."""

    id: str
    object: Literal["adapt.job"] = "adapt.job"
    kind: str = Field(description="adapt (a POST /adapt), or student-build (the one-time build of a base student)")
    after_job: str | None = Field(description="the job this one waits for: it starts once that job succeeded")
    state: str
    created_at: int
    created_by: str | None = Field(
        description="the API key id of who created the job (a short SHA-256 of the key, never the key); null on a "
        "server without keys. Every creation, cancellation and promotion is an 'audit' event in GET /adapt/{id}/events"
    )
    started_at: int | None
    finished_at: int | None
    base_model: str
    name: str
    hyperparameters: dict[str, Any]
    student: dict[str, Any] | None = Field(description="the student distilled from the adapted model, when asked")
    corpus: JobCorpus
    progress: JobProgress
    evaluation: Evaluation | None
    gate: GateDecision | None = Field(description="what decided promotion (`gate.decided_on` must improve)")
    model: Published | None
    error: JobError | None
    cancel_requested: bool
    attempt: int = Field(description="the current (or last) attempt; 0 while never started")
    max_attempts: int = Field(description="attempts that may be interrupted before the job fails with 'interrupted'")
    attempts: list[JobAttempt]

    @classmethod
    def from_job(cls, job: Job) -> AdaptJob:
        params, result = job.params, JobResult.model_validate(job.result)
        reported = result.corpus.model_dump(exclude_none=True) if result.corpus else {}
        return cls(
            id=job.id,
            kind=job.kind,
            after_job=job.after_job,
            state=job.state,
            created_at=int(job.created_at),
            created_by=job.created_by,
            started_at=int(job.started_at) if job.started_at else None,
            finished_at=int(job.finished_at) if job.finished_at else None,
            base_model=params["base_model"],
            name=params["name"],
            hyperparameters=params.get("hyperparameters", {}),
            student=params.get("student"),
            corpus=JobCorpus(documents=job.n_documents, **params.get("corpus", {}), **reported),
            progress=JobProgress(**{k: v for k, v in job.progress.items() if k in JobProgress.model_fields}),
            evaluation=result.evaluation,
            gate=result.gate,
            model=result.model,
            error=JobError(**job.error) if job.error else None,
            cancel_requested=job.cancel_requested,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            attempts=[
                JobAttempt(
                    attempt=a["attempt"],
                    worker_id=a["worker_id"],
                    started_at=int(a["started_at"]),
                    ended_at=int(a["ended_at"]) if a.get("ended_at") else None,
                    outcome=a.get("outcome"),
                )
                for a in job.attempts
            ],
        )


class AdaptJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdaptJob]
    has_more: bool
