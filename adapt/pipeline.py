"""One /adapt job: corpus → seeded train/held-out split → crop fine-tune → export → gate → publish → promote.

The recipe is the cropping paper's in-domain fine-tuning (``papers/000`` §2 and §3.2.3, Figure 1):
two views of a document are two crops of consecutive sentences, the loss is InfoNCE with τ = 0.05,
lr 2e-5 with warm-up, and most of the gain arrives within ~100 batches — so a job trains for a few
dozen steps, not epochs. The crop rule is chosen from the corpus (`training.views.choose_crop_rule`):
the paper's 100–250-character sentence filter was tuned on abstracts and leaves most short technical
documents without two crops, so the rule relaxes lengths and falls back to halves; its yield is
reported in the job.

Speed comes by design (the issue's measured 694 s for 100 full steps at batch 32 on one thread is
too slow for a 5-minute job): only the last ``train_last_layers`` layers are trained (§4.4 of the
paper fine-tunes the last 2), crops are short (``max_seq_length`` 64 for training only — the
published bundle keeps the base model's limit), both cores are used, and the step count is small.
Evaluation is never skipped; the base model's general-suite scores are cached per base model,
since they do not change between jobs.

Gate (two-sided, base vs adapted, `evaluation.gate.check`): held-out ``CropPairRetrieval`` must
improve; each task of the general offline suite — and kNN accuracy when labels were given — may
drop at most ``gate_margin`` points. The adapted model is always published as a new version of ``name``; it is
promoted (made servable) only when the gate passes and the job says ``promote=auto``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.adapt.corpus import can_crop, load_corpus
from service.adapt.store import EVALUATING, Job

if TYPE_CHECKING:
    from adapt.worker import JobContext

log = logging.getLogger(__name__)

ADAPT_METHOD = "adapt"  # manifest method.name; the API lets /adapt publish new versions only of such models
# /adapt objective → (training objective, views): SimCSE is InfoNCE on dropout views (paper 000 §2).
OBJECTIVES = {"crop-infonce": ("infonce", "crop"), "sct": ("sct", "crop"), "simcse": ("simcse", "dropout")}
# The yield below which a crop rule leaves too few documents to learn the domain from.
MIN_CROP_YIELD = 0.25
IN_DOMAIN_TASK = "CropPairRetrieval-heldout"
KNN_TASK = "kNN-accuracy-labels"


class JobCancelled(Exception):
    """The job was cancelled, or the worker was told to stop, while it ran."""


class JobFailed(Exception):
    """A job failure with a reason the client sees (``corpus``, ``training``, ``export``, ``evaluation``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class WorkerOptions:
    registry_dir: Path
    threads: int = 2
    gate_margin: float = 2.0
    keep_uploads: bool = False
    base_models: dict[str, str] = field(default_factory=dict)
    held_out_fraction: float = 0.2
    min_held_out: int = 8
    max_held_out: int = 200
    train_max_seq_length: int = 64
    # The gate's "general" side: offline tasks unrelated to the customer's corpus (evaluation.tasks).
    # ACLSumRetrieval (1,000 long abstracts) is left out by default: it tripled the evaluation time of a job.
    general_tasks: tuple[str, ...] = ("LeeDocSTS", "CropPairRetrieval-LeeBackground")
    max_knn_documents: int = 400  # seeded sample of the labelled documents (encoded twice, full length)
    general_fast: bool = False  # a few documents per task: for tests only (scores not comparable)


@dataclass(frozen=True)
class Split:
    train: list[str]
    held_out: list[str]
    held_out_indices: list[int]


def split_corpus(
    texts: Sequence[str],
    *,
    seed: int,
    fraction: float = 0.2,
    min_held_out: int = 8,
    max_held_out: int = 200,
    usable: Callable[[str], bool] = can_crop,
) -> Split:
    """Hold out a seeded sample of crop-able documents for evaluation; train on the rest.

    Held-out documents are drawn only from documents that yield two crops (``CropPairRetrieval``
    needs a query and a positive from each), and never appear in training.
    """
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    candidates = [i for i in order if usable(texts[i])]
    n_held = min(max_held_out, max(min_held_out, round(fraction * len(candidates))))
    if len(candidates) - n_held < n_held:
        raise JobFailed(
            "corpus",
            f"only {len(candidates)} documents yield two crops: need at least {2 * min_held_out} "
            f"(half to train on, half to evaluate with); send more multi-sentence documents",
        )
    held = sorted(candidates[:n_held])
    held_set = set(held)
    return Split(
        train=[texts[i] for i in range(len(texts)) if i not in held_set],
        held_out=[texts[i] for i in held],
        held_out_indices=held,
    )


def gate_decision(
    in_domain: dict[str, float],
    general_tasks: dict[str, dict[str, float]] | None,
    knn: dict[str, float] | None,
    *,
    margin: float,
) -> dict[str, Any]:
    """The two-sided rollout gate on base vs adapted scores, in points (`evaluation.gate.check`).

    ``in_domain`` and ``knn`` hold ``{"base": x, "adapted": y}``; ``general_tasks`` holds
    ``{"base": {task: x}, "adapted": {task: y}}``. The held-out crop task must improve strictly; every
    other score (each general task, and kNN accuracy when labels were given) may drop at most
    ``margin`` points.
    """
    from evaluation.gate import check

    candidate = {IN_DOMAIN_TASK: in_domain["adapted"]}
    baseline = {IN_DOMAIN_TASK: in_domain["base"]}
    if general_tasks is not None:
        candidate.update(general_tasks["adapted"])
        baseline.update(general_tasks["base"])
    if knn is not None:
        candidate[KNN_TASK] = knn["adapted"]
        baseline[KNN_TASK] = knn["base"]
    result = check(candidate, baseline, max_drop=margin, must_improve=[IN_DOMAIN_TASK])
    return {"passed": result.passed, "margin": margin, "reasons": result.failures, "table": result.table}


def _base_path(name: str, options: WorkerOptions) -> Path:
    from core.catalog import resolve_model

    return resolve_model(options.base_models.get(name, name))


def run_job(job: Job, ctx: JobContext, options: WorkerOptions) -> None:
    """Run every stage of one job, reporting through ``ctx``; raise `JobFailed`/`JobCancelled` to end it."""
    params, hp = job.params, job.params["hyperparameters"]
    work = Path(job.corpus_dir) / "work"
    texts, labels = load_corpus(Path(job.corpus_dir))

    ctx.stage("preparing")
    base_path = _base_path(params["base_model"], options)
    split = split_corpus(
        texts,
        seed=hp["seed"],
        fraction=options.held_out_fraction,
        min_held_out=options.min_held_out,
        max_held_out=options.max_held_out,
    )
    crop = _crop_rule(split.train)
    ctx.result(
        {
            "corpus": {
                "train_documents": len(split.train),
                "held_out_documents": len(split.held_out),
                "crop_rule": crop["rule"],
                "crop_yield": crop["yield"],
                "usable_train_documents": crop["usable"],
            }
        },
        event="corpus",
    )
    if crop["yield"] < MIN_CROP_YIELD:
        raise JobFailed(
            "corpus",
            f"only {crop['usable']} of {len(split.train)} training documents ({crop['yield']:.0%}) yield two crops "
            f"even with the most permissive rule ({crop['rule']}): send longer, multi-sentence documents",
        )
    ctx.check()

    trained = _train(job, ctx, options, base_path, split.train, crop, work)
    ctx.check()

    version, promoted = _export_and_publish(job, ctx, options, base_path, trained, split, texts, labels, crop)
    ctx.result({"model": {"name": params["name"], "version": version, "promoted": promoted}}, event="published")
    ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))


# ----------------------------------------------------------------------------- stages
def _crop_rule(documents: Sequence[str]) -> dict[str, Any]:
    from training import views

    rule = views.choose_crop_rule(documents)
    value = views.crop_yield(documents, rule)
    return {
        "rule_object": rule,
        "rule": rule.describe(),
        "yield": round(value, 4),
        "usable": round(value * len(documents)),
    }


def _train(
    job: Job,
    ctx: JobContext,
    options: WorkerOptions,
    base_path: Path,
    documents: list[str],
    crop: dict[str, Any],
    work: Path,
) -> Path:
    from training.config import TrainConfig
    from training.trainer import train

    hp = job.params["hyperparameters"]
    objective, views = OBJECTIVES[hp["objective"]]
    config = TrainConfig(
        name=job.id,
        model=str(base_path),
        max_seq_length=hp.get("max_seq_length") or options.train_max_seq_length,
        train_last_layers=hp["train_last_layers"],
        objective=objective,
        views=views,
        corpus=tuple(documents),
        crop_rule="auto",  # the trainer picks the rule from the corpus, as _crop_rule reported it
        validation=None,
        max_steps=hp["max_steps"],
        epochs=None,
        time_budget_s=hp["time_budget_s"],
        batch_size=min(hp["batch_size"], max(2, len(documents))),
        lr=hp["lr"],
        warmup=0.1,
        seed=hp["seed"],
        num_threads=options.threads,
        output_dir=str(work / "train"),
        progress_bar=False,
        log_every=10,
    )
    total = hp["max_steps"]
    ctx.stage("training", step=0, total=total, loss=None, eta_s=None)

    last: dict[str, Any] = {}

    def on_progress(record: dict[str, Any]) -> None:
        if record.get("kind") != "train":
            return
        last.update(record)
        ctx.progress(
            {
                "stage": "training",
                "step": record.get("step"),
                "total": record.get("total") or total,
                "loss": record.get("loss"),
                "eta_s": record.get("eta"),
            }
        )

    try:
        result = train(config, progress=on_progress, should_stop=ctx.should_stop)
    except (ValueError, FloatingPointError, RuntimeError) as err:
        raise JobFailed("training", f"training failed: {err}") from err
    if result.stopped_by == "cancelled":
        raise JobCancelled("cancelled during training")
    ctx.progress(
        {
            "stage": "trained",
            "step": result.steps,
            "total": total or result.steps,
            "loss": last.get("loss"),
            "eta_s": 0,
        },
        force=True,
    )
    ctx.result(
        {"training": {"steps": result.steps, "seconds": round(result.elapsed, 2), "stopped_by": result.stopped_by}}
    )
    return result.best_dir


def _export_and_publish(
    job: Job,
    ctx: JobContext,
    options: WorkerOptions,
    base_path: Path,
    trained: Path,
    split: Split,
    texts: list[str],
    labels: list[str] | None,
    crop: dict[str, Any],
) -> tuple[str, bool]:
    """Export the trained model; evaluate the finished bundle before it is published; promote if it passed.

    Evaluation runs as export's ``validate`` hook, on the complete bundle in export's staging folder:
    a cancel or failure there publishes nothing, and the published manifest's ``validation`` holds
    the evaluation and the gate.
    """
    from core import registry
    from export.api import export_bundle
    from training.encoder import Encoder

    params, hp = job.params, job.params["hyperparameters"]
    ctx.stage("exporting")
    # training capped crops at a short length for speed; the checkpoint keeps the base model's limit (trainer)
    encoder = Encoder.from_pretrained(trained)
    encoder.source = params["base_model"]  # the manifest's base_model/source name what was adapted
    verdict: dict[str, Any] = {}

    def validate(bundle: Path) -> dict[str, Any]:
        ctx.check()
        ctx.set_state(EVALUATING)
        try:
            evaluation = _evaluate(job, ctx, options, base_path, bundle, split, texts, labels)
        except (JobCancelled, JobFailed):
            raise
        except Exception as err:
            log.exception("%s: evaluation failed", job.id)
            raise JobFailed("evaluation", f"evaluation failed: {type(err).__name__}: {err}") from err
        gate = gate_decision(
            evaluation["in_domain"], evaluation.get("general_tasks"), evaluation.get("knn"), margin=hp["gate_margin"]
        )
        ctx.result({"evaluation": evaluation, "gate": gate}, event="evaluation")
        ctx.check()
        ctx.stage("publishing")
        verdict["gate"] = gate
        return {"job": job.id, "evaluation": evaluation, "gate": gate}

    method = {
        "name": ADAPT_METHOD,
        "hyperparameters": {**hp, "base_model": params["base_model"], "crop_rule": crop["rule"], "job": job.id},
    }
    try:
        bundle = export_bundle(encoder, options.registry_dir, params["name"], method=method, validate=validate)
    except (JobCancelled, JobFailed):
        raise
    except Exception as err:
        log.exception("%s: export failed", job.id)
        raise JobFailed("export", f"export failed: {type(err).__name__}: {err}") from err
    promoted = bool(verdict["gate"]["passed"]) and params["promote"] == "auto"
    if promoted:
        registry.promote(options.registry_dir, params["name"], bundle.name)
    return bundle.name, promoted


def _evaluate(
    job: Job,
    ctx: JobContext,
    options: WorkerOptions,
    base_path: Path,
    bundle: Path,
    split: Split,
    texts: list[str],
    labels: list[str] | None,
) -> dict[str, Any]:
    """Score base (torch, the checkpoint it came from) and adapted (the ONNX bundle that will be served).

    In-domain: `CropPairRetrieval` over the held-out documents (the same crops for both models).
    General: the configured offline tasks (their mean, in points); the base model's results are
    cached by its content hash, so only the first job per base model pays for them. kNN (labels
    given): accuracy of k = 10 cosine neighbours on up to 400 labelled documents (the cropping paper's
    protocol, 000 §3.3.1: training never sees labels), averaged over five seeded 9:1 splits.
    """
    from evaluation.models import load_model
    from evaluation.suite import run_suite
    from evaluation.tasks import CropPairRetrieval

    seed = job.params["hyperparameters"]["seed"]
    models = {"base": load_model(str(base_path)), "adapted": load_model(str(bundle))}
    in_domain_task = CropPairRetrieval.from_corpus(split.held_out, seed=seed, name=IN_DOMAIN_TASK)
    out: dict[str, Any] = {"in_domain": {}, "in_domain_task": "CropPairRetrieval (held-out documents, nDCG@10)"}
    general_scores: dict[str, dict[str, float]] = {}
    for which, model in models.items():
        ctx.check()
        ctx.stage("evaluating", detail=f"{which} in-domain")
        report = run_suite(model, [in_domain_task], progress=False)
        out["in_domain"][which] = round(report["scores"][in_domain_task.metadata.name], 3)
        if options.general_tasks:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} general suite")
            report = run_suite(model, list(options.general_tasks), fast=options.general_fast, progress=False)
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
        order = sorted(random.Random(seed).sample(range(len(texts)), min(len(texts), options.max_knn_documents)))
        sample, sample_labels = [texts[i] for i in order], [labels[i] for i in order]
        out["knn"] = {which: round(_knn_points(m, sample, sample_labels), 3) for which, m in models.items()}
        out["knn_documents"] = len(sample)
    return out


def _knn_points(model: Any, texts: list[str], labels: list[str]) -> float:
    from evaluation.diagnostics import knn_accuracy

    n_train = round(0.9 * len(texts))
    k = max(1, min(10, n_train - 1))
    emb = model.encode(texts)
    return 100.0 * sum(knn_accuracy(emb, labels, k=k, seed=s) for s in range(5)) / 5
