"""What the stages of every kind of job share: the attempt's scratch folder, how an unexpected error becomes the
job's failure, and training under the job's stop checks with its progress reported (`run_training`).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adapt_jobs.jobs import JobStoreError
from adapt_jobs.knobs import OBJECTIVES
from adapt_jobs.results import JobResult, TrainingReport
from adapt_jobs.settings import AdaptSettings
from adapt_jobs.spec import JobSpec
from adapt_worker.context import JobContext, JobFailed, JobStopped
from core.text import CropRule
from training.config import TrainConfig
from training.trainer import TrainResult, train

log = logging.getLogger(__name__)

SCRATCH_VOLUME = "the adapt scratch volume (EMBED_ADAPT_DIR)"
CACHE_VOLUME = "the cache volume (EMBED_CACHE_DIR)"
REGISTRY_VOLUME = "the model registry volume"


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


# The trained model is scored on its bundle's fp32 graph, as its baselines (torch checkpoints) are: like against like.
# Its int8 graph, where there is one, is held to the parity bars against that fp32 graph on every serving CPU, as the
# base model's own int8 graph is; scoring int8 against an fp32 base would charge the adapted side alone for it.
SCORED_VARIANT = "fp32"


def published_quantization(settings: AdaptSettings) -> str:
    """`export.bundle.build_bundle`'s ``quantize`` for what a job publishes (``publish_int8``): ``auto`` keeps an int8
    graph where a setting passes the parity bars on this CPU (replicas serve it where it passes on theirs, so an
    adapted model runs at its base's int8 speed), else fp32 only."""
    return "auto" if settings.publish_int8 else "none"
