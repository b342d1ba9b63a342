"""Scoring the models of a job by role, in points: the in-domain checks on its held-out documents, the general offline
suite out-of-domain for them, and kNN accuracy when labels were given (`score_models`). Used by the evaluation of every
kind of job (`adapt_worker.release`, `adapt_worker.student_build`)."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from adapt_jobs.results import CropStats, Evaluation
from adapt_worker.attempt import AnyAttempt, InDomainChecks, LabelledSample
from adapt_worker.context import JobFailed
from evaluation.data import is_in_domain
from evaluation.diagnostics import knn_cross_validated_accuracy, smallest_training_part
from evaluation.domain_checks import AGREEMENT_PIECES, PIECES, piece_scores, piece_similarities, retrieval_agreement
from evaluation.embedding_model import EmbeddingModel
from evaluation.suite import run_suite
from evaluation.tasks import resolve_task

MAX_KNN_DOCUMENTS = 400  # seeded sample of the labelled documents (encoded twice, full length)


def general_tasks(tasks: Sequence[str], base_trained_on: Sequence[str]) -> dict[str, list[str]]:
    """The gate's general tasks split by the base model's training corpora: ``out_of_domain`` are scored, and
    ``in_domain`` ones are left out — a task the base was trained on does not measure general quality."""
    split: dict[str, list[str]] = {"out_of_domain": [], "in_domain": []}
    for name in tasks:
        in_domain = is_in_domain(resolve_task(name, fast=True).source_corpus, base_trained_on)
        split["in_domain" if in_domain else "out_of_domain"].append(name)
    return split


def score_models(
    attempt: AnyAttempt,
    models: Mapping[str, EmbeddingModel],
    *,
    general: dict[str, list[str]],
    general_roles: Collection[str],
    checks: InDomainChecks | None = None,
    labelled: LabelledSample | None = None,
    reference: str | None = None,
    cached: Collection[str] = (),
) -> Evaluation:
    """Score each model (by role: ``base``, ``adapted``, ``base_student``…) on the in-domain ``checks`` — crop pairs
    and the short pieces of each held-out document retrieving the rest of it (`evaluation.domain_checks`, the mean of
    its checks) —, the roles in ``general_roles`` also on the general tasks out-of-domain for them (their mean in
    points), and, when ``labelled``, those same roles on kNN accuracy: k = 10 cosine neighbours on up to 400 labelled
    documents (the cropping paper's protocol, 000 §3.3.1: training never sees labels), 10-fold cross-validated ten
    times over (each fit a 9:1 split, every document tested once per repeat). With a ``reference`` role (a student's
    teacher) among ``models``, every other role is also scored on how closely its retrieval of the lead and title
    pieces follows the reference's (`evaluation.domain_checks.retrieval_agreement`, from the same similarities).
    Scores are points (× 100), rounded to 3 decimals. The general scores of the roles in ``cached`` — models later
    jobs score again, as a base model — are kept in the cache; the others, a model this job made, are scored once
    and would only pile up there, one folder per job."""
    ctx, config = attempt.ctx, attempt.config
    in_domain: dict[str, float] = {}
    pieces: dict[str, float] = {}
    piece_checks: dict[str, dict[str, float]] = {}
    similarities: dict[str, dict[str, np.ndarray]] = {}
    general_scores: dict[str, dict[str, float]] = {}
    for which, model in models.items():
        if checks is not None:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} in-domain")
            report = run_suite(model, [checks.crop_pairs], progress=False)
            in_domain[which] = round(report["scores"][checks.crop_pairs.metadata.name], 3)
            similarities[which] = piece_similarities(model, checks.held_out, checks.distractors)
            found = piece_scores(similarities[which])
            if found:
                means = {kind: float(scores.mean()) for kind, scores in found.items()}
                piece_checks[which] = {kind: round(value, 3) for kind, value in means.items()}
                pieces[which] = round(sum(means.values()) / len(means), 3)
        if general["out_of_domain"] and which in general_roles:
            ctx.check()
            ctx.stage("evaluating", detail=f"{which} general suite")
            fast = config.settings.general_fast
            cache = config.cache_dir if which in cached else None
            report = run_suite(model, general["out_of_domain"], fast=fast, progress=False, cache=cache)
            if report["skipped"]:
                raise JobFailed("evaluation", f"general tasks could not run here: {report['skipped']}")
            general_scores[which] = {k: round(v, 3) for k, v in report["scores"].items()}
    evaluation = Evaluation(general_in_domain=general["in_domain"])
    if checks is not None:
        evaluation = evaluation.model_copy(update={
            "in_domain": in_domain,
            "in_domain_task": "CropPairRetrieval (held-out documents, nDCG@10)",
            "crops": CropStats.model_validate(checks.crop_pairs.crop_stats),
            **({"pieces": pieces, "piece_checks": piece_checks, "pieces_task": _pieces_task(checks)} if pieces else {}),
        })  # fmt: skip
        agreement = _agreement(similarities, reference)
        if agreement:
            evaluation = evaluation.model_copy(update={
                "teacher_agreement": agreement, "teacher_agreement_task": _agreement_task(reference),
            })  # fmt: skip
    if general_scores:
        means = {w: round(sum(s.values()) / len(s), 3) for w, s in general_scores.items()}
        evaluation = evaluation.model_copy(update={"general_tasks": general_scores, "general": means})
    if labelled is not None:
        ctx.check()
        ctx.stage("evaluating", detail="kNN accuracy")
        texts, labels = labelled.texts, labelled.labels
        order = sorted(random.Random(labelled.seed).sample(range(len(texts)), min(len(texts), MAX_KNN_DOCUMENTS)))
        sample, sample_labels = [texts[i] for i in order], [labels[i] for i in order]
        knn = {w: round(knn_points(m, sample, sample_labels), 3) for w, m in models.items() if w in general_roles}
        evaluation = evaluation.model_copy(update={"knn": knn, "knn_documents": len(sample)})
    return evaluation


def _pieces_task(checks: InDomainChecks) -> str:
    return (
        f"ShortPieceRetrieval ({', '.join(PIECES)} of each held-out document → the rest of it, among "
        f"{len(checks.held_out)} held-out documents and {len(checks.distractors)} training documents; nDCG@10, "
        "the mean of the checks)"
    )


def _agreement(similarities: Mapping[str, Mapping[str, np.ndarray]], reference: str | None) -> dict[str, float]:
    """Each role's mean `retrieval_agreement` with the ``reference`` role over the `AGREEMENT_PIECES` checks both
    have (the reference itself left out: it agrees with itself)."""
    theirs = similarities.get(reference) if reference is not None else None
    if not theirs:
        return {}
    out = {}
    for role, ours in similarities.items():
        kinds = [kind for kind in AGREEMENT_PIECES if kind in ours and kind in theirs]
        if role != reference and kinds:
            means = [float(retrieval_agreement(ours[kind], theirs[kind]).mean()) for kind in kinds]
            out[role] = round(sum(means) / len(means), 3)
    return out


def _agreement_task(reference: str | None) -> str:
    return (
        f"RetrievalAgreement ({', '.join(AGREEMENT_PIECES)} pieces of each held-out document: nDCG@10 of a model's "
        f"ranking with the {reference} model's ten nearest documents as the relevant set, the mean of the checks)"
    )


def knn_points(model: EmbeddingModel, texts: list[str], labels: list[str]) -> float:
    """``model``'s kNN accuracy on the labelled ``texts``, in points: 10-fold cross-validation repeated ten times
    (one fold per document below ten), k = 10 cosine neighbours or fewer than the smallest training part holds."""
    folds = min(10, len(texts))
    k = max(1, min(10, smallest_training_part(len(texts), folds) - 1))
    return 100.0 * knn_cross_validated_accuracy(model.encode(texts), labels, k=k, folds=folds)
