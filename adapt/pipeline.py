"""One /adapt job as stages in order: split → train → export to staging → evaluate → gate → publish.

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

import errno
import logging
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt.context import JobContext, JobFailed, JobStopped
from adapt.corpus import read_job_corpus
from adapt.jobs import EVALUATING, Job, JobStoreError
from adapt.settings import AdaptConfig
from adapt.spec import ADAPT_METHOD, OBJECTIVES, JobSpec, SpecError
from core.catalog import resolve_model
from core.model_folder import read_trained_on
from core.text import CropRule, can_crop, choose_crop_rule, crop_yield, hold_out
from evaluation.data import is_in_domain
from evaluation.diagnostics import knn_accuracy
from evaluation.gate import IN_DOMAIN_TASK, adapt_gate
from evaluation.models import EmbeddingModel, load_model
from evaluation.suite import run_suite
from evaluation.tasks import CropPairRetrieval, resolve_task
from export.api import build_bundle, publish_bundle
from training.config import TrainConfig
from training.encoder import Encoder
from training.torch_model import TorchModel
from training.trainer import train

log = logging.getLogger(__name__)

# The yield below which a crop rule leaves too few documents to learn the domain from.
MIN_CROP_YIELD = 0.25


# How a job splits its corpus and samples it for kNN (per job, not per deployment: fixed here).
HELD_OUT_FRACTION, MIN_HELD_OUT, MAX_HELD_OUT = 0.2, 8, 200
MAX_KNN_DOCUMENTS = 400  # seeded sample of the labelled documents (encoded twice, full length)


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


@dataclass(frozen=True)
class Split:
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
) -> Split:
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
    return Split(
        train=[texts[i] for i in range(len(texts)) if i not in held_set],
        held_out=[texts[i] for i in held],
        held_out_indices=held,
    )


def run_job(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
    """Run every stage of one job, reporting through ``ctx``; raise `JobFailed` (or let ``ctx.check`` raise) to end
    it early. Publishing is fenced by the lease: a worker that lost the job publishes nothing."""
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

    trained = train_stage(spec, ctx, settings.worker_threads, base_path, split.train, rule, work)
    ctx.check()

    ctx.stage("exporting")
    base_trained_on = read_trained_on(base_path)  # none for a built-in base: its training data is unknown
    staging, manifest = export_stage(spec, job.id, trained, rule, work, base_trained_on)
    ctx.check()

    ctx.set_state(EVALUATING)
    evaluation = evaluate_stage(spec, ctx, config, base_path, staging, split, texts, labels, rule, base_trained_on)
    gate = adapt_gate(
        evaluation["in_domain"],
        evaluation.get("general_tasks"),
        evaluation.get("knn"),
        margin=spec.hyperparameters.gate_margin,
    )
    ctx.result({"evaluation": evaluation, "gate": gate}, event="evaluation")
    ctx.check()

    ctx.stage("publishing")
    manifest["validation"] = {"job": job.id, "attempt": job.attempt, "evaluation": evaluation, "gate": gate}
    promote = bool(gate["passed"]) and spec.promote == "auto"
    ctx.renew()  # the fence: publish only while this worker still holds the job
    try:
        bundle = publish_bundle(staging, config.registry_dir, manifest, promote=promote)
    except OSError as err:
        raise stage_failure("publish", err, "the model registry volume") from err
    ctx.result({"model": {"name": spec.name, "version": bundle.name, "promoted": promote}}, event="published")
    ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))


# ----------------------------------------------------------------------------- stages
def prepare(spec: JobSpec, ctx: JobContext, texts: list[str]) -> tuple[Split, CropRule]:
    """Split the corpus and choose the job's one crop rule; refuse a corpus too few documents of which crop."""
    split = split_corpus(texts, seed=spec.hyperparameters.seed)
    rule = choose_crop_rule(split.train)
    value = crop_yield(split.train, rule)
    usable = round(value * len(split.train))
    ctx.result(
        {
            "corpus": {
                "train_documents": len(split.train),
                "held_out_documents": len(split.held_out),
                "crop_rule": rule.describe(),
                "crop_yield": round(value, 4),
                "usable_train_documents": usable,
            }
        },
        event="corpus",
    )
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
    hp = spec.hyperparameters
    objective, views = OBJECTIVES[hp.objective]
    config = TrainConfig(
        name=spec.name,
        model=str(base_path),
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
        output_dir=str(work / "train"),
        progress_bar=False,
        log_every=10,
    )
    total = hp.max_steps
    ctx.stage("training", step=0, total=total, loss=None, eta_s=None)
    progress = _TrainingProgress(ctx, total)
    try:
        result = train(config, progress=progress.report, should_stop=ctx.should_stop, crop_rule=rule)
    except (ValueError, FloatingPointError) as err:  # ours: a setting that cannot train, a loss that diverged
        raise JobFailed("training", f"training failed: {err}") from err
    except Exception as err:
        raise stage_failure("training", err, "the adapt scratch volume (EMBED_ADAPT_DIR)") from err
    if result.stopped_by == "cancelled":
        ctx.check()  # says why: cancelled, the worker stopping, or the lease lost
    ctx.progress(
        {"stage": "trained", "step": result.steps, "total": total or result.steps, "loss": progress.loss, "eta_s": 0},
        force=True,
    )
    ctx.result(
        {"training": {"steps": result.steps, "seconds": round(result.elapsed, 2), "stopped_by": result.stopped_by}}
    )
    return result.best_dir


@dataclass
class _TrainingProgress:
    """Turns the trainer's records into the job's progress (step, total, loss, eta)."""

    ctx: JobContext
    total: int | None
    loss: float | None = None

    def report(self, record: dict[str, Any]) -> None:
        if record.get("kind") != "train":
            return
        self.loss = record.get("loss", self.loss)
        progress = {"step": record.get("step"), "total": record.get("total") or self.total, "loss": self.loss}
        self.ctx.progress({"stage": "training", **progress, "eta_s": record.get("eta")})


def export_stage(
    spec: JobSpec, job_id: str, trained: Path, rule: CropRule, work: Path, base_trained_on: Sequence[str]
) -> tuple[Path, dict[str, Any]]:
    """Export the trained checkpoint to a complete, unpublished bundle in the job's scratch folder. Its manifest's
    ``trained_on`` is the base model's corpora plus ``adapt:<name>``, the customer's corpus (no suite task draws
    from it, so the adapted model's out-of-domain tasks are the base model's)."""
    # training capped crops at a short length for speed; the checkpoint keeps the base model's limit (trainer)
    encoder = Encoder.from_pretrained(trained)
    encoder.source = spec.base_model  # the manifest's base_model/source name what was adapted
    method = {
        "name": ADAPT_METHOD,
        "hyperparameters": {
            **spec.to_params()["hyperparameters"], "base_model": spec.base_model, "crop_rule": rule.describe(),
            "job": job_id,
        },
    }  # fmt: skip
    staging = work / "bundle"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        trained_on = [*base_trained_on, f"{ADAPT_METHOD}:{spec.name}"]
        manifest = build_bundle(encoder, staging, spec.name, method=method, trained_on=trained_on)
    except Exception as err:
        raise stage_failure("export", err, "the adapt scratch volume (EMBED_ADAPT_DIR)") from err
    return staging, manifest


def evaluate_stage(
    spec: JobSpec,
    ctx: JobContext,
    config: AdaptConfig,
    base_path: Path,
    bundle: Path,
    split: Split,
    texts: list[str],
    labels: list[str] | None,
    rule: CropRule,
    base_trained_on: Sequence[str],
) -> dict[str, Any]:
    """Score base (torch, the checkpoint it came from) and adapted (the ONNX bundle that will be served).

    In-domain: `CropPairRetrieval` over the held-out documents, cropped with the job's rule (the same
    crops for both models). General: the spec's offline tasks that are out-of-domain for the base model
    (`evaluation.data.is_in_domain`; those it was trained on are listed in ``general_in_domain`` and not scored),
    their mean in points. kNN (labels given):
    accuracy of k = 10 cosine neighbours on up to 400 labelled documents (the cropping paper's protocol,
    000 §3.3.1: training never sees labels), averaged over five seeded 9:1 splits.
    """
    try:
        models: dict[str, EmbeddingModel] = {
            "base": TorchModel(Encoder.from_pretrained(base_path)),
            "adapted": load_model(bundle),
        }
        general = general_tasks(spec.hyperparameters.general_tasks, base_trained_on)
        return _evaluate(spec, ctx, config, models, split, texts, labels, rule, general)
    except (JobFailed, JobStopped, JobStoreError):  # how a job ends early, and the store's (lease) errors
        raise
    except Exception as err:
        raise stage_failure("evaluation", err, "the cache volume (EMBED_CACHE_DIR)") from err


def _evaluate(
    spec: JobSpec,
    ctx: JobContext,
    config: AdaptConfig,
    models: dict[str, EmbeddingModel],
    split: Split,
    texts: list[str],
    labels: list[str] | None,
    rule: CropRule,
    general: dict[str, list[str]],
) -> dict[str, Any]:
    hp = spec.hyperparameters
    in_domain_task = CropPairRetrieval.from_corpus(split.held_out, seed=hp.seed, name=IN_DOMAIN_TASK, rule=rule)
    out: dict[str, Any] = {
        "in_domain": {},
        "in_domain_task": "CropPairRetrieval (held-out documents, nDCG@10)",
        "general_in_domain": general["in_domain"],
    }
    general_scores: dict[str, dict[str, float]] = {}
    for which, model in models.items():
        ctx.check()
        ctx.stage("evaluating", detail=f"{which} in-domain")
        report = run_suite(model, [in_domain_task], progress=False)
        out["in_domain"][which] = round(report["scores"][in_domain_task.metadata.name], 3)
        if general["out_of_domain"]:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} general suite")
            fast = config.settings.general_fast
            report = run_suite(model, general["out_of_domain"], fast=fast, progress=False, cache=config.cache_dir)
            if report["skipped"]:
                raise JobFailed("evaluation", f"general tasks could not run here: {report['skipped']}")
            general_scores[which] = {k: round(v, 3) for k, v in report["scores"].items()}
    out["crops"] = dict(in_domain_task.crop_stats)
    if general_scores:
        out["general_tasks"] = general_scores
        out["general"] = {w: round(sum(s.values()) / len(s), 3) for w, s in general_scores.items()}
    if labels is not None:
        ctx.check()
        ctx.stage("evaluating", detail="kNN accuracy")
        order = sorted(random.Random(hp.seed).sample(range(len(texts)), min(len(texts), MAX_KNN_DOCUMENTS)))
        sample, sample_labels = [texts[i] for i in order], [labels[i] for i in order]
        out["knn"] = {which: round(_knn_points(m, sample, sample_labels), 3) for which, m in models.items()}
        out["knn_documents"] = len(sample)
    return out


def general_tasks(tasks: Sequence[str], base_trained_on: Sequence[str]) -> dict[str, list[str]]:
    """The gate's general tasks split by the base model's training corpora: ``out_of_domain`` are scored, and
    ``in_domain`` ones are left out — a task the base was trained on does not measure general quality."""
    split: dict[str, list[str]] = {"out_of_domain": [], "in_domain": []}
    for name in tasks:
        in_domain = is_in_domain(resolve_task(name, fast=True).source_corpus, base_trained_on)
        split["in_domain" if in_domain else "out_of_domain"].append(name)
    return split


def _knn_points(model: EmbeddingModel, texts: list[str], labels: list[str]) -> float:
    n_train = round(0.9 * len(texts))
    k = max(1, min(10, n_train - 1))
    emb = model.encode(texts)
    return 100.0 * sum(knn_accuracy(emb, labels, k=k, seed=s) for s in range(5)) / 5
