"""What the stages of a job read and hand each other, typed: the `Attempt` every stage reads (an /adapt job's, or a
base-student build's `BuildAttempt`), opened once before the first stage, and the values stages return — `Trained`,
`Exported`, `Verdict` (with the result models of `adapt_jobs.results`: `Evaluation`, `GateDecision`, `Published`).

Opening an /adapt attempt is the job's preparation: read its spec and corpus, resolve the base model, split the corpus
and choose the job's one crop rule (`core.text.choose_crop_rule` of the training documents). Training crops with it and
the held-out evaluation crops with it, and only documents the loosest rule can crop are held out, so a job never
evaluates on documents its training could not have used. The paper's 100–250-character filter was tuned on abstracts
and leaves most short technical documents without two crops; the rule relaxes lengths and falls back to halves, and
its yield is reported in the job.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from adapt_jobs.corpus import read_job_corpus
from adapt_jobs.jobs import JOB_KIND_ADAPT, JOB_KIND_STUDENT_BUILD, Job
from adapt_jobs.results import CorpusReport, Evaluation, GateDecision, JobResult
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import JobSpec, SpecError, StudentBuildSpec, StudentPlan
from adapt_worker.context import JobContext, JobFailed, scratch_dir
from core.catalog import resolve_model
from core.text import CropRule, can_crop, choose_crop_rule, crop_yield, hold_out
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.tasks import CropPairRetrieval

# The yield below which a crop rule leaves too few documents to learn the domain from.
MIN_CROP_YIELD = 0.25

# How a job splits its corpus (per job, not per deployment: fixed here).
HELD_OUT_FRACTION, MIN_HELD_OUT, MAX_HELD_OUT = 0.2, 8, 200

ADAPT_STUDENT = "adapt-student"  # the pipeline of an adapt job whose spec asks for a student

# Training documents the short-piece checks add as distractors (a seeded sample): the customer's own index.
MAX_PIECE_DISTRACTORS = 200


@dataclass(frozen=True)
class HeldOutSplit:
    train: list[str]
    held_out: list[str]
    held_out_indices: list[int]


def split_corpus(
    texts: Sequence[str],
    *,
    seed: int,
    fraction: float = HELD_OUT_FRACTION,
    min_held_out: int = MIN_HELD_OUT,
    max_held_out: int = MAX_HELD_OUT,
    usable: Callable[[str], bool] = can_crop,
) -> HeldOutSplit:
    """Hold out a seeded sample of crop-able documents for evaluation; train on the rest.

    Held-out documents are drawn only from documents that yield two crops (``CropPairRetrieval``
    needs a query and a positive from each), and never appear in training.
    """
    split = hold_out(texts, fraction, seed=seed, minimum=min_held_out, maximum=max_held_out, eligible=usable)
    drawn = len(texts) - len(split.train)
    if len(split.held) < min(min_held_out, drawn):  # drawn documents the corpus repeats were not held out
        raise JobFailed(
            "corpus",
            f"only {len(split.held)} documents could be held out for evaluation, {min_held_out} needed: the corpus "
            "repeats the others drawn, and a document trained on cannot test the model; send more distinct documents",
        )
    usable_count = sum(map(usable, texts))
    if not split.held or usable_count - len(split.held) < len(split.held):
        raise JobFailed(
            "corpus",
            f"only {usable_count} documents yield two crops: need at least {2 * min_held_out} "
            f"(half to train on, half to evaluate with); send more multi-sentence documents",
        )
    return HeldOutSplit(
        train=[texts[i] for i in split.train],
        held_out=[texts[i] for i in split.held],
        held_out_indices=split.held,
    )


@dataclass(frozen=True)
class InDomainChecks:
    """The job's in-domain checks, built once from its held-out documents: crop pairs (cropped with the job's rule)
    and the short pieces of each document retrieving the rest of it among the held-out rests and ``distractors``."""

    crop_pairs: CropPairRetrieval
    held_out: list[str]
    distractors: list[str]


@dataclass(frozen=True)
class LabelledSample:
    """The corpus with its labels, for the kNN check (labels given); ``seed`` draws the sample it scores."""

    texts: list[str]
    labels: list[str]
    seed: int


@dataclass(frozen=True)
class Attempt:
    """One attempt of an /adapt job, as every stage reads it."""

    job: Job
    ctx: JobContext
    config: AdaptConfig
    work: Path  # this attempt's scratch folder
    spec: JobSpec
    base_path: Path  # the base model's checkpoint
    split: HeldOutSplit
    rule: CropRule
    checks: InDomainChecks
    labelled: LabelledSample | None

    @property
    def promote(self) -> bool:
        return self.spec.promote == "auto"

    @property
    def kind(self) -> str:
        """The pipeline it runs: ``adapt``, or ``adapt-student`` when its spec asks for a student."""
        return ADAPT_STUDENT if self.spec.student is not None else JOB_KIND_ADAPT

    @property
    def student(self) -> StudentPlan:
        """The student the job asks for (the stages of a student job only)."""
        if self.spec.student is None:
            raise ValueError(f"adapt job {self.job.id} asks for no student")
        return self.spec.student

    @classmethod
    def open(cls, job: Job, ctx: JobContext, config: AdaptConfig) -> Attempt:
        """Read the job's spec and corpus, split it and choose its crop rule (reported as the result's ``corpus``);
        refuse a corpus too few documents of which crop."""
        try:
            spec = JobSpec.from_params(job.params)
        except SpecError as err:  # a job stored by a service that wrote another spec: fail it with the reason
            raise JobFailed("spec", str(err)) from err
        work = scratch_dir(job)
        shutil.rmtree(work, ignore_errors=True)
        texts, labels = read_job_corpus(Path(job.corpus_dir))
        settings = config.settings
        ctx.stage("preparing", attempt=job.attempt)
        base_path = resolve_model(settings.base_models.get(spec.base_model, spec.base_model), config.cache_dir)
        seed = spec.hyperparameters.seed
        split = split_corpus(texts, seed=seed)
        rule = choose_crop_rule(split.train)
        value = crop_yield(split.train, rule)
        usable = round(value * len(split.train))
        report = CorpusReport(
            train_documents=len(split.train),
            held_out_documents=len(split.held_out),
            crop_rule=rule.describe(),
            crop_yield=round(value, 4),
            usable_train_documents=usable,
        )
        ctx.result(JobResult(corpus=report), event="corpus")
        if value < MIN_CROP_YIELD:
            raise JobFailed(
                "corpus",
                f"only {usable} of {len(split.train)} training documents ({value:.0%}) yield two crops "
                f"even with the most permissive rule ({rule.describe()}): send longer, multi-sentence documents",
            )
        crops = CropPairRetrieval.from_corpus(split.held_out, seed=seed, name=IN_DOMAIN_TASK, rule=rule)
        distractors = random.Random(seed).sample(split.train, min(MAX_PIECE_DISTRACTORS, len(split.train)))
        checks = InDomainChecks(crops, split.held_out, distractors)
        labelled = LabelledSample(texts, labels, seed) if labels is not None else None
        return cls(job, ctx, config, work, spec, base_path, split, rule, checks, labelled)


@dataclass(frozen=True)
class BuildAttempt:
    """One attempt of a ``student-build`` job: the base student of ``spec`` trained from ``teacher``."""

    job: Job
    ctx: JobContext
    config: AdaptConfig
    work: Path
    spec: StudentBuildSpec
    teacher: Path  # the base model's checkpoint

    kind = JOB_KIND_STUDENT_BUILD

    @property
    def promote(self) -> bool:
        return True  # a base student is published as built: every student job starts from it

    @classmethod
    def open(cls, job: Job, ctx: JobContext, config: AdaptConfig) -> BuildAttempt:
        try:
            spec = StudentBuildSpec.from_params(job.params)
        except SpecError as err:
            raise JobFailed("spec", str(err)) from err
        work = scratch_dir(job)
        shutil.rmtree(work, ignore_errors=True)
        ctx.stage("preparing", attempt=job.attempt)
        settings = config.settings
        teacher = resolve_model(settings.base_models.get(spec.base_model, spec.base_model), config.cache_dir)
        return cls(job, ctx, config, work, spec, teacher)


@dataclass(frozen=True)
class Baseline:
    """A model a trained one is scored against: ``role`` in the evaluation, its torch ``checkpoint``; ``general``:
    also scored on the general tasks and kNN (a model that can be served; an adapted teacher a student learnt from
    is scored in domain only)."""

    role: str
    checkpoint: Path
    general: bool = True


@dataclass(frozen=True)
class Trained:
    """A model a job trained and will publish, and what it is judged against."""

    checkpoint: Path  # its best checkpoint
    source: str  # the model it was trained from (the manifest's base_model): the job's base model or its base student
    trained_on: tuple[str, ...]  # the corpora that model was trained on (its general tasks leave their domains out)
    role: str  # its role in the evaluation (adapted, adapted_student)
    baselines: tuple[Baseline, ...]  # scored beside it, in the order the evaluation reports them
    compared_with: tuple[str, ...]  # the roles the gate compares it with: the first decides, the others are reported
    reference: str | None = None  # the role whose retrieval it must follow more closely than the deciding role does


@dataclass(frozen=True)
class AdaptedTeacher:
    """The adapted teacher's checkpoint a student job learns from, or None when its plan does not use one."""

    checkpoint: Path | None


@dataclass(frozen=True)
class Exported:
    """The trained model as a complete, unpublished bundle in the attempt's scratch folder (its manifest inside)."""

    bundle: Path


@dataclass(frozen=True)
class Verdict:
    """The evaluation and the gate's decision, as the job recorded them: what publishing needs."""

    evaluation: Evaluation
    gate: GateDecision


AnyAttempt = Attempt | BuildAttempt  # what the stages every kind of job ends with read
