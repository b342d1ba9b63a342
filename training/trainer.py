"""The trainer: one loop for every objective, built for a 2-core CPU and just as happy on CUDA.

`train(config)` loads the corpus, builds the model (optionally a small student, a truncated model
or a model whose lower layers are frozen), makes two views per example, runs the objective on the
two embedding batches and optimises with AdamW under a linear warm-up + linear decay schedule
(both ramps follow the fraction of the run done, counted in steps or, with a time budget, in
seconds). With ``views = "texts"`` the examples are whole texts (documents and their sentences), each
encoded once per step, and the teacher embeds each text only the first time it comes (`TeacherTargets`).
It validates every ``eval_every`` steps (held-out crop-pair retrieval, or fidelity to the teacher on
held-out texts), keeps the best model in ``DIR/best``, stops early when validation stops improving,
writes a resumable checkpoint and a JSONL metrics log, and saves the last model in ``DIR/final``.

Output folder::

    DIR/best/          the selected model (HF folder, loadable by sentence-transformers; export takes it)
    DIR/final/         the model after the last step
    DIR/checkpoint/    state.pt: model, objective (projector, queues), optimiser, RNGs, position in the data
    DIR/metrics.jsonl  one line per logged step and per validation
    DIR/recipe.json    the config that produced the run, and ``trained_on``: the corpora its weights saw
    DIR/result.json    steps, elapsed, best step and score, why it stopped
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from core.model_folder import BEST_DIR, FINAL_DIR
from core.text import CropRule
from training.assembly import (
    Models,
    build_models,
    build_objective,
    build_regularisers,
    parameter_groups,
    resolve_device,
    save_model,
)
from training.config import TrainConfig
from training.encoder import Encoder
from training.inputs import TrainingData, load_training_data
from training.run_folder import prepare_output
from training.state import (
    METRICS_FILE,
    STATE_FILE,
    TrainState,
    check_resume,
    seed_everything,
    without_rng_side_effects,
)
from training.targets import TEACHER_EMBEDDINGS, TeacherTargets
from training.validation import TeacherFidelityValidation, Validation
from training.views import PairStream

Batch = tuple[int, int, list[str], list[str], list[float]]  # (epoch, index, view1 texts, view2 texts, scores)
Progress = Callable[[dict[str, Any]], None]


@dataclass
class TrainResult:
    """What a run produced. ``best_dir`` is the model to export (``DIR/best``)."""

    output_dir: Path
    best_dir: Path
    final_dir: Path
    steps: int
    history: list[dict[str, Any]]  # logged training steps
    evaluations: list[dict[str, Any]]  # validations (step, score, …)
    elapsed: float
    best_score: float | None
    best_step: int | None
    stopped_by: str  # max_steps | epochs | time_budget | early_stopping | cancelled
    layers: int  # transformer layers of the trained model
    extra: dict[str, Any] = field(default_factory=dict)
    # resumed, the run had ended already (``stopped_by`` says why) and nothing was trained; not in result.json
    already_ended: bool = False


def lr_factor(step: int, progress: float, warmup: float, total_steps: int | None) -> float:
    """Linear warm-up then linear decay to 0, as a multiplier of the peak lr for optimiser step ``step``.

    ``progress`` ∈ [0, 1] is the fraction of the run done before this step (in steps, or in seconds under a
    time budget); ``warmup`` is a fraction of the run (< 1) or a number of steps (≥ 1). The first step
    already gets a non-zero rate.
    """
    progress = min(max(progress, 0.0), 1.0)
    if warmup >= 1:
        rise = (step + 1) / warmup
    elif warmup > 0:
        # whichever clock is ahead (steps or the time budget) also ends the warm-up: a run that a time budget
        # cuts short of max_steps still reaches the peak rate
        by_steps = (step + 1) / (warmup * total_steps) if total_steps else 0.0
        rise = max(by_steps, max(progress, 1e-3) / warmup)
    else:
        rise = 1.0
    fall = (1.0 - progress) / (1.0 - (warmup if warmup < 1 else 0.0))
    return max(0.0, min(1.0, rise, fall))


# --- one session of a run -----------------------------------------------------------------------


@dataclass
class Run:
    """The parts of a run that stay fixed (models, objective, optimiser, validation, output) with its `TrainState`:
    one optimiser step, one validation, one checkpoint, each a method that updates ``state``."""

    config: TrainConfig
    models: Models
    objective: nn.Module
    regularisers: dict[str, nn.Module]  # added to the objective; metrics prefixed with the key
    optimizer: torch.optim.Optimizer
    validation: Validation | None
    state: TrainState
    device: torch.device
    total_steps: int | None
    metrics_log: IO[str]
    progress: Progress | None
    targets: TeacherTargets | None = None  # views = "texts": the teacher's embedding of each text, computed once

    @property
    def out(self) -> Path:
        return self.config.resolved_output_dir

    def stop_reason(self, should_stop: Callable[[], bool] | None) -> str:
        """Why the run must stop before its next step, or "" to go on (polling ``should_stop``, when given)."""
        config, state = self.config, self.state
        patience = config.early_stopping_patience
        if state.evaluations and patience is not None and state.bad_evaluations >= patience:
            return "early_stopping"  # as the last validation said (a resumed run's, under its patience)
        if self.total_steps is not None and state.step >= self.total_steps:
            return "max_steps" if config.max_steps is not None else "epochs"
        if config.time_budget_s is not None and state.elapsed() >= config.time_budget_s:
            return "time_budget"
        if should_stop is not None and should_stop():
            return "cancelled"
        return ""

    def _diverged(self, what: str) -> FloatingPointError:
        return FloatingPointError(
            f"{what} at step {self.state.step}: lower lr (now {self.config.lr}) or check the objective's temperature"
        )

    def step(self, batches: Iterator[Batch]) -> dict[str, Any]:
        """Train on the next batch; returns the step's record (loss, lr, speed and the objective's metrics)."""
        config, state, student, reference = self.config, self.state, self.models.student, self.models.reference
        tick = time.perf_counter()
        batch_epoch, batch_index, first, second, scores = next(batches)
        done = state.fraction_done(self.total_steps, config.time_budget_s)
        factor = lr_factor(state.step, done, config.warmup, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr * factor
        tokens1 = student.tokenize(first)
        z1 = student(**tokens1)  # (B, D)
        whole_texts = config.views == "texts"  # both views are the text itself: encode it once
        tokens2 = tokens1 if whole_texts else student.tokenize(second)
        z2 = z1 if whole_texts else student(**tokens2)  # (B, D): a new dropout mask for dropout views
        if not (torch.isfinite(z1).all() and torch.isfinite(z2).all()):  # before the objective's diagnostics read them
            raise self._diverged("the embeddings became non-finite")
        extra = {}
        if config.pairs:  # CoSENT
            extra["scores"] = torch.tensor(scores, device=z1.device, dtype=z1.dtype)  # (B,)
        if self.targets is not None:
            extra["reference1"] = extra["reference2"] = self.targets(first)
        elif reference is not None:
            with torch.no_grad():
                extra["reference1"] = reference(**reference.tokenize(first))
                extra["reference2"] = reference(**reference.tokenize(second))
        elif config.online_reference:  # paper 001 §3.1: the views "again encoded" by f_ref = f_θ, stop-gradient
            with torch.no_grad():
                extra["reference1"] = student(**tokens1)
                extra["reference2"] = student(**tokens2)
        loss, metrics = self.objective(z1, z2, **extra)
        for prefix, term in self.regularisers.items():
            term_loss, term_metrics = term(z1, z2, first=first, second=first if whole_texts else second)
            loss = loss + term_loss
            metrics = {**metrics, **{f"{prefix}_{k}": v for k, v in term_metrics.items()}}
        if not torch.isfinite(loss):
            raise self._diverged(f"loss became {loss.item()}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = None
        if config.grad_clip:
            parameters = [p for g in self.optimizer.param_groups for p in g["params"]]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, config.grad_clip))
        self.optimizer.step()
        state.step += 1
        state.epoch, state.index = batch_epoch, batch_index + 1

        texts_per_s = (1 if whole_texts else 2) * len(first) / max(time.perf_counter() - tick, 1e-9)
        now = state.elapsed()
        fraction = state.fraction_done(self.total_steps, config.time_budget_s)
        eta = now * (1 - fraction) / fraction if fraction > 0 else None
        record = {
            "kind": "train",
            "step": state.step,
            "total": self.total_steps,
            "epoch": batch_epoch,
            "loss": float(loss.item()),
            "lr": config.lr * factor,
            "elapsed": round(now, 3),
            "eta": None if eta is None else round(eta, 1),
            "texts_per_s": round(texts_per_s, 1),
            **({"grad_norm": grad_norm} if grad_norm is not None else {}),
            **{k: float(v) for k, v in metrics.items()},
        }
        if state.step % max(1, config.log_every) == 0 or state.step == 1:
            state.history.append(record)
            self._log(record)
        if self.progress:
            self.progress(dict(record))
        return record

    def validation_due(self) -> bool:
        every = self.config.eval_every
        return self.validation is not None and bool(every) and self.state.step % every == 0

    def validate(self) -> bool:
        """Score the current model, keep it when it is the best so far; True when patience ran out."""
        assert self.validation is not None
        state, student = self.state, self.models.student
        scores = without_rng_side_effects(self.device, self.validation.evaluate, student)
        score = scores[self.validation.metric]
        improved = state.record_validation(score)
        if improved:
            save_model(student, self.out / BEST_DIR, self.models.saved_max_seq_length)
        record = {"kind": "eval", "step": state.step, "elapsed": round(state.elapsed(), 3), "score": score, **scores}
        record["best"] = improved
        state.evaluations.append(record)
        self._log(record)
        if self.progress:
            self.progress(dict(record))
        patience = self.config.early_stopping_patience
        return patience is not None and state.bad_evaluations >= patience

    def finish(self, already_ended: bool) -> None:
        """End the session: validate the last step, checkpoint, save ``final/`` (and ``best/`` without validation).
        A resumed run that had ended already does only what its last session left undone."""
        state, student, length = self.state, self.models.student, self.models.saved_max_seq_length
        undone = not already_ended
        if self.validation is not None and (not state.evaluations or state.evaluations[-1]["step"] != state.step):
            self.validate()
            undone = True
        if undone:
            self.save_checkpoint()
        if undone or not (self.out / FINAL_DIR).is_dir():
            save_model(student, self.out / FINAL_DIR, length)
        if self.validation is None:
            if undone or not (self.out / BEST_DIR).is_dir():
                save_model(student, self.out / BEST_DIR, length)
            state.best_step = state.step

    def save_checkpoint(self) -> None:
        if self.targets is not None:
            self.targets.save()
        self.state.save(
            self.out / "checkpoint",
            model=self.models.student,
            objective=self.objective,
            optimizer=self.optimizer,
            layers=self.models.layers,
            device=self.device,
            regularisers=self.regularisers,
        )

    def _log(self, record: dict[str, Any]) -> None:
        self.metrics_log.write(json.dumps(record, default=float) + "\n")
        self.metrics_log.flush()


# --- the entry point ----------------------------------------------------------------------------


def train(
    config: TrainConfig,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    device: str | torch.device | None = None,
    threads: int | None = None,
    crop_rule: CropRule | None = None,
    cache_dir: Path | None = None,
) -> TrainResult:
    """Run one training recipe; see the module docstring for what it writes.

    ``progress`` receives ``{"kind": "train", step, total, loss, lr, elapsed, eta, texts_per_s}`` after every
    step and ``{"kind": "eval", step, score, …}`` after every validation. ``should_stop`` is polled every step;
    when it returns True the run checkpoints and ends with ``stopped_by = "cancelled"``.

    ``device`` and ``threads`` are the caller's choice (the CLI passes ``EMBED_DEVICE`` / ``EMBED_NUM_THREADS``);
    a recipe's own ``device`` / ``num_threads`` take precedence. Without either: CPU, and torch's thread default.
    ``crop_rule`` replaces the recipe's rule (/adapt trains and evaluates with the one rule it chose).
    ``cache_dir`` keeps what outlives a run: with whole-text views, the teacher's embeddings of the training texts
    (``cache_dir/teacher-embeddings``, `TeacherTargets`), reused by the next run of the same teacher.
    """
    threads = config.num_threads or threads
    if threads:
        torch.set_num_threads(threads)
    run_device = resolve_device(str(config.device or device or "cpu"))
    seed_everything(config.seed)
    out = config.resolved_output_dir
    resuming = config.resume and (out / "checkpoint" / STATE_FILE).is_file()
    if resuming:
        check_resume(config, out)  # before prepare_output records this config as the run's
    prepare_output(config, out, fresh=not resuming)

    data = load_training_data(config, crop_rule)
    models = build_models(config, run_device, data.validation)
    student, reference = models.student, models.reference
    validation, targets, setup = _teacher_side(config, data, reference, cache_dir)
    stream = PairStream(config, data.documents, data.rule, student.tokenizer.mask_token or "[MASK]", data.scored_pairs)
    objective = build_objective(config, student.dim, reference.dim if reference else None, models.distillation)
    regularisers = build_regularisers(config, student)  # before a resume loads trained weights into the student
    for module in (student, objective):
        module.to(run_device)
    optimizer = torch.optim.AdamW(parameter_groups([student, objective], config.weight_decay), lr=config.lr)
    total_steps = config.max_steps
    if total_steps is None and config.epochs is not None:
        total_steps = max(1, math.ceil(config.epochs * stream.batches_per_epoch))

    state = TrainState()
    if resuming:
        state = TrainState.restore(
            out / "checkpoint", model=student, objective=objective, optimizer=optimizer, layers=models.layers,
            device=run_device, regularisers=regularisers,
        )  # fmt: skip

    with (out / METRICS_FILE).open("a" if resuming else "w") as metrics_log:
        state.start_clock()
        run = Run(
            config, models, objective, regularisers, optimizer, validation, state, run_device, total_steps,
            metrics_log, progress, targets,
        )  # fmt: skip
        # a resumed run that had ended (its steps, budget or patience used up under these settings) trains no more
        stopped_by, record = run.stop_reason(None) if resuming else "", None
        already_ended = bool(stopped_by)
        start = not stopped_by and state.step == 0 and not state.evaluations
        if start and run.validation_due() and run.validate():  # the start model
            stopped_by = "early_stopping"
        batches = stream.batches(state.epoch, state.index)
        student.train()
        if reference is not None:
            reference.eval()
        with tqdm(
            total=total_steps, initial=state.step, desc=f"train {config.name}", disable=not config.progress_bar,
            leave=False,
        ) as bar:  # fmt: skip
            while not stopped_by:
                stopped_by = run.stop_reason(should_stop)
                if stopped_by:
                    break
                record = run.step(batches)
                bar.update(1)
                left = "?" if record["eta"] is None else f"{record['eta']:.0f}s"  # the run's own: follows the clock
                bar.set_postfix(loss=f"{record['loss']:.4f}", texts_s=f"{record['texts_per_s']:.0f}", left=left)
                if run.validation_due() and run.validate():
                    stopped_by = "early_stopping"
                if config.checkpoint_every and state.step % config.checkpoint_every == 0:
                    run.save_checkpoint()
                student.train()  # validation left it in eval mode

        if record is not None and not (state.history and state.history[-1]["step"] == state.step):
            state.history.append(record)  # a session's last step is logged whatever log_every says
        run.finish(already_ended)
    state.rewrite_metrics_log(out / METRICS_FILE)  # the last step's line goes before its validation's

    if targets is not None:
        setup["teacher_embedded_texts"] = targets.computed
        setup["teacher_vectors_from_cache"] = targets.loaded
    result = TrainResult(
        output_dir=out,
        best_dir=out / BEST_DIR,
        final_dir=out / FINAL_DIR,
        steps=state.step,
        history=state.history,
        evaluations=state.evaluations,
        elapsed=state.elapsed(),
        best_score=state.best_score,
        best_step=state.best_step,
        stopped_by=stopped_by,
        layers=models.layers,
        already_ended=already_ended,
        extra={
            "probe": models.probe,
            "crop_rule": data.rule.describe(),
            "skipped_documents": stream.skipped,
            "training_texts": len(data.documents),
            **setup,
        },
    )
    summary = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in result.__dict__.items()
        if k not in ("history", "already_ended")
    }
    (out / "result.json").write_text(json.dumps(summary, indent=2, default=float))
    return result


def _teacher_side(
    config: TrainConfig, data: TrainingData, reference: Encoder | None, cache_dir: Path | None
) -> tuple[Validation | None, TeacherTargets | None, dict[str, float]]:
    """What needs the loaded teacher: the teacher-fidelity validation (with the seconds its teacher embeddings took,
    not training time) and, for whole-text views, the memo of the teacher's embeddings of the training texts (kept
    under ``cache_dir`` between runs when one is given)."""
    validation, targets, setup = data.validation, None, {}
    if reference is None:
        return validation, targets, setup
    if data.held_out_texts:
        tick = time.perf_counter()
        validation = TeacherFidelityValidation(data.held_out_texts, reference, seed=config.seed)
        setup["fidelity_setup_s"] = round(time.perf_counter() - tick, 1)
    if config.views == "texts":
        store = cache_dir / TEACHER_EMBEDDINGS if cache_dir is not None else None
        preset = Path(config.teacher_vectors) if config.teacher_vectors else None
        targets = TeacherTargets(reference, store, preset)
    return validation, targets, setup
