"""The stages an /adapt job ends with, whether it publishes the adapted model or a student of it: export to staging →
evaluate → gate → record → publish. `record` and `publish` also end a base student's build.

Evaluation is never skipped; the base model's general-suite scores are cached by its content hash, since they do not
change between jobs.

Gate (`evaluation.gate.adapt_gate`, the trained model against the first of the roles it is compared with): the short
pieces of the held-out documents retrieving the rest of them (`evaluation.domain_checks`, the checks shaped like a
customer's search) must improve — and for a student, how closely its retrieval of them follows the base teacher's
(`Trained.reference`); held-out crop-pair retrieval, each task of the general offline suite that is
out-of-domain for the model it was trained from — and kNN accuracy when labels were given — may drop at most
``gate_margin`` points. A student is also compared with the base teacher, reported beside the decision. The model is
always published as a new version of ``name``; it is promoted (made servable) only when the gate passes and the job
says ``promote=auto``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from adapt_jobs.jobs import EVALUATING
from adapt_jobs.results import Evaluation, GateComparison, GateDecision, JobResult, Published
from adapt_jobs.spec import ADAPT_METHOD
from adapt_worker.attempt import AnyAttempt, Attempt, Exported, Trained, Verdict
from adapt_worker.scoring import general_tasks, score_models
from adapt_worker.stages import (
    CACHE_VOLUME,
    REGISTRY_VOLUME,
    SCORED_VARIANT,
    SCRATCH_VOLUME,
    guarded,
    published_quantization,
    stage_failure,
)
from core import registry as reg
from evaluation.embedding_model import EmbeddingModel, load_model
from evaluation.gate import adapt_gate
from export.bundle import build_bundle, publish_bundle
from training.encoder import Encoder
from training.torch_model import TorchModel

T = TypeVar("T")


def export_model(attempt: Attempt, trained: Trained) -> Exported:
    """Export the trained checkpoint (the adapted model, or its student) to a complete, unpublished bundle in the
    job's scratch folder. Its manifest's ``trained_on`` is the corpora of the model it was trained from plus
    ``adapt:<name>``, the customer's corpus (no suite task draws from it, so the adapted model's out-of-domain tasks are
    those of the model it came from). Training capped crops at a short length for speed; the checkpoint keeps the base
    model's limit (trainer)."""
    spec = attempt.spec
    encoder = Encoder.from_pretrained(trained.checkpoint)
    encoder.source = trained.source  # the manifest's base_model/source: what was adapted (or distilled into)
    params = spec.to_params()
    method = {
        "name": ADAPT_METHOD,
        "hyperparameters": {
            **params["hyperparameters"], "base_model": spec.base_model, "crop_rule": attempt.rule.describe(),
            "job": attempt.job.id, **({"student": params["student"]} if spec.student is not None else {}),
        },
    }  # fmt: skip
    staging = attempt.work / "bundle"
    staging.mkdir(parents=True, exist_ok=True)
    with guarded("export", SCRATCH_VOLUME):
        trained_on = [*trained.trained_on, f"{ADAPT_METHOD}:{spec.name}"]
        build_bundle(encoder, staging, spec.name, quantize=published_quantization(attempt.config.settings),
                     method=method, trained_on=trained_on)  # fmt: skip
    return Exported(staging)


def evaluate(attempt: Attempt, trained: Trained, exported: Exported) -> Evaluation:
    """Score the models it is compared with (torch, the checkpoints they are) and the trained model (the ONNX bundle
    that will be served), on the held-out documents (`adapt_worker.scoring.score_models`); the baselines that can be
    served and the trained model also on the spec's general tasks out-of-domain for the model it was trained from
    (those it was trained on are listed in ``general_in_domain`` and not scored), and on kNN when labels were given."""
    attempt.ctx.set_state(EVALUATING)
    with guarded("evaluation", CACHE_VOLUME):
        models: dict[str, EmbeddingModel] = {
            b.role: TorchModel(Encoder.from_pretrained(b.checkpoint)) for b in trained.baselines
        }
        models[trained.role] = load_model(exported.bundle, variant=SCORED_VARIANT)
        general = general_tasks(attempt.spec.hyperparameters.general_tasks, trained.trained_on)
        roles = [b.role for b in trained.baselines if b.general] + [trained.role]
        return score_models(
            attempt, models, general=general, general_roles=roles, checks=attempt.checks, labelled=attempt.labelled,
            reference=trained.reference, cached=[b.role for b in trained.baselines],
        )  # fmt: skip


def decide(attempt: Attempt, trained: Trained, evaluation: Evaluation) -> GateDecision:
    """The gate of the job (`judge`) with its ``gate_margin``."""
    return judge(evaluation, trained, margin=attempt.spec.hyperparameters.gate_margin)


def judge(evaluation: Evaluation, trained: Trained, *, margin: float) -> GateDecision:
    """The trained model against the first role of ``compared_with`` decides promotion; against each other one (a
    student against the base teacher) the same comparison is reported beside it, never deciding. Each comparison
    decides on the short pieces when the evaluation has them (`evaluation.gate.adapt_gate`)."""
    deciding, *reported = trained.compared_with
    decision = _against(evaluation, trained.role, deciding, margin)
    if not reported:
        return decision
    compared = {deciding: GateComparison(**decision.model_dump(), decides=True)}
    for role in reported:
        compared[role] = GateComparison(**_against(evaluation, trained.role, role, margin).model_dump(), decides=False)
    return decision.model_copy(update={"compared_with": compared})


def _against(evaluation: Evaluation, candidate: str, base: str, margin: float) -> GateDecision:
    def pair(scores: Mapping[str, T] | None) -> dict[str, T] | None:
        return None if scores is None else {"base": scores[base], "adapted": scores[candidate]}

    in_domain = pair(evaluation.in_domain)
    if in_domain is None:
        raise ValueError("the gate of an adapt job needs its in-domain scores")
    agreement = evaluation.teacher_agreement or {}
    gate = adapt_gate(
        in_domain, pair(evaluation.general_tasks), pair(evaluation.knn), margin=margin, pieces=pair(evaluation.pieces),
        agreement=pair(agreement) if base in agreement and candidate in agreement else None,
    )  # fmt: skip
    return GateDecision.model_validate(gate)


def record(attempt: AnyAttempt, evaluation: Evaluation, decision: GateDecision) -> Verdict:
    """Write the evaluation and the gate's decision to the job's result (event ``evaluation``)."""
    attempt.ctx.result(JobResult(evaluation=evaluation, gate=decision), event="evaluation")
    return Verdict(evaluation, decision)


def publish(attempt: AnyAttempt, exported: Exported, verdict: Verdict) -> Published:
    """Publish the staged bundle as the next version of its name (its manifest's ``validation``: the evaluation and the
    gate), promoted when the gate passed and the job promotes; fenced by the lease (a worker that lost the job
    promotes nothing) and by a cancel asked for before it (`JobContext.begin_publish`: one asked for later is
    refused). Promotion leaves a newer version of the name in place (another job's, promoted meanwhile): the result
    says the job's own version was not promoted, and a ``log`` event says why."""
    ctx, job = attempt.ctx, attempt.job
    ctx.begin_publish()  # the fence: publish only while this worker holds the job and no cancel was asked for
    ctx.stage("publishing")
    manifest = reg.read_manifest(exported.bundle)
    manifest["validation"] = {
        "job": job.id,
        "attempt": job.attempt,
        "evaluation": verdict.evaluation.model_dump(mode="json", by_alias=True),
        "gate": verdict.gate.model_dump(mode="json", by_alias=True),
    }
    try:
        bundle = publish_bundle(exported.bundle, attempt.config.registry_dir, manifest, promote=False)
    except OSError as err:
        raise stage_failure("publish", err, REGISTRY_VOLUME) from err
    return _release(attempt, manifest["name"], bundle.name, verdict.gate.passed and attempt.promote)


def published_before(attempt: AnyAttempt) -> Published | None:
    """End the job with the version an earlier attempt of it published, if one did: that attempt stopped between
    publishing and ending the job (its worker killed, or paused past its lease), and left the version in the registry,
    perhaps promoted. Its manifest holds the evaluation and the gate that attempt decided on; they are recorded again
    and the version is promoted as `publish` would, so the job ends with the model the registry has from it rather
    than training again and publishing a second one. None when no attempt of the job published.

    Once an attempt began publishing, a cancel is refused (`JobStore.cancel`), so none can end this retry before it
    ends the job with that version; when the registry holds none (that attempt stopped before its copy got there),
    a cancel is taken again while this attempt trains (`JobContext.reopen_cancel`)."""
    job, registry, name = attempt.job, attempt.config.registry_dir, attempt.spec.name
    if job.attempt <= 1:
        return None
    for version in reversed(reg.list_versions(registry, name)):
        try:
            validation = reg.read_manifest(registry / name / version).get("validation") or {}
        except reg.RegistryError:
            continue
        if validation.get("job") == job.id:
            break
    else:
        attempt.ctx.reopen_cancel()
        return None
    attempt.ctx.begin_publish()  # renews the lease and marks this attempt as the one publishing
    attempt.ctx.stage("publishing")
    attempt.ctx.log(f"version {version} of {name} was published by attempt {validation.get('attempt')} of this job, "
                    "which stopped before the job ended: the job ends with it")  # fmt: skip
    evaluation = Evaluation.model_validate(validation["evaluation"])
    verdict = record(attempt, evaluation, GateDecision.model_validate(validation["gate"]))
    return _release(attempt, name, version, verdict.gate.passed and attempt.promote)


def _release(attempt: AnyAttempt, name: str, version: str, promote: bool) -> Published:
    """Promote a published version if asked — under the lease, checked just before the switch: the copy into the
    registry takes a while, and a worker paused meanwhile (a frozen node) may have lost the job to another attempt —
    and record it as the job's model."""
    ctx, registry = attempt.ctx, attempt.config.registry_dir
    if promote:
        ctx.renew()
    try:
        promoted = promote and reg.promote(registry, name, version)
    except OSError as err:
        raise stage_failure("publish", err, REGISTRY_VOLUME) from err
    if promote and not promoted:
        ctx.log(f"version {version} of {name} was published, not promoted: version "
                f"{reg.current_version(registry, name)}, newer, was promoted meanwhile and stays served")  # fmt: skip
    published = Published(name=name, version=version, promoted=promoted)
    ctx.result(JobResult(model=published), event="published")
    if promoted:
        ctx.audit("promoted", version=version)
    if attempt.config.settings.keep_versions:
        _keep_newest(attempt, name, attempt.config.settings.keep_versions)
    ctx.stage("done", elapsed_s=round(ctx.elapsed(), 2))
    return published


def _keep_newest(attempt: AnyAttempt, name: str, keep: int) -> None:
    """``keep_versions``: remove the versions of ``name`` older than its newest ``keep`` (`core.registry.prune`: never
    the served one, one being published or one just published), each named in a ``log`` event. A failure is logged,
    never the job's: its model is published."""
    try:
        pruned = reg.prune(attempt.config.registry_dir, name, keep)
    except (reg.RegistryError, OSError) as err:
        attempt.ctx.log(f"could not remove old versions of {name} (keep_versions {keep}): {err}")
        return
    if pruned.removed:
        attempt.ctx.log(f"removed version{'s' if len(pruned.removed) > 1 else ''} {', '.join(pruned.removed)} of "
                        f"{name}: keep_versions keeps the newest {keep} and the served one")  # fmt: skip
