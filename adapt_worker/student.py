"""Compact students for /adapt: a job that asks for ``"student": "<recipe>"`` publishes a 2-layer model for the
customer's corpus instead of the adapted teacher — what no embedding server offers.

Two kinds of work, two kinds of job:

* **The base student, built once** (job kind ``student-build``): the student recipe (``sct-tiny``: layers [0, 5] of
  the teacher, SCT's distillation with the MSE term, papers/001 §3.4; or ``distil-tiny``, ``distil-tiny-pca``) run
  with its own defaults against the base model, published and promoted in the registry as
  ``<base>--<recipe>`` (``minilm-l6--sct-tiny``: servable itself), its bundle keeping the torch checkpoint
  (``checkpoint/``) every student job starts from. The service queues it the first time a job asks for that
  student, as a job of its own; the asking job waits for it (`adapt_jobs.store.JobStore.create`, ``after_job``).
* **The adapted student** (inside the /adapt job): a copy of the base student trained on the customer's crops with the
  job's own crop recipe, every layer trained (``student_adapt_steps``), while a similarity rehearsal keeps the base
  student's own structure and positions of a seeded sample of its training texts (``student_general_targets``,
  ``student_rehearsal_position_weight``; so it keeps what it knew off the customer's domain: `student_stage`). The job
  adapts the teacher first only when the student learns from it (`StudentPlan.uses_adapted_teacher`): its
  view rehearsed instead, or ``student_max_steps`` > 0, a distillation of the adapted teacher with the recipe's
  objective and whole-text views, on the customer's training documents plus those general texts (off by default: on IMDB
  both lost more out of domain than they gained in domain).

The gate (`student_gate`) decides on the adapted student against the base student — the held-out in-domain task
must improve, each general task may drop at most ``gate_margin`` points — and reports the same comparison against
the base teacher (never deciding: a 2-layer student is not expected to keep every point of a 6-layer teacher).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.jobs import EVALUATING, Job
from adapt_jobs.results import DistillationTargets as DistillationTargetsReport
from adapt_jobs.results import Evaluation, GateDecision, JobResult, Published, StudentRehearsal
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import (
    ADAPTED_TEACHER,
    BASE_STUDENT,
    BASE_TEACHER,
    JobSpec,
    SpecError,
    StudentBuildSpec,
    StudentPlan,
    base_student_name,
)
from adapt_worker.context import JobContext, JobFailed
from adapt_worker.stages import (
    CACHE_VOLUME,
    SCRATCH_VOLUME,
    crop_train_config,
    general_tasks,
    guarded,
    publish_stage,
    run_training,
    score_models,
    scratch_dir,
)
from core import registry as reg
from core.catalog import resolve_model
from core.model_folder import RECIPE_FILE, read_trained_on
from core.text import CropRule
from evaluation.embedding_model import EmbeddingModel, load_model
from evaluation.gate import adapt_gate
from evaluation.tasks import CropPairRetrieval
from export.bundle import build_bundle
from training.assembly import cut_texts
from training.config import TrainConfig, load_config
from training.data import text_units
from training.encoder import Encoder
from training.inputs import recipe_training_texts
from training.targets import TEACHER_EMBEDDINGS, TeacherTargets, write_vectors
from training.torch_model import TorchModel

STUDENT_CHECKPOINT = "checkpoint"  # the folder of a base student's bundle that keeps its torch checkpoint
STUDENT_METHOD = "student"  # manifest method.name of a base student
ADAPTED_STUDENT = "adapted_student"  # with adapt_jobs.spec's three: the roles a student job scores


@dataclass(frozen=True)
class StudentRun:
    name: str  # the base student's registry name (<base>--<recipe>)
    checkpoint: Path  # the adapted student (best checkpoint of its last training step)
    base_checkpoint: Path  # the base student it started from
    trained_on: list[str]  # the corpora the base student was trained on


def base_student_checkpoint(registry: Path, name: str) -> Path:
    """The torch checkpoint kept in the promoted bundle of the base student ``name``."""
    try:
        bundle = reg.current_bundle(registry, name)
    except reg.RegistryError as err:
        raise JobFailed("student", f"the base student {name!r} is not in the registry ({err})") from err
    checkpoint = bundle / STUDENT_CHECKPOINT
    if not (checkpoint / "config.json").is_file():
        raise JobFailed(
            "student", f"{bundle} keeps no torch checkpoint ({STUDENT_CHECKPOINT}/): it was not built by a "
            "student-build job; remove it (or promote another version) and ask again to rebuild it",
        )  # fmt: skip
    return checkpoint


def build_student(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
    """A ``student-build`` job: train the recipe's student of the base model once, publish and promote it (a
    no-op when a promoted version already exists: whoever asked first built it)."""
    try:
        spec = StudentBuildSpec.from_params(job.params)
    except SpecError as err:
        raise JobFailed("spec", str(err)) from err
    settings = config.settings
    current = reg.current_version(config.registry_dir, spec.name)
    if current is not None:
        built = Published(name=spec.name, version=current, promoted=True, already_built=True)
        ctx.result(JobResult(model=built), event="published")
        ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))
        return
    work = scratch_dir(job)
    shutil.rmtree(work, ignore_errors=True)
    ctx.stage("preparing", attempt=job.attempt)
    teacher = resolve_model(settings.base_models.get(spec.base_model, spec.base_model), config.cache_dir)
    recipe = load_config(spec.recipe)
    limits = {"max_steps": spec.max_steps, "max_documents": spec.max_documents}
    train_config = dataclasses.replace(
        recipe, name=spec.name, model=str(teacher), seed=spec.seed, num_threads=settings.worker_threads,
        output_dir=str(work / "train"), progress_bar=False, **{k: v for k, v in limits.items() if v is not None},
    )  # fmt: skip
    result = run_training(ctx, train_config, cache_dir=config.cache_dir)
    ctx.check()

    ctx.stage("exporting")
    staging = work / "bundle"
    staging.mkdir(parents=True, exist_ok=True)
    with guarded("export", SCRATCH_VOLUME):
        encoder = Encoder.from_pretrained(result.best_dir)
        encoder.source = spec.base_model
        method = {"name": STUDENT_METHOD, "hyperparameters": {**train_config.to_dict(), "job": job.id}}
        trained_on = read_trained_on(result.best_dir)
        manifest = build_bundle(encoder, staging, spec.name, method=method, trained_on=trained_on)
        shutil.copytree(result.best_dir, staging / STUDENT_CHECKPOINT)
        shutil.copy2(result.output_dir / RECIPE_FILE, staging / STUDENT_CHECKPOINT / RECIPE_FILE)
    ctx.check()

    ctx.set_state(EVALUATING)
    with guarded("evaluation", CACHE_VOLUME):
        models = {"teacher": TorchModel(Encoder.from_pretrained(teacher)), "student": load_model(staging)}
        general = general_tasks(settings.general_tasks, trained_on)
        evaluation = score_models(ctx, config, models, None, general, general_roles=models)
    gate = {"passed": True, "gated": False, "reasons": [], "note": "a base student is published as built; its "
            "general scores against its teacher are reported, not gated"}  # fmt: skip
    ctx.result(JobResult(evaluation=Evaluation.model_validate(evaluation), gate=GateDecision.model_validate(gate)),
               event="evaluation")  # fmt: skip
    ctx.check()
    publish_stage(job, ctx, config, staging, manifest, evaluation, gate, promote=True)


def student_stage(
    spec: JobSpec,
    ctx: JobContext,
    config: AdaptConfig,
    base_teacher: Path,
    teacher: Path | None,
    documents: list[str],
    rule: CropRule,
    work: Path,
) -> StudentRun:
    """Make the adapted student from a copy of the base student: distil the adapted teacher into it when the plan
    has distillation steps (off by default), then run the job's own crop recipe on it for ``adapt_steps``, every
    layer trained, with the similarity rehearsal of general texts (`training.objectives.rehearsal`): a seeded sample
    of the base student's own training texts keeps the similarities the ``general_targets`` model — the base
    student itself by default — gives them, while the crops train the student on the customer's documents.
    ``teacher`` (the adapted teacher) is None when the plan does not use it.

    On IMDB (docs/BENCHMARKS.md, "Adapt: a compact student"): the crop step carries the student past the unadapted
    teacher in domain; the rehearsal of its own view keeps 0.4–0.5 more out of domain than the adapted teacher's
    at the same in-domain score; distilling first gained 0.4 in domain and lost 0.65 more out of domain: off unless
    asked.

    The distillation, when on, runs the recipe's objective on whole texts of two kinds: the customer's training
    documents (and a sentence of each; never the held-out ones), toward the adapted teacher's embeddings, and the
    general texts toward the embeddings of ``general_targets`` (`distillation_targets`)."""
    plan = spec.student
    if plan is None:
        raise ValueError("student_stage needs a job spec with a student")
    if plan.uses_adapted_teacher and teacher is None:
        raise ValueError("this student's plan learns from the adapted teacher: adapt it first")
    hp = spec.hyperparameters
    name = base_student_name(spec.base_model, plan.recipe)
    base = base_student_checkpoint(config.registry_dir, name)
    trained_on = read_trained_on(base)
    models = {BASE_STUDENT: base, BASE_TEACHER: base_teacher, **({ADAPTED_TEACHER: teacher} if teacher else {})}
    own = recipe_training_texts(base / RECIPE_FILE)
    general = random.Random(hp.seed).sample(own, min(plan.general_texts, len(own)))
    start = base
    if plan.distils:
        recipe = load_config(plan.recipe)
        with guarded("distillation", SCRATCH_VOLUME):
            targets = distillation_targets(ctx, config, plan, models, documents, general, recipe, hp.seed, work)
        train_config = TrainConfig(
            name=spec.name,
            model=str(base),
            teacher=str(teacher),
            max_seq_length=recipe.max_seq_length,
            objective=recipe.objective,
            objective_params=recipe.objective_params,
            views=recipe.views,
            text_sentences=0,  # the texts are already whole-text units
            teacher_vectors=str(targets.path) if targets.path else None,
            corpus=targets.texts,
            validation=None,
            max_steps=plan.max_steps,
            epochs=None,
            time_budget_s=plan.time_budget_s,
            batch_size=recipe.batch_size,
            lr=recipe.lr,
            warmup=recipe.warmup,
            grad_clip=recipe.grad_clip,
            seed=hp.seed,
            num_threads=config.settings.worker_threads,
            output_dir=str(work / "student"),
            progress_bar=False,
            log_every=10,
        )
        result = run_training(ctx, train_config, stage="distilling", done="distilled", reason="distillation")
        start = result.best_dir
        if not plan.adapt_steps:
            return StudentRun(name, start, base, trained_on)
        ctx.check()
    rehearsal: dict[str, Any] = {}
    if plan.rehearses and general:  # general is empty only when the base student's recipe had no texts
        rehearsal = {"rehearsal_weight": plan.rehearsal_weight, "rehearsal_texts": tuple(general),
                     "rehearsal_model": str(models[plan.general_targets]),
                     "rehearsal_temperature": plan.rehearsal_temperature,
                     "rehearsal_position_weight": plan.rehearsal_position_weight}  # fmt: skip
    adapt = crop_train_config(spec, start, documents, work / "student-adapt",
                         threads=config.settings.worker_threads).replace(
        lr=plan.adapt_lr, train_last_layers=None, max_steps=plan.adapt_steps, time_budget_s=plan.adapt_time_budget_s,
        **rehearsal,
    )  # fmt: skip
    rehearsed = StudentRehearsal(general_texts=len(general), reference=plan.general_targets,
                                 weight=plan.rehearsal_weight, temperature=plan.rehearsal_temperature,
                                 position_weight=plan.rehearsal_position_weight)  # fmt: skip
    ctx.result(JobResult(student_rehearsal=rehearsed if rehearsal else None), event="student_rehearsal")
    adapted = run_training(
        ctx, adapt, stage="adapting student", done="student adapted", reason="student_adaptation", crop_rule=rule
    )
    return StudentRun(name, adapted.best_dir, base, trained_on)


@dataclass(frozen=True)
class DistillationTargets:
    texts: tuple[str, ...]  # the customer's text units, then the general ones
    path: Path | None  # the general texts' targets (training.targets.write_vectors); None: the adapted teacher's


def distillation_targets(
    ctx: JobContext,
    config: AdaptConfig,
    plan: StudentPlan,
    models: Mapping[str, Path],
    documents: list[str],
    general: list[str],
    recipe: TrainConfig,
    seed: int,
    work: Path,
) -> DistillationTargets:
    """The distillation's texts (see `student_stage`: the customer's text units, then ``general``) and, when the
    general texts' targets come from a frozen model (``models`` by role: base_student, base_teacher), a file of
    those: that model embeds them once, longest first, and keeps its vectors in the cache's teacher-embedding store
    for the next job. Texts without a given target — the customer's, and with ``adapted_teacher`` every text — are
    embedded by the adapted teacher the first time a batch draws them, inside the distillation's time budget. What
    the targets are and how many texts a frozen model embedded (and its seconds) go to the job's result
    (``distillation_targets``)."""
    customer = text_units(documents, recipe.text_sentences, seed=seed)
    report: dict[str, Any] = {"customer_texts": len(customer), "general_texts": len(general),
                              "general_targets": plan.general_targets}  # fmt: skip
    path = None
    if general and plan.general_targets != ADAPTED_TEACHER:
        role = plan.general_targets
        ctx.stage("distilling", detail=f"the {role.replace('_', ' ')} embeds {len(general)} general texts")
        tick = time.perf_counter()
        model = cut_texts(Encoder.from_pretrained(models[role]), recipe.max_seq_length).eval()
        targets = TeacherTargets(model, config.cache_dir / TEACHER_EMBEDDINGS)
        embedded = targets.fill(general, batch_size=recipe.batch_size)
        targets.save()
        path = work / "general-targets.npz"
        write_vectors(path, targets.of(general))
        report[role] = {"embedded": embedded, "seconds": round(time.perf_counter() - tick, 2)}
    ctx.result(JobResult(distillation_targets=DistillationTargetsReport.model_validate(report)),
               event="distillation_targets")  # fmt: skip
    return DistillationTargets(tuple(customer) + tuple(general), path)


def evaluate_student(
    ctx: JobContext,
    config: AdaptConfig,
    spec: JobSpec,
    base_path: Path,
    adapted_teacher: Path | None,
    student: StudentRun,
    bundle: Path,
    held_out: CropPairRetrieval,
    knn: tuple[list[str], list[str] | None, int],
) -> dict[str, Any]:
    """Score the base teacher, the adapted teacher (when the job adapted it) and the base and adapted student (the
    ONNX bundle that will be served) on the held-out documents; the base teacher and both students also on the
    general tasks out-of-domain for the student (and on kNN when labels were given)."""
    with guarded("evaluation", CACHE_VOLUME):
        models: dict[str, EmbeddingModel] = {BASE_TEACHER: TorchModel(Encoder.from_pretrained(base_path))}
        if adapted_teacher is not None:
            models[ADAPTED_TEACHER] = TorchModel(Encoder.from_pretrained(adapted_teacher))
        models[BASE_STUDENT] = TorchModel(Encoder.from_pretrained(student.base_checkpoint))
        models[ADAPTED_STUDENT] = load_model(bundle)
        general = general_tasks(spec.hyperparameters.general_tasks, student.trained_on)
        roles = (BASE_TEACHER, BASE_STUDENT, ADAPTED_STUDENT)
        return score_models(ctx, config, models, held_out, general, general_roles=roles, knn=knn)


def student_gate(evaluation: Mapping[str, Any], *, margin: float) -> dict[str, Any]:
    """The adapted student against the base student (decides promotion) and against the base teacher (reported)."""

    def pair(scores: Mapping[str, Any] | None, base: str) -> dict[str, Any] | None:
        return None if scores is None else {"base": scores[base], "adapted": scores[ADAPTED_STUDENT]}

    def against(base: str) -> dict[str, Any]:
        return adapt_gate(
            pair(evaluation["in_domain"], base),
            pair(evaluation.get("general_tasks"), base),
            pair(evaluation.get("knn"), base),
            margin=margin,
        )

    decides, reported = against(BASE_STUDENT), against(BASE_TEACHER)
    return {
        **decides,
        "compared_with": {
            BASE_STUDENT: {**decides, "decides": True},
            BASE_TEACHER: {**reported, "decides": False},
        },
    }
