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
  ``student_rehearsal_position_weight``; so it keeps what it knew off the customer's domain: `make_student`). The job
  adapts the teacher first only when the student learns from it (`StudentPlan.uses_adapted_teacher`): its
  view rehearsed instead, or ``student_max_steps`` > 0, a distillation of the adapted teacher with the recipe's
  objective and whole-text views, on the customer's training documents plus those general texts (off by default: on IMDB
  both lost more out of domain than they gained in domain).

Both are stages of the job's pipeline (`adapt_worker.pipeline`): `adapt_teacher_first`, then `make_student`, which
hands the student to the stages every /adapt job ends with (`adapt_worker.release`). The gate decides on the adapted
student against the base student — the short pieces of the held-out documents must find the rest of them better,
and its retrieval of them must follow the base teacher's more closely (`evaluation.domain_checks.
retrieval_agreement`: a crop step can raise the pieces by learning the corpus's phrasing while the student retrieves
less like its better teacher, and worse on a real task), crop pairs and each general task may drop at most
``gate_margin`` points — and reports the same comparison against
the base teacher (never deciding: a 2-layer student is not expected to keep every point of a 6-layer teacher). The
base student's build is `adapt_worker.student_build`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from adapt_jobs.knobs import ADAPTED_TEACHER, BASE_STUDENT, BASE_TEACHER
from adapt_jobs.results import DistillationTargets as DistillationReport
from adapt_jobs.results import EmbeddedTargets, JobResult, StudentRehearsal, TeacherAdaptation
from adapt_jobs.spec import base_student_name
from adapt_worker.attempt import AdaptedTeacher, Attempt, Baseline, Trained
from adapt_worker.context import JobFailed
from adapt_worker.stages import SCRATCH_VOLUME, crop_train_config, guarded, run_training
from adapt_worker.teacher import adapt_teacher
from core import registry as reg
from core.model_folder import RECIPE_FILE, read_trained_on
from training.assembly import cut_texts
from training.config import TrainConfig, load_config
from training.data import text_units
from training.encoder import Encoder
from training.inputs import recipe_training_texts
from training.targets import TEACHER_EMBEDDINGS, TeacherTargets, write_vectors

STUDENT_CHECKPOINT = "checkpoint"  # the folder of a base student's bundle that keeps its torch checkpoint
ADAPTED_STUDENT = "adapted_student"  # with adapt_jobs.spec's three: the roles a student job scores


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


def adapt_teacher_first(attempt: Attempt) -> AdaptedTeacher:
    """Adapt the teacher (`adapt_worker.teacher.adapt_teacher`) only when the student learns from it
    (`StudentPlan.uses_adapted_teacher`); otherwise adapting it would only cost time (event ``teacher_adaptation``:
    skipped)."""
    plan = attempt.student
    if plan.uses_adapted_teacher:
        return AdaptedTeacher(adapt_teacher(attempt).checkpoint)
    why = "the student neither distils the adapted teacher nor rehearses its view (general_targets {})"
    skipped = TeacherAdaptation(skipped=True, why=why.format(plan.general_targets))
    attempt.ctx.result(JobResult(teacher_adaptation=skipped), event="teacher_adaptation")
    return AdaptedTeacher(None)


@dataclass(frozen=True)
class StudentStart:
    """The base student a job's student starts from, and the general texts it distils and rehearses."""

    name: str  # the base student's registry name (<base>--<recipe>)
    checkpoint: Path  # its torch checkpoint
    trained_on: tuple[str, ...]  # the corpora it was trained on
    general: list[str]  # a seeded sample of its own training texts
    models: Mapping[str, Path]  # by role: base_student, base_teacher and, when the job adapted it, adapted_teacher


def make_student(attempt: Attempt, teacher: AdaptedTeacher) -> Trained:
    """Make the adapted student from a copy of the base student: distil the adapted teacher into it when the plan
    has distillation steps (off by default), then run the job's own crop recipe on it for ``adapt_steps``, every
    layer trained, with the similarity rehearsal of general texts (`training.objectives.rehearsal`): a seeded sample
    of the base student's own training texts keeps the similarities the ``general_targets`` model — the base
    student itself by default — gives them, while the crops train the student on the customer's documents.
    ``teacher`` (the adapted teacher) has no checkpoint when the plan does not use it.

    On IMDB (docs/BENCHMARKS.md, "Adapt: a compact student"): the crop step carries the student past the unadapted
    teacher in domain; the rehearsal of its own view keeps 0.4–0.5 more out of domain than the adapted teacher's
    at the same in-domain score; distilling first gained 0.4 in domain and lost 0.65 more out of domain: off unless
    asked.

    The distillation, when on, runs the recipe's objective on whole texts of two kinds: the customer's training
    documents (and a sentence of each; never the held-out ones), toward the adapted teacher's embeddings, and the
    general texts toward the embeddings of ``general_targets`` (`distillation_targets`).

    The student is judged against the base student (deciding) and the base teacher (reported); the adapted teacher
    is scored in domain beside them."""
    plan = attempt.student
    if plan.uses_adapted_teacher and teacher.checkpoint is None:
        raise ValueError("this student's plan learns from the adapted teacher: adapt it first")
    start = student_start(attempt, teacher)
    checkpoint = start.checkpoint
    if plan.distils:
        checkpoint = distil(attempt, start)
        if plan.adapt_steps:
            attempt.ctx.check()
            checkpoint = crop_step(attempt, start, checkpoint)
    else:
        checkpoint = crop_step(attempt, start, checkpoint)
    adapted = () if teacher.checkpoint is None else (Baseline(ADAPTED_TEACHER, teacher.checkpoint, general=False),)
    return Trained(
        checkpoint=checkpoint,
        source=start.name,
        trained_on=start.trained_on,
        role=ADAPTED_STUDENT,
        baselines=(Baseline(BASE_TEACHER, attempt.base_path), *adapted, Baseline(BASE_STUDENT, start.checkpoint)),
        compared_with=(BASE_STUDENT, BASE_TEACHER),
        reference=BASE_TEACHER,
    )


def student_start(attempt: Attempt, teacher: AdaptedTeacher) -> StudentStart:
    """The promoted base student of the job's plan, and a seeded sample of its own training texts."""
    plan = attempt.student
    name = base_student_name(attempt.spec.base_model, plan.recipe)
    base = base_student_checkpoint(attempt.config.registry_dir, name)
    models = {BASE_STUDENT: base, BASE_TEACHER: attempt.base_path}
    if teacher.checkpoint is not None:
        models[ADAPTED_TEACHER] = teacher.checkpoint
    own = recipe_training_texts(base / RECIPE_FILE)
    general = random.Random(attempt.spec.hyperparameters.seed).sample(own, min(plan.general_texts, len(own)))
    return StudentStart(name, base, tuple(read_trained_on(base)), general, models)


def distil(attempt: Attempt, start: StudentStart) -> Path:
    """The distillation of the adapted teacher into the base student (the plan's ``max_steps``); its best checkpoint."""
    plan, hp = attempt.student, attempt.spec.hyperparameters
    recipe = load_config(plan.recipe)
    with guarded("distillation", SCRATCH_VOLUME):
        targets = distillation_targets(attempt, start)
    train_config = TrainConfig(
        name=attempt.spec.name,
        model=str(start.checkpoint),
        teacher=str(start.models[ADAPTED_TEACHER]),
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
        num_threads=attempt.config.settings.worker_threads,
        output_dir=str(attempt.work / "student"),
        progress_bar=False,
        log_every=10,
    )
    result = run_training(attempt.ctx, train_config, stage="distilling", done="distilled", reason="distillation")
    return result.best_dir


def crop_step(attempt: Attempt, start: StudentStart, checkpoint: Path) -> Path:
    """The job's crop recipe on the student (from ``checkpoint``), every layer trained, rehearsing the general texts
    when the plan does (event ``student_rehearsal``); its best checkpoint."""
    plan, ctx = attempt.student, attempt.ctx
    rehearsal: dict[str, object] = {}
    if plan.rehearses and start.general:  # empty only when the base student's recipe had no texts
        rehearsal = {"rehearsal_weight": plan.rehearsal_weight, "rehearsal_texts": tuple(start.general),
                     "rehearsal_model": str(start.models[plan.general_targets]),
                     "rehearsal_temperature": plan.rehearsal_temperature,
                     "rehearsal_position_weight": plan.rehearsal_position_weight}  # fmt: skip
    adapt = crop_train_config(attempt.spec, checkpoint, attempt.split.train, attempt.work / "student-adapt",
                              threads=attempt.config.settings.worker_threads).replace(
        lr=plan.adapt_lr, train_last_layers=None, max_steps=plan.adapt_steps, time_budget_s=plan.adapt_time_budget_s,
        **rehearsal,
    )  # fmt: skip
    rehearsed = StudentRehearsal(general_texts=len(start.general), reference=plan.general_targets,
                                 weight=plan.rehearsal_weight, temperature=plan.rehearsal_temperature,
                                 position_weight=plan.rehearsal_position_weight)  # fmt: skip
    ctx.result(JobResult(student_rehearsal=rehearsed if rehearsal else None), event="student_rehearsal")
    adapted = run_training(ctx, adapt, stage="adapting student", done="student adapted", reason="student_adaptation",
                           crop_rule=attempt.rule)  # fmt: skip
    return adapted.best_dir


@dataclass(frozen=True)
class DistillationTargets:
    texts: tuple[str, ...]  # the customer's text units, then the general ones
    path: Path | None  # the general texts' targets (training.targets.write_vectors); None: the adapted teacher's


def distillation_targets(attempt: Attempt, start: StudentStart) -> DistillationTargets:
    """The distillation's texts (see `make_student`: the customer's text units, then the general ones) and, when the
    general texts' targets come from a frozen model (``start.models`` by role: base_student, base_teacher), a file of
    those: that model embeds them once, longest first, and keeps its vectors in the cache's teacher-embedding store
    for the next job. Texts without a given target — the customer's, and with ``adapted_teacher`` every text — are
    embedded by the adapted teacher the first time a batch draws them, inside the distillation's time budget. What
    the targets are and how many texts a frozen model embedded (and its seconds) go to the job's result
    (``distillation_targets``)."""
    plan, ctx, general = attempt.student, attempt.ctx, start.general
    recipe = load_config(plan.recipe)
    customer = text_units(attempt.split.train, recipe.text_sentences, seed=attempt.spec.hyperparameters.seed)
    embedded: dict[str, EmbeddedTargets] = {}
    path = None
    if general and plan.general_targets != ADAPTED_TEACHER:
        role = plan.general_targets
        ctx.stage("distilling", detail=f"the {role.replace('_', ' ')} embeds {len(general)} general texts")
        tick = time.perf_counter()
        model = cut_texts(Encoder.from_pretrained(start.models[role]), recipe.max_seq_length).eval()
        targets = TeacherTargets(model, attempt.config.cache_dir / TEACHER_EMBEDDINGS)
        count = targets.fill(general, batch_size=recipe.batch_size)
        targets.save()
        path = attempt.work / "general-targets.npz"
        write_vectors(path, targets.of(general))
        embedded[role] = EmbeddedTargets(embedded=count, seconds=round(time.perf_counter() - tick, 2))
    report = DistillationReport(customer_texts=len(customer), general_texts=len(general),
                                general_targets=plan.general_targets, **embedded)  # fmt: skip
    ctx.result(JobResult(distillation_targets=report), event="distillation_targets")
    return DistillationTargets(tuple(customer) + tuple(general), path)
