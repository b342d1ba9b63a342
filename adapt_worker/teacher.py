"""The /adapt job's own training stage: the cropping paper's in-domain fine-tuning of the base model on the customer's
training documents (``papers/000`` §2), cropped with the job's rule."""

from __future__ import annotations

from adapt_worker.attempt import Attempt, Baseline, Trained
from adapt_worker.stages import crop_train_config, run_training
from core.model_folder import read_trained_on

BASE, ADAPTED = "base", "adapted"  # the roles an /adapt job without a student scores


def adapt_teacher(attempt: Attempt) -> Trained:
    """Fine-tune the base model on the training documents, cropped with the job's rule; the best checkpoint, judged
    against the base model."""
    spec = attempt.spec
    train_config = crop_train_config(spec, attempt.base_path, attempt.split.train, attempt.work / "train",
                                     threads=attempt.config.settings.worker_threads)  # fmt: skip
    best = run_training(attempt.ctx, train_config, crop_rule=attempt.rule).best_dir
    return Trained(
        checkpoint=best,
        source=spec.base_model,
        trained_on=tuple(read_trained_on(attempt.base_path)),  # none for a built-in base: its training data is unknown
        role=ADAPTED,
        baselines=(Baseline(BASE, attempt.base_path),),
        compared_with=(BASE,),
    )
