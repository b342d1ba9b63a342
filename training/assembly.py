"""What a run trains: the student (and its frozen reference), the objective, the optimiser's parameter groups,
and how a trained model is written out.

`build_models` turns a recipe into encoders: the base model or a student made from it (a layer subset or a
freshly initialised small BERT), truncated (at a fixed layer or at the best layer of TMFT's probe) and with its
lower layers frozen; objectives that need a second encoder also get a frozen reference (a teacher, or a frozen
copy of the starting model).
"""

from __future__ import annotations

import inspect
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from core import durable
from training.config import TEACHER_OBJECTIVES, ConfigError, TrainConfig
from training.data import load_corpus
from training.encoder import Encoder
from training.objectives import OBJECTIVES
from training.objectives.cosent import CoSENT
from training.objectives.mse_distillation import EmbeddingAnchor
from training.objectives.rank_reduction import RankReduction
from training.objectives.rehearsal import SimilarityRehearsal
from training.students import layer_subset_student, tiny_bert_student
from training.validation import Validation

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available: set device = 'cpu'")
    return device


def _freeze(module: nn.Module) -> nn.Module:
    module.eval()
    for param in module.parameters():
        param.requires_grad_(False)
    return module


def needs_reference(config: TrainConfig) -> bool:
    """Whether the objective that runs reads a frozen second encoder (scored pairs run CoSENT, which does not;
    self-supervised SCT's reference is the trained model itself, ``config.online_reference``)."""
    return config.objective in TEACHER_OBJECTIVES and not config.pairs and not config.online_reference


@dataclass
class Models:
    """The encoders of a run and what the trainer reports about them."""

    student: Encoder
    # SCT's / MSE's frozen teacher or frozen copy; None for other objectives and self-supervised SCT
    reference: Encoder | None
    distillation: bool  # the reference is a teacher (a different, usually larger model), not a frozen copy
    layers: int
    probe: list[float] | None
    # what the saved model truncates inputs to: the source model's own limit, not the (shorter) training length
    saved_max_seq_length: int


def pick_layer(scores: Sequence[float], *, max_layers: int | None = None, tolerance: float = 0.0) -> int:
    """TMFT's truncation layer (paper 003 §3) from the probe's per-layer scores (index 0 = embeddings): the
    deepest of layers 1..``max_layers`` whose score is within ``tolerance`` points of the best. Near-equal layers
    differ by noise on a small validation set, and a deeper one keeps more of the model to fine-tune."""
    candidates = list(scores[1 : (max_layers or len(scores)) + 1])
    if not candidates:
        raise ValueError(f"the probe scored no transformer layer (scores {list(scores)}): check probe_max_layers")
    best = max(candidates)
    return max(i for i, score in enumerate(candidates, start=1) if score >= best - tolerance)


def cut_texts(encoder: Encoder, max_seq_length: int | None) -> Encoder:
    """``encoder`` with its inputs cut to ``max_seq_length`` tokens (a run's limit), never beyond its own limit;
    how a run loads its start model, and so the teacher whose embeddings a teacher-embedding store keeps."""
    if max_seq_length is not None:
        encoder.max_seq_length = min(max_seq_length, encoder.max_seq_length)
    return encoder


def build_models(config: TrainConfig, device: torch.device, validation: Validation | None) -> Models:
    """The trained encoder and, for SCT and MSE distillation, the frozen reference encoder (teacher or initial
    copy). ``validation`` is needed only by ``truncate = 'probe'``, which scores every layer on it."""
    base = Encoder.from_pretrained(config.model, pooling=config.pooling, device=device)
    saved_max_seq_length = base.max_seq_length
    base = cut_texts(base, config.max_seq_length)  # training texts are cut shorter; students copy this from base
    if config.student == "layer_subset":
        student = layer_subset_student(base, config.student_layers)
    elif config.student == "tiny_bert":
        student = tiny_bert_student(
            base,
            num_layers=config.student_num_layers,
            hidden_size=config.student_hidden_size,
            num_heads=config.student_num_heads,
            seed=config.seed,
            output_dim=base.dim if config.student_output_dim == "teacher" else config.student_output_dim,
        )
    else:
        student = base.clone() if needs_reference(config) else base
    probe = None
    if config.truncate == "probe":
        if validation is None:
            raise ValueError("truncate = 'probe' picks the best layer on validation data: set validation")
        probe = validation.layer_scores(student)
        best = pick_layer(probe, max_layers=config.probe_max_layers, tolerance=config.probe_tolerance)
        log.info("layer-wise probe %s → truncating at layer %d", [round(s, 4) for s in probe], best)
        student.truncate(best)
    elif isinstance(config.truncate, int):
        student.truncate(config.truncate)
    student.freeze(config.train_last_layers)
    reference = None
    distillation = False
    if needs_reference(config):
        if config.teacher is not None:
            reference = Encoder.from_pretrained(config.teacher, max_seq_length=config.max_seq_length, device=device)
        else:
            # distillation from the full model when the student is smaller or truncated; MSE distillation of
            # `model` itself regresses a frozen copy of where it started
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
    """The objective named by the config, with the dimensions it needs passed when it asks for them.

    Scored pairs (``config.pairs``) always train with CoSENT at its default scale: ``objective`` and
    ``objective_params`` then describe the recipe's unsupervised fall-back, not this run.

    Raises `ConfigError` when ``objective_params`` name a parameter the class does not take or hold a value its
    constructor refuses."""
    if config.pairs:
        return CoSENT()
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
        raise ConfigError(
            f"objective_params {unknown} are not parameters of {cls.__name__}; it takes {sorted(accepted)}"
        )
    try:
        return cls(**params)
    except ValueError as exc:  # the constructor's own range checks (temperature > 0, ...) of the recipe's values
        raise ConfigError(f"objective {config.objective!r} refuses its objective_params: {exc}") from exc


def build_regularisers(config: TrainConfig, student: Encoder) -> dict[str, nn.Module]:
    """Terms added to the objective, by the prefix of their metrics: paper 002's rank reduction (``rr``, when
    ``rank_reduction`` ≠ 0) and the MSE anchor to a frozen copy of ``student`` as it is now (``anchor``, when
    ``anchor_weight`` > 0) and the similarity rehearsal on general texts (``rehearsal``, when ``rehearsal_weight`` > 0).
    Each is called as ``term(z1, z2, first=texts1, second=texts2)``."""
    terms: dict[str, nn.Module] = {}
    if config.rank_reduction != 0:
        terms["rr"] = RankReduction(gamma=config.rank_reduction)
    if config.anchor_weight > 0:
        terms["anchor"] = EmbeddingAnchor(student.clone(), config.anchor_weight)
    if config.rehearsal_weight > 0 and config.rehearsal_texts:
        device = next(student.parameters()).device
        reference = (
            student.clone()
            if config.rehearsal_model is None
            else Encoder.from_pretrained(config.rehearsal_model, max_seq_length=config.max_seq_length, device=device)
        )
        terms["rehearsal"] = SimilarityRehearsal(
            student, reference, load_corpus(config.rehearsal_texts), weight=config.rehearsal_weight,
            batch_size=config.rehearsal_batch_size, temperature=config.rehearsal_temperature,
            position_weight=config.rehearsal_position_weight, seed=config.seed,
        )  # fmt: skip
    return terms


def parameter_groups(modules: Sequence[nn.Module], weight_decay: float) -> list[dict[str, Any]]:
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


def save_model(encoder: Encoder, folder: Path, max_seq_length: int) -> None:
    """Write the model next to its final place, then swap it in: a reader never sees half a folder, and a save
    interrupted at any moment leaves the old model or the new one, whole (`recover_model_folder` puts it back).

    The new model is written to ``folder.tmp``; the old folder is moved aside to ``folder.old``, the new one renamed
    in, then the old one removed. The folder records ``max_seq_length`` (the source model's limit) rather than the
    training length, so that the shipped model does not silently cut long inputs to the length its training crops
    were cut to.
    """
    recover_model_folder(folder)
    staging, aside = _swap_folders(folder)
    encoder.save(staging, max_seq_length=max_seq_length)
    durable.sync_tree(staging)  # on disk before it takes the name a checkpoint saved next may record as the best
    if folder.exists():
        folder.rename(aside)
    staging.rename(folder)
    durable.sync_folder(folder.parent)
    shutil.rmtree(aside, ignore_errors=True)


def recover_model_folder(folder: Path) -> None:
    """Finish or undo a `save_model` of ``folder`` that was interrupted: the old model moved aside with no new one
    renamed in goes back (the run's checkpoint still names it); a half-written new model, or an old one the new one
    already replaced, is removed."""
    staging, aside = _swap_folders(folder)
    if aside.exists() and not folder.exists():
        aside.rename(folder)
    shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)


def _swap_folders(folder: Path) -> tuple[Path, Path]:
    """Where `save_model` writes the new model, and where it moves the old one aside."""
    return folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
