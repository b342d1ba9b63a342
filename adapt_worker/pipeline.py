"""One /adapt job as stages in order: split → train → export to staging → evaluate → gate → publish. A job that
asks for a compact ``student`` distils the adapted model into it before the export (`student`); a job of kind
``student-build`` builds a base student once (also `student`).

The recipe is the cropping paper's in-domain fine-tuning (``papers/000`` §2 and §3.2.3, Figure 1):
two views of a document are two crops of consecutive sentences, the loss is InfoNCE with τ = 0.05,
lr 2e-5 with warm-up, and most of the gain arrives within ~100 batches — so a job trains for a few
dozen steps, not epochs.

One crop rule per job: `core.text.choose_crop_rule` of the training documents. Training crops with it and
the held-out evaluation crops with it, and only documents the loosest rule can crop are held out, so a job
never evaluates on documents its training could not have used. The paper's 100–250-character filter was
tuned on abstracts and leaves most short technical documents without two crops; the rule relaxes lengths
and falls back to halves, and its yield is reported in the job.

Speed comes by design: only the last ``train_last_layers`` layers are trained (§4.4 of the paper
fine-tunes the last 2), crops are short (``max_seq_length`` 64 for training only — the published bundle
keeps the base model's limit), both cores are used, and the step count is small. Evaluation is never
skipped; the base model's general-suite scores are cached by its content hash, since they do not change
between jobs.

Gate (`evaluation.gate.adapt_gate`, base vs adapted): held-out crop-pair retrieval must improve; each task
of the general offline suite that is out-of-domain for the base model — and kNN accuracy when labels were
given — may drop at most ``gate_margin`` points. The adapted model is always published as a new version of
``name``; it is promoted (made servable) only when the gate passes and the job says ``promote=auto``.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.corpus import read_job_corpus
from adapt_jobs.jobs import EVALUATING, JOB_KIND_STUDENT_BUILD, Job
from adapt_jobs.results import CorpusReport, Evaluation, GateDecision, JobResult, TeacherAdaptation
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import JobSpec, SpecError
from adapt_worker.context import JobContext, JobFailed
from adapt_worker.stages import (
    CACHE_VOLUME,
    crop_train_config,
    export_stage,
    general_tasks,
    guarded,
    publish_stage,
    run_training,
    score_models,
    scratch_dir,
)
from adapt_worker.student import build_student, evaluate_student, student_gate, student_stage
from core.catalog import resolve_model
from core.model_folder import read_trained_on
from core.text import CropRule, can_crop, choose_crop_rule, crop_yield, hold_out
from evaluation.embedding_model import load_model
from evaluation.gate import IN_DOMAIN_TASK, adapt_gate
from evaluation.tasks import CropPairRetrieval
from training.encoder import Encoder
from training.torch_model import TorchModel

log = logging.getLogger(__name__)

# The yield below which a crop rule leaves too few documents to learn the domain from.
MIN_CROP_YIELD = 0.25

# How a job splits its corpus (per job, not per deployment: fixed here).
HELD_OUT_FRACTION, MIN_HELD_OUT, MAX_HELD_OUT = 0.2, 8, 200


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
    held = hold_out(texts, fraction, seed=seed, minimum=min_held_out, maximum=max_held_out, eligible=usable)
    usable_count = sum(map(usable, texts))
    if not held or usable_count - len(held) < len(held):
        raise JobFailed(
            "corpus",
            f"only {usable_count} documents yield two crops: need at least {2 * min_held_out} "
            f"(half to train on, half to evaluate with); send more multi-sentence documents",
        )
    held_set = set(held)
    return HeldOutSplit(
        train=[texts[i] for i in range(len(texts)) if i not in held_set],
        held_out=[texts[i] for i in held],
        held_out_indices=held,
    )


def run_job(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
    """Run every stage of one job, reporting through ``ctx``; raise `JobFailed` (or let ``ctx.check`` raise) to end
    it early. Publishing is fenced by the lease: a worker that lost the job publishes nothing."""
    if job.kind == JOB_KIND_STUDENT_BUILD:
        build_student(job, ctx, config)
        return
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
    split, rule = prepare(spec, ctx, texts)
    ctx.check()

    trained: Path | None = None
    if spec.student is None or spec.student.uses_adapted_teacher:
        trained = train_stage(spec, ctx, settings.worker_threads, base_path, split.train, rule, work)
        ctx.check()
    else:  # the student trains from the base student alone: adapting the teacher would only cost time
        why = ("the student neither distils the adapted teacher nor rehearses its view "
               f"(general_targets {spec.student.general_targets})")  # fmt: skip
        ctx.result(JobResult(teacher_adaptation=TeacherAdaptation(skipped=True, why=why)), event="teacher_adaptation")
    held_out = CropPairRetrieval.from_corpus(split.held_out, seed=spec.hyperparameters.seed, name=IN_DOMAIN_TASK,
                                             rule=rule)  # fmt: skip
    knn = (texts, labels, spec.hyperparameters.seed)
    if spec.student is not None:
        student = student_stage(spec, ctx, config, base_path, trained, split.train, rule, work)
        ctx.check()
        staging, manifest = export_stage(
            spec, job.id, student.checkpoint, rule, work, student.trained_on, source=student.name
        )
        ctx.check()
        ctx.set_state(EVALUATING)
        evaluation = evaluate_student(ctx, config, spec, base_path, trained, student, staging, held_out, knn)
        gate = student_gate(evaluation, margin=spec.hyperparameters.gate_margin)
    else:
        assert trained is not None  # adapted whenever no student is asked for
        base_trained_on = read_trained_on(base_path)  # none for a built-in base: its training data is unknown
        staging, manifest = export_stage(spec, job.id, trained, rule, work, base_trained_on)
        ctx.check()
        ctx.set_state(EVALUATING)
        evaluation = evaluate_stage(spec, ctx, config, base_path, staging, held_out, knn, base_trained_on)
        gate = adapt_gate(
            evaluation["in_domain"],
            evaluation.get("general_tasks"),
            evaluation.get("knn"),
            margin=spec.hyperparameters.gate_margin,
        )
    ctx.result(JobResult(evaluation=Evaluation.model_validate(evaluation), gate=GateDecision.model_validate(gate)),
               event="evaluation")  # fmt: skip
    ctx.check()
    publish_stage(job, ctx, config, staging, manifest, evaluation, gate, promote=spec.promote == "auto")


# ----------------------------------------------------------------------------- stages
def prepare(spec: JobSpec, ctx: JobContext, texts: list[str]) -> tuple[HeldOutSplit, CropRule]:
    """Split the corpus and choose the job's one crop rule; refuse a corpus too few documents of which crop."""
    split = split_corpus(texts, seed=spec.hyperparameters.seed)
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
    return split, rule


def train_stage(
    spec: JobSpec,
    ctx: JobContext,
    threads: int,
    base_path: Path,
    documents: list[str],
    rule: CropRule,
    work: Path,
) -> Path:
    """Fine-tune the base model on the training documents, cropped with the job's rule; the best checkpoint."""
    config = crop_train_config(spec, base_path, documents, work / "train", threads=threads)
    return run_training(ctx, config, crop_rule=rule).best_dir


def evaluate_stage(
    spec: JobSpec,
    ctx: JobContext,
    config: AdaptConfig,
    base_path: Path,
    bundle: Path,
    held_out: CropPairRetrieval,
    knn: tuple[list[str], list[str] | None, int],
    base_trained_on: Sequence[str],
) -> dict[str, Any]:
    """Score base (torch, the checkpoint it came from) and adapted (the ONNX bundle that will be served).

    In-domain: `CropPairRetrieval` over the held-out documents, cropped with the job's rule (the same
    crops for both models). General: the spec's offline tasks that are out-of-domain for the base model
    (`evaluation.data.is_in_domain`; those it was trained on are listed in ``general_in_domain`` and not scored),
    their mean in points. kNN (labels given): `adapt_worker.stages.score_models`.
    """
    with guarded("evaluation", CACHE_VOLUME):
        models = {"base": TorchModel(Encoder.from_pretrained(base_path)), "adapted": load_model(bundle)}
        general = general_tasks(spec.hyperparameters.general_tasks, base_trained_on)
        return score_models(ctx, config, models, held_out, general, general_roles=models, knn=knn)
