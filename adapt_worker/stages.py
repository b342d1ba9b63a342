"""What the stages of every kind of job share: the attempt's scratch folder, how an unexpected error becomes the
job's failure, training under the job's stop checks with its progress reported, and scoring models on the job's
held-out documents and the general offline suite (`score_models`). Used by `adapt_worker.pipeline` (the /adapt job) and
`adapt_worker.student` (a base student's build, and the distillation of an adapted model into it).
"""

from __future__ import annotations

import errno
import logging
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.jobs import Job, JobStoreError
from adapt_jobs.results import JobResult, Published, TrainingReport
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.spec import ADAPT_METHOD, OBJECTIVES, JobSpec
from adapt_worker.context import JobContext, JobFailed, JobStopped
from core.text import CropRule
from evaluation.data import is_in_domain
from evaluation.diagnostics import knn_accuracy
from evaluation.embedding_model import EmbeddingModel
from evaluation.suite import run_suite
from evaluation.tasks import CropPairRetrieval, resolve_task
from export.bundle import build_bundle, publish_bundle
from training.config import TrainConfig
from training.encoder import Encoder
from training.trainer import TrainResult, train

log = logging.getLogger(__name__)

MAX_KNN_DOCUMENTS = 400  # seeded sample of the labelled documents (encoded twice, full length)
SCRATCH_VOLUME = "the adapt scratch volume (EMBED_ADAPT_DIR)"
CACHE_VOLUME = "the cache volume (EMBED_CACHE_DIR)"
REGISTRY_VOLUME = "the model registry volume"


def scratch_dir(job: Job) -> Path:
    """This attempt's scratch (training output, the staged bundle): one per attempt, so a retry never meets a dead
    attempt's half-written files."""
    return Path(job.corpus_dir) / f"attempt-{job.attempt}"


def _os_problem(err: BaseException, where: str) -> str | None:
    """What an operating-system error means for the caller (a full or read-only volume), or None if it is not one."""
    if not isinstance(err, OSError):
        return None
    problems = {
        errno.ENOSPC: f"no space left on {where}",
        errno.EDQUOT: f"the disk quota of {where} is exhausted",
        errno.EFBIG: f"a file grew past the size limit of {where}",
        errno.EROFS: f"{where} is read-only",
        errno.EACCES: f"{where} is not writable by the adapt worker (permissions)",
        errno.EPERM: f"{where} is not writable by the adapt worker (permissions)",
    }
    return problems.get(err.errno or 0)


def stage_failure(reason: str, err: BaseException, where: str) -> JobFailed:
    """A stage's unexpected error as the job records it: what happened, for the caller; the traceback goes to the log
    (never a type name or internals into the job record)."""
    problem = _os_problem(err, where)
    if problem is None:
        log.error("%s stage failed", reason, exc_info=err)
        return JobFailed(reason, f"{reason} failed (internal error; the adapt worker's log has the details)")
    log.warning("%s stage failed: %s (%s)", reason, problem, err)
    return JobFailed(reason, f"{reason} failed: {problem}")


@dataclass
class _TrainingProgress:
    """Turns the trainer's records into the job's progress (stage, step, total, loss, eta)."""

    ctx: JobContext
    stage: str
    total: int | None
    loss: float | None = None

    def report(self, record: dict[str, Any]) -> None:
        if record.get("kind") != "train":
            return
        self.loss = record.get("loss", self.loss)
        progress = {"step": record.get("step"), "total": record.get("total") or self.total, "loss": self.loss}
        self.ctx.progress({"stage": self.stage, **progress, "eta_s": record.get("eta")})


def crop_train_config(spec: JobSpec, model: Path, documents: list[str], out: Path, *, threads: int) -> TrainConfig:
    """The job's crop recipe (``papers/000`` §2: two crops of a document, InfoNCE, the MSE anchor to the start model)
    on ``model`` with the job's hyperparameters (a student's adaptation `TrainConfig.replace`s its own budget)."""
    hp = spec.hyperparameters
    objective, views = OBJECTIVES[hp.objective]
    return TrainConfig(
        name=spec.name,
        model=str(model),
        max_seq_length=hp.max_seq_length,
        train_last_layers=hp.train_last_layers,
        anchor_weight=hp.anchor_weight,
        objective=objective,
        views=views,
        corpus=tuple(documents),
        validation=None,
        max_steps=hp.max_steps,
        epochs=None,
        time_budget_s=hp.time_budget_s,
        batch_size=min(hp.batch_size, max(2, len(documents))),
        lr=hp.lr,
        warmup=0.1,
        seed=hp.seed,
        num_threads=threads,
        output_dir=str(out),
        progress_bar=False,
        log_every=10,
    )


def run_training(
    ctx: JobContext,
    config: TrainConfig,
    *,
    stage: str = "training",
    done: str = "trained",
    reason: str = "training",
    crop_rule: CropRule | None = None,
    cache_dir: Path | None = None,
) -> TrainResult:
    """Train ``config`` as the job's ``stage``: progress reported, stopped by the job's stop checks, failures
    recorded under ``reason`` (also the key of its ``steps``/``seconds``/``stopped_by`` in the job's result), and the
    progress's stage ``done`` once it ended."""
    total = config.max_steps
    ctx.stage(stage, step=0, total=total, loss=None, eta_s=None)
    progress = _TrainingProgress(ctx, stage, total)
    try:
        result = train(
            config, progress=progress.report, should_stop=ctx.should_stop, crop_rule=crop_rule, cache_dir=cache_dir
        )
    except (ValueError, FloatingPointError) as err:  # ours: a setting that cannot train, a loss that diverged
        raise JobFailed(reason, f"{reason} failed: {err}") from err
    except Exception as err:
        raise stage_failure(reason, err, SCRATCH_VOLUME) from err
    if result.stopped_by == "cancelled":
        ctx.check()  # says why: cancelled, the worker stopping, or the lease lost
    ended = {"step": result.steps, "total": total or result.steps, "loss": progress.loss, "eta_s": 0}
    ctx.progress({"stage": done, **ended}, force=True)
    seconds = round(result.elapsed, 2)
    report = TrainingReport(steps=result.steps, seconds=seconds, stopped_by=result.stopped_by)
    ctx.result(JobResult.model_validate({reason: report}))
    return result


def export_stage(
    spec: JobSpec,
    job_id: str,
    trained: Path,
    rule: CropRule,
    work: Path,
    base_trained_on: Sequence[str],
    *,
    source: str | None = None,
) -> tuple[Path, dict[str, Any]]:
    """Export the trained checkpoint (the adapted model, or its student) to a complete, unpublished bundle in the
    job's scratch folder. Its manifest's ``trained_on`` is the base model's corpora plus ``adapt:<name>``, the
    customer's corpus (no suite task draws from it, so the adapted model's out-of-domain tasks are the base model's).
    ``source``: the model the checkpoint started from, when not the job's base model (a base student)."""
    # training capped crops at a short length for speed; the checkpoint keeps the base model's limit (trainer)
    encoder = Encoder.from_pretrained(trained)
    encoder.source = source or spec.base_model  # the manifest's base_model/source: what was adapted (or distilled into)
    params = spec.to_params()
    method = {
        "name": ADAPT_METHOD,
        "hyperparameters": {
            **params["hyperparameters"], "base_model": spec.base_model, "crop_rule": rule.describe(), "job": job_id,
            **({"student": params["student"]} if spec.student is not None else {}),
        },
    }  # fmt: skip
    staging = work / "bundle"
    staging.mkdir(parents=True, exist_ok=True)
    with guarded("export", SCRATCH_VOLUME):
        trained_on = [*base_trained_on, f"{ADAPT_METHOD}:{spec.name}"]
        return staging, build_bundle(encoder, staging, spec.name, method=method, trained_on=trained_on)


def publish_stage(
    job: Job,
    ctx: JobContext,
    config: AdaptConfig,
    staging: Path,
    manifest: dict[str, Any],
    evaluation: dict[str, Any],
    gate: dict[str, Any],
    *,
    promote: bool,
) -> Path:
    """Publish the staged bundle as the next version of its name, promoted when the gate passed and ``promote``;
    fenced by the lease (a worker that lost the job publishes nothing)."""
    ctx.stage("publishing")
    manifest["validation"] = {"job": job.id, "attempt": job.attempt, "evaluation": evaluation, "gate": gate}
    promoted = bool(gate["passed"]) and promote
    ctx.renew()  # the fence: publish only while this worker still holds the job
    try:
        bundle = publish_bundle(staging, config.registry_dir, manifest, promote=promoted)
    except OSError as err:
        raise stage_failure("publish", err, REGISTRY_VOLUME) from err
    ctx.result(JobResult(model=Published(name=manifest["name"], version=bundle.name, promoted=promoted)),
               event="published")  # fmt: skip
    if promoted:
        ctx.audit("promoted", version=bundle.name)
    ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))
    return bundle


def general_tasks(tasks: Sequence[str], base_trained_on: Sequence[str]) -> dict[str, list[str]]:
    """The gate's general tasks split by the base model's training corpora: ``out_of_domain`` are scored, and
    ``in_domain`` ones are left out — a task the base was trained on does not measure general quality."""
    split: dict[str, list[str]] = {"out_of_domain": [], "in_domain": []}
    for name in tasks:
        in_domain = is_in_domain(resolve_task(name, fast=True).source_corpus, base_trained_on)
        split["in_domain" if in_domain else "out_of_domain"].append(name)
    return split


def score_models(
    ctx: JobContext,
    config: AdaptConfig,
    models: Mapping[str, EmbeddingModel],
    in_domain_task: CropPairRetrieval | None,
    general: dict[str, list[str]],
    *,
    general_roles: Collection[str],
    knn: tuple[list[str], list[str] | None, int] | None = None,
) -> dict[str, Any]:
    """Score each model (by role: ``base``, ``adapted``, ``base_student``…) on the held-out in-domain task, the
    roles in ``general_roles`` also on the general tasks out-of-domain for them (their mean in points), and, when
    ``knn`` = (texts, labels, seed) has labels, those same roles on kNN accuracy: k = 10 cosine neighbours on up to
    400 labelled documents (the cropping paper's protocol, 000 §3.3.1: training never sees labels), averaged over
    five seeded 9:1 splits. Scores are points (× 100), rounded to 3 decimals."""
    out: dict[str, Any] = {"in_domain": {}, "general_in_domain": general["in_domain"]}
    if in_domain_task is not None:
        out["in_domain_task"] = "CropPairRetrieval (held-out documents, nDCG@10)"
    general_scores: dict[str, dict[str, float]] = {}
    for which, model in models.items():
        if in_domain_task is not None:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} in-domain")
            report = run_suite(model, [in_domain_task], progress=False)
            out["in_domain"][which] = round(report["scores"][in_domain_task.metadata.name], 3)
        if general["out_of_domain"] and which in general_roles:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} general suite")
            fast = config.settings.general_fast
            report = run_suite(model, general["out_of_domain"], fast=fast, progress=False, cache=config.cache_dir)
            if report["skipped"]:
                raise JobFailed("evaluation", f"general tasks could not run here: {report['skipped']}")
            general_scores[which] = {k: round(v, 3) for k, v in report["scores"].items()}
    if in_domain_task is not None:
        out["crops"] = dict(in_domain_task.crop_stats)
    else:
        del out["in_domain"]
    if general_scores:
        out["general_tasks"] = general_scores
        out["general"] = {w: round(sum(s.values()) / len(s), 3) for w, s in general_scores.items()}
    if knn is not None and knn[1] is not None:
        texts, labels, seed = knn
        ctx.check()
        ctx.stage("evaluating", detail="kNN accuracy")
        order = sorted(random.Random(seed).sample(range(len(texts)), min(len(texts), MAX_KNN_DOCUMENTS)))
        sample, sample_labels = [texts[i] for i in order], [labels[i] for i in order]
        out["knn"] = {
            w: round(_knn_points(m, sample, sample_labels), 3) for w, m in models.items() if w in general_roles
        }
        out["knn_documents"] = len(sample)
    return out


@contextmanager
def guarded(reason: str, where: str) -> Iterator[None]:
    """Turn an unexpected error inside the block into the job's failure (``reason``, naming ``where`` when a volume
    is full or read-only); how a job ends early, and the store's (lease) errors, pass through."""
    try:
        yield
    except (JobFailed, JobStopped, JobStoreError):
        raise
    except Exception as err:
        raise stage_failure(reason, err, where) from err


def _knn_points(model: EmbeddingModel, texts: list[str], labels: list[str]) -> float:
    n_train = round(0.9 * len(texts))
    k = max(1, min(10, n_train - 1))
    emb = model.encode(texts)
    return 100.0 * sum(knn_accuracy(emb, labels, k=k, seed=s) for s in range(5)) / 5
