"""One /adapt job as stages in order, declared per kind of job in one registry (`PIPELINES`): ``adapt`` splits the
corpus and chooses its crop rule (`adapt_worker.attempt.Attempt.open`), trains, and ends like every /adapt job
(`adapt_worker.release`: export to staging → evaluate → gate → record → publish); ``adapt-student`` — an adapt job whose
spec asks for a compact ``student`` — makes the student instead (`adapt_worker.student`) and ends the same way;
``student-build`` builds a base student once (`adapt_worker.student_build`).

A stage is a function of the attempt and at most two values earlier stages returned, named by their types; it returns
one typed value (`run_stages` hands each stage the latest value of each type it asks for). Between stages the job's
stop checks run (`JobContext.check`); a stage that returns `Published` ends the job.

The recipe is the cropping paper's in-domain fine-tuning (``papers/000`` §3.1 and §3.2.3, Figure 1): two views of a
document are two crops of consecutive sentences, the loss is InfoNCE with τ = 0.05, lr 2e-5 with warm-up, and most of
the gain arrives within ~100 batches — so a job trains for a few dozen steps, not epochs. Speed comes by design: only
the last ``train_last_layers`` layers are trained (the paper's §4, Fig. 4a, fine-tunes the last 2), crops are short
(``max_seq_length`` 64 for training only — the published bundle keeps the base model's limit), both cores are used,
and the step count is small.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass

from adapt_jobs.jobs import JOB_KIND_ADAPT, JOB_KIND_STUDENT_BUILD, Job
from adapt_jobs.results import Published
from adapt_jobs.settings import AdaptConfig
from adapt_worker.attempt import ADAPT_STUDENT, AnyAttempt, Attempt, BuildAttempt
from adapt_worker.context import JobContext
from adapt_worker.release import decide, evaluate, export_model, publish, published_before, record
from adapt_worker.student import adapt_teacher_first, make_student
from adapt_worker.student_build import accept_as_built, evaluate_base_student, export_base_student, train_base_student
from adapt_worker.teacher import adapt_teacher

Stage = Callable[..., object]  # (attempt, up to two earlier stages' values) -> one typed value


@dataclass(frozen=True)
class Pipeline:
    """A kind of job: how its attempt is opened, and its stages in order."""

    opens: Callable[[Job, JobContext, AdaptConfig], AnyAttempt]
    stages: tuple[Stage, ...]


RELEASE: tuple[Stage, ...] = (export_model, evaluate, decide, record, publish)

PIPELINES: dict[str, Pipeline] = {
    JOB_KIND_ADAPT: Pipeline(Attempt.open, (adapt_teacher, *RELEASE)),
    ADAPT_STUDENT: Pipeline(Attempt.open, (adapt_teacher_first, make_student, *RELEASE)),
    JOB_KIND_STUDENT_BUILD: Pipeline(BuildAttempt.open, (train_base_student, export_base_student,
                                                         evaluate_base_student, accept_as_built, record, publish)),
}  # fmt: skip


def run_job(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
    """Run every stage of one job, reporting through ``ctx``; raise `JobFailed` (or let ``ctx.check`` raise) to end
    it early. Promoting is fenced by the lease: a worker that lost the job promotes nothing. A retry whose earlier
    attempt published the job's model before it stopped ends with that version (`release.published_before`)."""
    attempt = PIPELINES[job.kind].opens(job, ctx, config)  # an adapt job opens alike with or without a student
    ctx.check()
    if published_before(attempt) is None:
        run_stages(attempt, PIPELINES[attempt.kind].stages)


def run_stages(attempt: AnyAttempt, stages: tuple[Stage, ...]) -> None:
    """Run ``stages`` in order, each given the attempt and the latest values of the types it asks for; the job's stop
    checks between them. A stage that returns `Published` ends the job (a base student found already built)."""
    done: dict[type, object] = {}
    for stage in stages:
        out = stage(attempt, *(done[kind] for kind in stage_inputs(stage)))
        done[type(out)] = out
        if isinstance(out, Published):
            return
        attempt.ctx.check()


def stage_inputs(stage: Stage) -> list[type]:
    """The types of the values a stage asks for after the attempt (its parameters' annotations, in order)."""
    hints = typing.get_type_hints(stage)
    return [hints[name] for name in list(inspect.signature(stage).parameters)[1:]]
