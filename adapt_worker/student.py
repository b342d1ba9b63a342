"""Compact students for /adapt: a job that asks for ``"student": "<recipe>"`` publishes a 2-layer model for the
customer's corpus instead of the adapted teacher — what no embedding server offers.

Two kinds of work, two kinds of job:

* **The base student, built once** (job kind ``student-build``): the student recipe (``sct-tiny``: layers [0, 5] of
  the teacher, SCT's distillation with the MSE term, papers/001 §3.4; or ``distil-tiny``, ``distil-tiny-pca``) run
  with its own defaults against the base model, published and promoted in the registry as
  ``<base>--<recipe>`` (``minilm-l6--sct-tiny``: servable itself), its bundle keeping the torch checkpoint
  (``checkpoint/``) every student job starts from. The service queues it the first time a job asks for that
  student, as a job of its own; the asking job waits for it (`adapt_jobs.store.JobStore.create`, ``after_job``).
* **The adapted student** (inside the /adapt job): a copy of the base student that learns the base teacher's
  embeddings of the customer's training texts — whole documents, a sentence of each, their short pieces, every
  sentence and seeded word runs, text shaped like the customer's queries — and of a seeded sample of its own general
  training texts (``student_max_steps``, ``student_distil_spans``, ``student_general_texts``; `make_student`). The
  teacher is 6-18 points better than the base student on the real tasks of unseen domains before any adaptation;
  learning its view of the customer's texts is what carries the student toward it, where crop pairs on the student
  raised the crop check and lowered the real task on one domain of three (docs/BENCHMARKS.md). A crop step on the
  student can follow (``student_adapt_steps``, off by default), and the teacher is adapted first only when the
  student learns from it (`StudentPlan.uses_adapted_teacher`: ``student_distil_teacher`` or
  ``student_general_targets`` ``adapted_teacher``).

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

import torch

from adapt_jobs.knobs import ADAPTED_TEACHER, BASE_STUDENT, BASE_TEACHER
from adapt_jobs.results import DistillationTargets as DistillationReport
from adapt_jobs.results import EmbeddedTargets, JobResult, PulledPieces, StudentRehearsal, TeacherAdaptation
from adapt_jobs.spec import base_student_name
from adapt_worker.attempt import AdaptedTeacher, Attempt, Baseline, Trained
from adapt_worker.context import JobFailed
from adapt_worker.stages import SCRATCH_VOLUME, crop_train_config, guarded, run_training
from adapt_worker.teacher import adapt_teacher
from core import registry as reg
from core.model_folder import RECIPE_FILE, read_trained_on
from training.assembly import cut_texts
from training.config import TrainConfig, load_config
from training.data import query_unit_sources, shared_pieces, text_units
from training.encoder import Encoder
from training.inputs import recipe_training_texts
from training.targets import TEACHER_EMBEDDINGS, TeacherTargets, pulled_targets, write_vectors

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
    why = (
        "the student learns neither the adapted teacher's embeddings nor its view (distil_teacher {}, "
        "general_targets {})"
    )
    skipped = TeacherAdaptation(skipped=True, why=why.format(plan.distil_teacher, plan.general_targets))
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
    recipe: TrainConfig  # the base student's recipe: the distillation's objective, views and optimiser settings


def make_student(attempt: Attempt, teacher: AdaptedTeacher) -> Trained:
    """Make the adapted student from a copy of the base student: distil the plan's ``distil_teacher`` into it
    (`distil`; the default), then, when the plan has ``adapt_steps`` (off by default), run the job's own crop recipe on
    it, every layer trained, with the similarity rehearsal of general texts (`training.objectives.rehearsal`).
    ``teacher`` (the adapted teacher) has no checkpoint when the plan does not use it.

    The distillation runs the recipe's objective (SCT + MSE, papers/001 §3.4) on whole texts of two kinds: the
    customer's training texts (never the held-out documents) toward the distillation teacher's embeddings — each
    document, a sentence of it and, with ``distil_spans``, its short pieces, every sentence and word runs
    (`training.data.query_units`) — and the general texts toward the ``general_targets`` model's
    (`distillation_targets`). On three unseen domains (CWE, SPDX licences, drug reviews; docs/BENCHMARKS.md) it raised
    the domain's real task (a name finding its document, or kNN of reviews) on each seed, out of domain within a
    point of the base student, where the crop step alone lost 3.3 points on CWE.

    The student is judged against the base student (deciding) and the base teacher (reported); the adapted teacher,
    when there is one, is scored in domain beside them."""
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
    """The promoted base student of the job's plan, its recipe, and a seeded sample of its own training texts."""
    plan = attempt.student
    name = base_student_name(attempt.spec.base_model, plan.recipe)
    base = base_student_checkpoint(attempt.config.registry_dir, name)
    models = {BASE_STUDENT: base, BASE_TEACHER: attempt.base_path}
    if teacher.checkpoint is not None:
        models[ADAPTED_TEACHER] = teacher.checkpoint
    trained_on = tuple(read_trained_on(base))
    own = recipe_training_texts(base / RECIPE_FILE)
    general = random.Random(attempt.spec.hyperparameters.seed).sample(own, min(plan.general_texts, len(own)))
    return StudentStart(name, base, trained_on, general, models, load_config(plan.recipe))


def distil(attempt: Attempt, start: StudentStart) -> Path:
    """The distillation of the plan's ``distil_teacher`` into the base student (``max_steps``, ``time_budget_s``); its
    best checkpoint."""
    with guarded("distillation", SCRATCH_VOLUME):
        targets = distillation_targets(attempt, start)
    train_config = distillation_config(attempt, start, targets)
    result = run_training(attempt.ctx, train_config, stage="distilling", done="distilled", reason="distillation")
    return result.best_dir


def distillation_config(attempt: Attempt, start: StudentStart, targets: DistillationTargets) -> TrainConfig:
    """The distillation's run: the student recipe's objective, views, token limit and schedule on ``targets``, at the
    plan's ``distil_lr`` (0: the recipe's), steps and time budget (less what the targets took up front)."""
    plan, hp, recipe = attempt.student, attempt.spec.hyperparameters, start.recipe
    return TrainConfig(
        name=attempt.spec.name,
        model=str(start.checkpoint),
        teacher=str(start.models[plan.distil_teacher]),
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
        # the pieces' targets were computed before the clock, where the teacher would have embedded them as drawn
        time_budget_s=None if plan.time_budget_s is None else max(plan.time_budget_s - targets.seconds_in_budget, 1.0),
        batch_size=recipe.batch_size,
        lr=plan.distil_lr or recipe.lr,
        warmup=recipe.warmup,
        grad_clip=recipe.grad_clip,
        seed=hp.seed,
        num_threads=attempt.config.settings.worker_threads,
        output_dir=str(attempt.work / "student"),
        progress_bar=False,
        log_every=10,
    )


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
    path: Path | None  # targets given up front (training.targets.write_vectors); None: the distil teacher's, as drawn
    seconds_in_budget: float = 0.0  # spent on targets the distil teacher would otherwise have computed in its budget


def distillation_targets(attempt: Attempt, start: StudentStart) -> DistillationTargets:
    """The distillation's texts (see `make_student`: the customer's text units and, with ``distil_spans``, the
    query-shaped pieces of the training documents, then the general texts) and, when the general texts' targets come
    from another model than the distillation's teacher (``general_targets``, by role in ``start.models``), a file of
    those: that model embeds them once before the clock starts, longest first, and a base model keeps its vectors in
    the cache's teacher-embedding store for the next job. With ``distil_pull`` the distillation's teacher embeds the
    training documents and their pieces up front, each piece's target turned toward its document's
    (`training.targets.pulled_targets`) unless another training document holds its words too
    (`training.data.shared_pieces`: such a piece keeps the teacher's embedding), and those seconds come out of the
    distillation's time budget, where the teacher would have spent them as the texts were drawn. Texts without a
    given target are embedded by the distillation's teacher the first time a batch draws them, inside the
    distillation's time budget. What the targets are and how many texts a frozen model embedded (and its seconds) go
    to the job's result (``distillation_targets``)."""
    plan, ctx, general = attempt.student, attempt.ctx, start.general
    recipe, seed, documents = start.recipe, attempt.spec.hyperparameters.seed, attempt.split.train
    customer = text_units(documents, recipe.text_sentences, seed=seed)
    pieces = query_unit_sources(documents, plan.distil_spans, seed=seed) if plan.distil_spans else []
    customer += [text for text, _source in pieces]
    embedded: dict[str, EmbeddedTargets] = {}
    vectors: dict[str, torch.Tensor] = {}
    if general and plan.general_targets != plan.distil_teacher:
        role = plan.general_targets
        ctx.stage("distilling", detail=f"the {role.replace('_', ' ')} embeds {len(general)} general texts")
        tick = time.perf_counter()
        # no later job meets this job's own adapted teacher again: its vectors are not stored
        store = None if role == ADAPTED_TEACHER else attempt.config.cache_dir / TEACHER_EMBEDDINGS
        targets = TeacherTargets(_frozen(start.models[role], recipe), store)
        count = targets.fill(general, batch_size=recipe.batch_size)
        targets.save()
        vectors.update(targets.of(general))
        embedded[role] = EmbeddedTargets(embedded=count, seconds=round(time.perf_counter() - tick, 2))
    pulled = None
    if pieces and plan.distil_pull > 0:
        ctx.stage("distilling", detail=f"the {plan.distil_teacher.replace('_', ' ')} embeds {len(documents)} "
                  f"documents and {len(pieces)} pieces of them")  # fmt: skip
        tick = time.perf_counter()
        shared = shared_pieces(documents, pieces)
        teacher = TeacherTargets(_frozen(start.models[plan.distil_teacher], recipe))  # the customer's: never stored
        vectors.update(pulled_targets(teacher, documents, pieces, plan.distil_pull, shared=shared,
                                      batch_size=recipe.batch_size))  # fmt: skip
        unturned = sum(text in shared for text, _source in pieces)
        pulled = PulledPieces(pieces=len(pieces) - unturned, shared=unturned, weight=plan.distil_pull,
                              seconds=round(time.perf_counter() - tick, 2))  # fmt: skip
    path = None
    if vectors:
        path = attempt.work / "distillation-targets.npz"
        write_vectors(path, vectors)
    report = DistillationReport(customer_texts=len(customer), general_texts=len(general),
                                general_targets=plan.general_targets, distil_teacher=plan.distil_teacher,
                                pulled_pieces=pulled, **embedded)  # fmt: skip
    ctx.result(JobResult(distillation_targets=report), event="distillation_targets")
    return DistillationTargets(tuple(customer) + tuple(general), path, pulled.seconds if pulled else 0.0)


def _frozen(model: Path, recipe: TrainConfig) -> Encoder:
    """``model`` as a frozen target model at the recipe's token limit."""
    return cut_texts(Encoder.from_pretrained(model), recipe.max_seq_length).eval()
