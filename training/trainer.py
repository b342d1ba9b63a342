"""The trainer: one loop for every objective, built for a 2-core CPU and just as happy on CUDA.

`train(config)` loads the corpus, builds the model (optionally a small student, a truncated model
or a model whose lower layers are frozen), makes two views per example, runs the objective on the
two embedding batches and optimises with AdamW under a linear warm-up + linear decay schedule
(both ramps follow the fraction of the run done, counted in steps or, with a time budget, in
seconds). It validates every ``eval_every`` steps on held-out crop-pair retrieval, keeps the best
model in ``DIR/best``, stops early when validation stops improving, writes a resumable checkpoint
and a JSONL metrics log, and saves the last model in ``DIR/final``.

Output folder::

    DIR/best/          the selected model (HF folder, loadable by sentence-transformers; export takes it)
    DIR/final/         the model after the last step
    DIR/checkpoint/    state.pt: model, objective (projector, queues), optimiser, RNGs, position in the data
    DIR/metrics.jsonl  one line per logged step and per validation
    DIR/recipe.json    the config that produced the run
    DIR/result.json    steps, elapsed, best step and score, why it stopped
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from core.settings import get_settings
from training.config import TrainConfig
from training.data import ScoredPair, load_corpus, load_scored_pairs, split_documents
from training.encoder import Encoder
from training.students import layer_subset_student, tiny_bert_student
from core.text import CropRule, choose_crop_rule
from training.views import augment_text

log = logging.getLogger(__name__)

# objectives that need a frozen second encoder (a teacher, or a frozen copy of the initial model)
TEACHER_OBJECTIVES = ("sct", "mse_distillation")

STATE_FILE = "state.pt"


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


# --- views --------------------------------------------------------------------------------------


class PairStream:
    """A deterministic, resumable stream of batches of two views.

    Epoch ``e`` draws, with a generator seeded by ``(seed, e)``, one view pair per usable document
    (or per scored pair, in supervised mode) and shuffles them; batch ``i`` of epoch ``e`` is
    therefore the same whether the run started at step 0 or resumed from a checkpoint.

    ``crop``: two distinct crops of a document. ``dropout``: one crop twice (the encoder's dropout makes the
    views). ``tokens``: one crop, token-augmented twice. ``crop+tokens``: two crops, each token-augmented.
    """

    def __init__(
        self,
        config: TrainConfig,
        documents: Sequence[str],
        rule: CropRule,
        mask_token: str,
        scored_pairs: Sequence[ScoredPair] | None = None,
    ) -> None:
        self.config = config
        self.documents = list(documents)
        self.rule = rule
        self.mask_token = mask_token
        self.scored_pairs = list(scored_pairs) if scored_pairs is not None else None
        self._cache: dict[int, list[tuple[str, str, float]]] = {}
        first = self.epoch_examples(0)
        if len(first) < config.batch_size:
            raise ValueError(
                f"only {len(first)} training examples per epoch (from {len(self.documents)} documents; "
                f"{self.skipped} skipped for having fewer than two crops under the rule {rule.describe()!r}), "
                f"fewer than batch_size={config.batch_size}: use a larger corpus, a smaller batch_size or "
                "crop_rule = 'auto'"
            )
        self.batches_per_epoch = len(first) // config.batch_size

    def _rng(self, *key: int) -> random.Random:
        return random.Random(hash((self.config.seed, *key)) & 0xFFFFFFFF)

    def epoch_examples(self, epoch: int) -> list[tuple[str, str, float]]:
        if epoch in self._cache:
            return self._cache[epoch]
        rng = self._rng(epoch)
        examples: list[tuple[str, str, float]] = []
        self.skipped = 0
        if self.scored_pairs is not None:
            examples = [(p.text1, p.text2, p.score) for p in self.scored_pairs]
        elif self.config.views in ("dropout", "tokens"):  # one crop, two views made from it
            for doc in self.documents:
                chunks = self.rule.chunks(doc)
                if chunks:
                    text = rng.choice(chunks)
                    examples.append((text, text, 0.0))
                else:
                    self.skipped += 1
        else:
            for doc in self.documents:
                pair = self.rule.sample_pair(doc, rng)
                if pair is None:
                    self.skipped += 1
                else:
                    examples.append((pair[0], pair[1], 0.0))
        rng.shuffle(examples)
        self._cache = {epoch: examples}
        return examples

    def batches(self, epoch: int, index: int) -> Iterator[tuple[int, int, list[str], list[str], list[float]]]:
        """Yield ``(epoch, index, view1, view2, scores)`` from batch ``index`` of ``epoch`` onwards, forever."""
        b = self.config.batch_size
        while True:
            examples = self.epoch_examples(epoch)
            for i in range(index, len(examples) // b):
                chunk = examples[i * b : (i + 1) * b]
                first, second, scores = [c[0] for c in chunk], [c[1] for c in chunk], [c[2] for c in chunk]
                if self.config.views in ("tokens", "crop+tokens"):
                    rng = self._rng(epoch, i, 1)
                    params = dict(self.config.view_params)
                    first = [augment_text(t, rng, mask_token=self.mask_token, **params) for t in first]
                    second = [augment_text(t, rng, mask_token=self.mask_token, **params) for t in second]
                yield epoch, i, first, second, scores
            epoch, index = epoch + 1, 0


# --- validation ---------------------------------------------------------------------------------


class CropPairValidation:
    """Held-out crop-pair retrieval: `evaluation.tasks.CropPairRetrieval` over the held-out documents — one
    crop of each document must retrieve another crop of the same document among all of them. Score = its
    main metric, nDCG@10 in points (0–100), the same number the /adapt gate and the evaluation reports use."""

    metric = "crop_pair_ndcg_at_10"

    def __init__(self, documents: Sequence[str], seed: int) -> None:
        from evaluation.tasks.crops import CropPairRetrieval

        self.task = CropPairRetrieval.from_corpus(list(documents), seed=seed, name="HeldOutCropPairs")
        self.task.crop_pairs()  # fails now, with what to change, when too few documents have two crops

    def evaluate(self, encoder: Encoder) -> dict[str, float]:
        from evaluation.adapter import EmbeddingMemo
        from evaluation.diagnostics import alignment, effective_rank, uniformity
        from evaluation.suite import score_task
        from training.torch_model import TorchModel

        memo = EmbeddingMemo(TorchModel(encoder), progress=False)
        result = score_task(memo, self.task)
        details = result["details"]
        pairs = self.task.crop_pairs()
        first, second = memo.embed([a for a, _ in pairs]), memo.embed([b for _, b in pairs])  # cached: no re-encode
        return {
            self.metric: float(result["score"]),
            "crop_pair_mrr_at_10": 100.0 * float(details.get("mrr_at_10", float("nan"))),
            "crop_pair_recall_at_1": 100.0 * float(details.get("recall_at_1", float("nan"))),
            # papers/002 §2.2: the held-out crops' effective rank, alignment and uniformity
            "effective_rank": effective_rank(np.concatenate([first, second])),
            "alignment": alignment(first, second),
            "uniformity": uniformity(np.concatenate([first, second])),
        }

    def layer_scores(self, encoder: Encoder) -> list[float]:
        """The score of every layer's pooled output (index 0 = embeddings): TMFT's layer-wise probe."""
        from evaluation.diagnostics import layerwise_scores
        from training.torch_model import TorchModel

        return [float(s) for s in layerwise_scores(TorchModel(encoder), self.task, progress=False)]


class ScoredPairValidation:
    """Held-out scored pairs: Spearman correlation of cosine similarity with the gold score."""

    def __init__(self, pairs: Sequence[ScoredPair]) -> None:
        self.pairs = list(pairs)
        self.metric = "pair_spearman"

    def _spearman(self, first: np.ndarray, second: np.ndarray) -> float:
        from scipy.stats import spearmanr

        cos = (first * second).sum(-1) / np.maximum(
            np.linalg.norm(first, axis=-1) * np.linalg.norm(second, axis=-1), 1e-12
        )
        value = spearmanr(cos, [p.score for p in self.pairs]).statistic
        return float(0.0 if np.isnan(value) else value)

    def evaluate(self, encoder: Encoder) -> dict[str, float]:
        n = len(self.pairs)
        vectors = encoder.encode([p.text1 for p in self.pairs] + [p.text2 for p in self.pairs], batch_size=64)
        return {"pair_spearman": self._spearman(vectors[:n], vectors[n:])}

    def layer_scores(self, encoder: Encoder) -> list[float]:
        n = len(self.pairs)
        texts = [p.text1 for p in self.pairs] + [p.text2 for p in self.pairs]
        vectors = encoder.encode(texts, batch_size=64, all_layers=True)
        return [self._spearman(layer[:n], layer[n:]) for layer in vectors]


# --- losses the objectives package does not cover -----------------------------------------------


def cosent_loss(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor, scale: float = 20.0) -> torch.Tensor:
    """CoSENT (Su, 2022), the supervised loss TMFT (paper 003 §3) fine-tunes with on scored pairs.

    ``L = log(1 + Σ_{(i,j): y_i > y_j} exp(λ (cos_j − cos_i)))`` with λ = ``scale``: every pair that is
    scored higher must have the higher cosine. Inputs ``(B, D)``, ``(B, D)``, ``(B,)``.
    """
    cos = nn.functional.cosine_similarity(first, second, dim=-1) * scale  # (B,)
    diff = cos[None, :] - cos[:, None]  # (B, B): entry [i, j] = λ (cos_j − cos_i)
    higher = scores[:, None] > scores[None, :]  # (B, B): y_i > y_j
    diff = diff[higher]
    zero = torch.zeros(1, device=cos.device, dtype=cos.dtype)
    return torch.logsumexp(torch.cat([zero, diff]), dim=0)


# --- schedule -----------------------------------------------------------------------------------


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


# --- model construction -------------------------------------------------------------------------


def _freeze(module: nn.Module) -> nn.Module:
    module.eval()
    for param in module.parameters():
        param.requires_grad_(False)
    return module


@dataclass
class Models:
    student: Encoder
    reference: Encoder | None  # SCT's frozen teacher / frozen copy; None for other objectives
    distillation: bool  # the reference is a teacher (a different, usually larger model), not a frozen copy
    layers: int
    probe: list[float] | None
    # what the saved model truncates inputs to: the source model's own limit, not the (shorter) training length
    saved_max_seq_length: int


def build_models(config: TrainConfig, device: torch.device, validation: Any | None) -> Models:
    """The trained encoder and, for SCT, the frozen reference encoder (teacher or initial copy)."""
    base = Encoder.from_pretrained(config.model, pooling=config.pooling, device=device)
    saved_max_seq_length = base.max_seq_length
    if config.max_seq_length is not None:  # training texts are cut shorter; students copy this from base
        base.max_seq_length = min(config.max_seq_length, saved_max_seq_length)
    if config.student == "layer_subset":
        student = layer_subset_student(base, config.student_layers)
    elif config.student == "tiny_bert":
        student = tiny_bert_student(
            base,
            num_layers=config.student_num_layers,
            hidden_size=config.student_hidden_size,
            num_heads=config.student_num_heads,
            seed=config.seed,
        )
    else:
        student = base.clone() if config.objective in TEACHER_OBJECTIVES else base
    probe = None
    if config.truncate == "probe":
        if validation is None:
            raise ValueError("truncate = 'probe' picks the best layer on validation data: set validation")
        probe = validation.layer_scores(student)
        candidates = probe[1 : (config.probe_max_layers or len(probe)) + 1]
        best = 1 + int(np.argmax(candidates))
        log.info("layer-wise probe %s → truncating at layer %d", [round(s, 4) for s in probe], best)
        student.truncate(best)
    elif isinstance(config.truncate, int):
        student.truncate(config.truncate)
    student.freeze(config.train_last_layers)
    reference = None
    distillation = False
    if config.objective in TEACHER_OBJECTIVES:
        if config.teacher is not None:
            reference = Encoder.from_pretrained(config.teacher, max_seq_length=config.max_seq_length, device=device)
        else:
            # distillation from the full model when the student is smaller, else SCT's self-supervised mode
            reference = base if student is not base else base.clone()
        distillation = config.teacher is not None or config.student is not None or config.truncate is not None
        _freeze(reference)
    return Models(
        student=student,
        reference=reference,
        distillation=distillation,
        layers=student.num_layers,
        probe=probe,
        saved_max_seq_length=saved_max_seq_length,
    )


def build_objective(
    config: TrainConfig, student_dim: int, reference_dim: int | None, distillation: bool = False
) -> nn.Module:
    """The objective named by the config, with the dimensions it needs passed when it asks for them."""
    from training.objectives import OBJECTIVES

    name = "infonce" if config.objective == "simcse" else config.objective
    cls = OBJECTIVES[name]
    params = dict(config.objective_params)
    accepted = inspect.signature(cls).parameters
    sizes = {
        "dim": student_dim,
        "input_dim": student_dim,
        "student_dim": student_dim,
        "reference_dim": reference_dim or student_dim,
        "teacher_dim": reference_dim or student_dim,
    }
    if "distillation" in accepted:
        sizes["distillation"] = distillation
    for key, value in sizes.items():
        if key in accepted and key not in params:
            params[key] = value
    unknown = sorted(set(params) - set(accepted))
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        raise ValueError(
            f"objective_params {unknown} are not parameters of {cls.__name__}; it takes {sorted(accepted)}"
        )
    return cls(**params)


def build_rank_reduction(gamma: float) -> nn.Module | None:
    if gamma == 0:
        return None
    from training.objectives import OBJECTIVES

    return OBJECTIVES["rank_reduction"](gamma=gamma)


# --- the loop -----------------------------------------------------------------------------------


def _resolve_device(config: TrainConfig) -> torch.device:
    name = config.device or get_settings().device
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available: set device = 'cpu'")
    return device


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _without_rng_side_effects(device: torch.device, fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn`` and restore every RNG afterwards: validation (mteb seeds its own generators) must not change
    the training run, or a resumed run would differ from an uninterrupted one."""
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        return fn(*args)
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)


def _save_model(encoder: Encoder, folder: Path, max_seq_length: int) -> None:
    """Write the model next to its final place, then swap it in: a reader never sees half a folder.

    The folder records ``max_seq_length`` (the source model's limit) rather than the training length, so that
    the shipped model does not silently cut long inputs to the length its training crops were cut to.
    """
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    encoder.save(staging, max_seq_length=max_seq_length)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def _json_line(handle: Any, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, default=float) + "\n")
    handle.flush()


def _parameter_groups(modules: Sequence[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices only (not on biases and LayerNorm gains)."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for module in modules:
        for param in module.parameters():
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            (decay if param.ndim >= 2 else no_decay).append(param)
    if not decay and not no_decay:
        raise ValueError("nothing to train: every parameter is frozen (check train_last_layers)")
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _validation_source(config: TrainConfig, documents: list[str]) -> tuple[list[str], list[str] | None]:
    """(training documents, validation documents or None)."""
    if config.validation is None or config.validation == "none":
        return documents, None
    if config.validation == "holdout":
        split = split_documents(
            documents, config.validation_fraction, seed=config.seed, max_validation=config.max_validation_documents
        )
        return split.train, split.validation
    spec = list(config.validation) if isinstance(config.validation, tuple) else config.validation
    return documents, load_corpus(spec, max_documents=config.max_validation_documents, seed=config.seed)


def train(
    config: TrainConfig,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Run one training recipe; see the module docstring for what it writes.

    ``progress`` receives ``{"kind": "train", step, total, loss, lr, elapsed, eta, texts_per_s}`` after every
    step and ``{"kind": "eval", step, score, …}`` after every validation. ``should_stop`` is polled every step;
    when it returns True the run checkpoints and ends with ``stopped_by = "cancelled"``.
    """
    settings = get_settings()
    threads = config.num_threads or settings.num_threads
    if threads:
        torch.set_num_threads(threads)
    device = _resolve_device(config)
    _seed_everything(config.seed)
    out = config.resolved_output_dir
    checkpoint_dir = out / "checkpoint"
    resuming = config.resume and (checkpoint_dir / STATE_FILE).is_file()
    if not resuming:
        for stale in ("checkpoint", "best", "final", "metrics.jsonl", "result.json"):
            target = out / stale
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe.json").write_text(json.dumps(config.to_dict(), indent=2))

    # data and validation
    scored_pairs = None
    validation: CropPairValidation | ScoredPairValidation | None
    if config.pairs:
        all_pairs = load_scored_pairs(config.pairs)
        random.Random(config.seed).shuffle(all_pairs)
        n_val = max(2, round(config.validation_fraction * len(all_pairs))) if config.validation else 0
        scored_pairs = all_pairs[n_val:]
        validation = ScoredPairValidation(all_pairs[:n_val]) if n_val else None
        documents: list[str] = []
        rule = CropRule(sentences=config.crop_sentences)
    else:
        corpus = list(config.corpus) if isinstance(config.corpus, tuple) else config.corpus
        all_documents = load_corpus(corpus, max_documents=config.max_documents, seed=config.seed)
        documents, validation_documents = _validation_source(config, all_documents)
        rule = (
            choose_crop_rule(documents, sentences=config.crop_sentences)
            if config.crop_rule == "auto"
            else CropRule(sentences=config.crop_sentences)
        )
        validation = CropPairValidation(validation_documents, config.seed) if validation_documents else None

    models = build_models(config, device, validation)
    student, reference = models.student, models.reference
    mask_token = student.tokenizer.mask_token or "[MASK]"
    stream = PairStream(config, documents, rule, mask_token, scored_pairs)
    objective = (
        None
        if scored_pairs is not None
        else build_objective(config, student.dim, reference.dim if reference else None, models.distillation)
    )
    rank_reduction = build_rank_reduction(config.rank_reduction)
    trained_modules: list[nn.Module] = [student] + ([objective] if objective is not None else [])
    for module in trained_modules:
        module.to(device)
    optimizer = torch.optim.AdamW(_parameter_groups(trained_modules, config.weight_decay), lr=config.lr)

    total_steps = config.max_steps
    if total_steps is None and config.epochs is not None:
        total_steps = max(1, math.ceil(config.epochs * stream.batches_per_epoch))

    # run state (restored when resuming)
    step, epoch, index, elapsed_before = 0, 0, 0, 0.0
    best_score: float | None = None
    best_step: int | None = None
    bad_evaluations = 0
    history: list[dict[str, Any]] = []
    evaluations: list[dict[str, Any]] = []
    if resuming:
        state = torch.load(checkpoint_dir / STATE_FILE, map_location=device, weights_only=False)
        if state["layers"] != models.layers:
            raise ValueError(
                f"checkpoint in {checkpoint_dir} has {state['layers']} layers but this config builds "
                f"{models.layers}: resume with the config that wrote it"
            )
        student.load_state_dict(state["model"])
        if objective is not None:
            objective.load_state_dict(state["objective"])
        optimizer.load_state_dict(state["optimizer"])
        step, epoch, index = state["step"], state["epoch"], state["index"]
        elapsed_before = state["elapsed"]
        best_score, best_step, bad_evaluations = state["best_score"], state["best_step"], state["bad_evaluations"]
        history, evaluations = state["history"], state["evaluations"]
        torch.set_rng_state(state["torch_rng"])
        if device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], device)
        log.info("resumed from %s at step %d", checkpoint_dir, step)

    metrics_log = (out / "metrics.jsonl").open("a" if resuming else "w")
    start = time.perf_counter()

    def elapsed() -> float:
        return elapsed_before + time.perf_counter() - start

    def run_progress() -> float:
        fractions = [0.0]
        if total_steps:
            fractions.append(step / total_steps)
        if config.time_budget_s:
            fractions.append(elapsed() / config.time_budget_s)
        return max(fractions)

    def validate() -> bool:
        """Score the current model, keep it when it is the best so far; True when patience ran out."""
        nonlocal best_score, best_step, bad_evaluations
        assert validation is not None
        scores = _without_rng_side_effects(device, validation.evaluate, student)
        score = scores[validation.metric]
        improved = best_score is None or score > best_score
        if improved:
            best_score, best_step, bad_evaluations = score, step, 0
            _save_model(student, out / "best", models.saved_max_seq_length)
        else:
            bad_evaluations += 1
        record = {"kind": "eval", "step": step, "elapsed": round(elapsed(), 3), "score": score, **scores}
        record["best"] = improved
        evaluations.append(record)
        _json_line(metrics_log, record)
        if progress:
            progress(dict(record))
        patience = config.early_stopping_patience
        return patience is not None and bad_evaluations >= patience

    def save_checkpoint() -> None:
        staging = checkpoint_dir.with_name("checkpoint.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        state = {
            "model": student.state_dict(),
            "objective": objective.state_dict() if objective is not None else None,
            "optimizer": optimizer.state_dict(),
            "step": step,
            "epoch": epoch,
            "index": index,
            "layers": models.layers,
            "elapsed": elapsed(),
            "best_score": best_score,
            "best_step": best_step,
            "bad_evaluations": bad_evaluations,
            "history": history,
            "evaluations": evaluations,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        }
        torch.save(state, staging / STATE_FILE)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        staging.rename(checkpoint_dir)

    stopped_by = ""
    if validation is not None and config.eval_every and step == 0 and not evaluations and validate():
        stopped_by = "early_stopping"
    bar = tqdm(
        total=total_steps, initial=step, desc=f"train {config.name}", disable=not config.progress_bar, leave=False
    )
    batches = stream.batches(epoch, index)
    student.train()
    if reference is not None:
        reference.eval()
    try:
        while not stopped_by:
            if total_steps is not None and step >= total_steps:
                stopped_by = "max_steps" if config.max_steps is not None else "epochs"
                break
            if config.time_budget_s is not None and elapsed() >= config.time_budget_s:
                stopped_by = "time_budget"
                break
            if should_stop is not None and should_stop():
                stopped_by = "cancelled"
                break
            tick = time.perf_counter()
            batch_epoch, batch_index, first, second, scores = next(batches)
            factor = lr_factor(step, run_progress(), config.warmup, total_steps)
            for group in optimizer.param_groups:
                group["lr"] = config.lr * factor
            z1 = student(**student.tokenize(first))  # (B, D)
            z2 = student(**student.tokenize(second))  # (B, D): a new dropout mask for dropout views
            if objective is None:
                loss = cosent_loss(z1, z2, torch.tensor(scores, device=z1.device, dtype=z1.dtype))
                metrics: dict[str, float] = {}
            else:
                extra = {}
                if reference is not None:
                    with torch.no_grad():
                        extra["reference1"] = reference(**reference.tokenize(first))
                        extra["reference2"] = reference(**reference.tokenize(second))
                loss, metrics = objective(z1, z2, **extra)
            if rank_reduction is not None:
                rr_loss, rr_metrics = rank_reduction(z1, z2)
                loss = loss + rr_loss
                metrics = {**metrics, **{f"rr_{k}": v for k, v in rr_metrics.items()}}
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss became {loss.item()} at step {step}: lower lr (now {config.lr}) or check the objective's "
                    "temperature"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = None
            if config.grad_clip:
                grad_norm = float(
                    torch.nn.utils.clip_grad_norm_(
                        [p for g in optimizer.param_groups for p in g["params"]], config.grad_clip
                    )
                )
            optimizer.step()
            step += 1
            epoch, index = batch_epoch, batch_index + 1
            seconds = time.perf_counter() - tick
            texts_per_s = 2 * len(first) / max(seconds, 1e-9)
            now = elapsed()
            fraction = run_progress()
            eta = now * (1 - fraction) / fraction if fraction > 0 else None
            record = {
                "kind": "train",
                "step": step,
                "total": total_steps,
                "epoch": batch_epoch,
                "loss": float(loss.item()),
                "lr": config.lr * factor,
                "elapsed": round(now, 3),
                "eta": None if eta is None else round(eta, 1),
                "texts_per_s": round(texts_per_s, 1),
                **({"grad_norm": grad_norm} if grad_norm is not None else {}),
                **{k: float(v) for k, v in metrics.items()},
            }
            if step % max(1, config.log_every) == 0 or step == 1:
                history.append(record)
                _json_line(metrics_log, record)
            bar.update(1)
            bar.set_postfix(loss=f"{record['loss']:.4f}", texts_s=f"{texts_per_s:.0f}")
            if progress:
                progress(dict(record))
            if validation is not None and config.eval_every and step % config.eval_every == 0 and validate():
                stopped_by = "early_stopping"
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                save_checkpoint()
            student.train()
    finally:
        bar.close()

    if validation is not None and (not evaluations or evaluations[-1]["step"] != step):
        validate()
    save_checkpoint()
    _save_model(student, out / "final", models.saved_max_seq_length)
    if validation is None:
        _save_model(student, out / "best", models.saved_max_seq_length)
        best_step = step
    metrics_log.close()
    result = TrainResult(
        output_dir=out,
        best_dir=out / "best",
        final_dir=out / "final",
        steps=step,
        history=history,
        evaluations=evaluations,
        elapsed=elapsed(),
        best_score=best_score,
        best_step=best_step,
        stopped_by=stopped_by,
        layers=models.layers,
        extra={"probe": models.probe, "crop_rule": rule.describe(), "skipped_documents": stream.skipped},
    )
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items() if k not in ("history",)}
    (out / "result.json").write_text(json.dumps(summary, indent=2, default=float))
    return result
