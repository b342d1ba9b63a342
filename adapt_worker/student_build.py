"""The stages of a ``student-build`` job: the student recipe (``sct-tiny``: layers [0, 5] of the teacher, SCT's
distillation with the MSE term, papers/001 §3.4; or ``distil-tiny``, ``distil-tiny-pca``) run once with its own
defaults against the base model, published and promoted in the registry as ``<base>--<recipe>`` (servable itself), its
bundle keeping the torch checkpoint (``checkpoint/``) every student job starts from (`adapt_worker.student`).

A base student is published as built: its general scores against its teacher are reported, not gated. It ends like
every job (`adapt_worker.release.record`, `adapt_worker.release.publish`).
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from adapt_jobs.jobs import EVALUATING
from adapt_jobs.results import Evaluation, GateDecision, JobResult, Published
from adapt_worker.attempt import BuildAttempt, Exported
from adapt_worker.scoring import general_tasks, score_models
from adapt_worker.stages import (
    CACHE_VOLUME,
    SCORED_VARIANT,
    SCRATCH_VOLUME,
    guarded,
    published_quantization,
    run_training,
)
from adapt_worker.student import STUDENT_CHECKPOINT
from core import registry as reg
from core.model_folder import RECIPE_FILE, read_trained_on
from evaluation.embedding_model import load_model
from export.bundle import build_bundle
from training.config import TrainConfig, load_config
from training.encoder import Encoder
from training.torch_model import TorchModel

STUDENT_METHOD = "student"  # manifest method.name of a base student


@dataclass(frozen=True)
class BuiltStudent:
    """The base student as trained: its best checkpoint, and the training's output folder (its recipe file)."""

    checkpoint: Path
    output_dir: Path


def build_config(attempt: BuildAttempt) -> TrainConfig:
    """The recipe with the job's limits, seed and scratch folder. Its steps decide when it ends, never the recipe's
    time cap: one base student serves every later job of this base model, so a busy or slow machine must build the
    same student, only later (a half-trained one, stopped by the clock, would be published and kept)."""
    spec = attempt.spec
    limits = {"max_steps": spec.max_steps, "max_documents": spec.max_documents}
    recipe = load_config(spec.recipe)
    if recipe.max_steps is None and recipe.epochs is None and not spec.max_steps:
        raise ValueError(f"the student recipe {spec.recipe!r} ends only by its time cap: give it max_steps")
    return dataclasses.replace(
        recipe, name=spec.name, model=str(attempt.teacher), seed=spec.seed, time_budget_s=None,
        num_threads=attempt.config.settings.worker_threads, output_dir=str(attempt.work / "train"),
        progress_bar=False, **{k: v for k, v in limits.items() if v is not None},
    )  # fmt: skip


def train_base_student(attempt: BuildAttempt) -> BuiltStudent | Published:
    """Train the recipe's student of the base model — or, when a promoted version already exists (whoever asked first
    built it), report that one and end the job."""
    spec, ctx = attempt.spec, attempt.ctx
    current = reg.current_version(attempt.config.registry_dir, spec.name)
    if current is not None:
        built = Published(name=spec.name, version=current, promoted=True, already_built=True)
        ctx.result(JobResult(model=built), event="published")
        ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))
        return built
    result = run_training(ctx, build_config(attempt), cache_dir=attempt.config.cache_dir)
    return BuiltStudent(result.best_dir, result.output_dir)


def export_base_student(attempt: BuildAttempt, built: BuiltStudent) -> Exported:
    """A bundle of the student that keeps its torch checkpoint and recipe (``checkpoint/``)."""
    spec = attempt.spec
    attempt.ctx.stage("exporting")
    staging = attempt.work / "bundle"
    staging.mkdir(parents=True, exist_ok=True)
    with guarded("export", SCRATCH_VOLUME):
        encoder = Encoder.from_pretrained(built.checkpoint)
        encoder.source = spec.base_model
        method = {"name": STUDENT_METHOD, "hyperparameters": {**build_config(attempt).to_dict(), "job": attempt.job.id}}
        trained_on = read_trained_on(built.checkpoint)
        build_bundle(encoder, staging, spec.name, quantize=published_quantization(attempt.config.settings),
                     method=method, trained_on=trained_on)  # fmt: skip
        shutil.copytree(built.checkpoint, staging / STUDENT_CHECKPOINT)
        shutil.copy2(built.output_dir / RECIPE_FILE, staging / STUDENT_CHECKPOINT / RECIPE_FILE)
    return Exported(staging)


def evaluate_base_student(attempt: BuildAttempt, built: BuiltStudent, exported: Exported) -> Evaluation:
    """The teacher (torch) and the student (the bundle that will be served) on the general tasks out-of-domain for
    the student."""
    attempt.ctx.set_state(EVALUATING)
    with guarded("evaluation", CACHE_VOLUME):
        models = {
            "teacher": TorchModel(Encoder.from_pretrained(attempt.teacher)),
            "student": load_model(exported.bundle, variant=SCORED_VARIANT),
        }
        general = general_tasks(attempt.config.settings.general_tasks, read_trained_on(built.checkpoint))
        return score_models(attempt, models, general=general, general_roles=models, cached=["teacher"])


def accept_as_built(attempt: BuildAttempt, evaluation: Evaluation) -> GateDecision:
    """A base student is published as built; its general scores against its teacher are reported, not gated."""
    note = "a base student is published as built; its general scores against its teacher are reported, not gated"
    return GateDecision(passed=True, gated=False, reasons=[], note=note)
