"""What a run trains and validates on: the recipe's corpus (or scored pairs) split into training data and held-out
validation, the crop rule, and the whole-text units of ``views = "texts"``."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from core.model_folder import TRAINED_ON_KEY
from core.text import CropRule, choose_crop_rule
from training.config import TrainConfig, from_dict
from training.data import ScoredPair, load_corpus, load_scored_pairs, split_documents, text_units
from training.validation import CropPairValidation, ScoredPairValidation, Validation


@dataclass
class TrainingData:
    """What the run trains on (documents to crop, whole texts, or scored pairs) and what it validates on."""

    documents: list[str]  # views = "texts": the texts themselves (documents and sentences)
    scored_pairs: list[ScoredPair] | None
    rule: CropRule
    validation: Validation | None
    held_out_texts: list[str] | None = None  # teacher-fidelity validation: built once the teacher is loaded


def load_training_data(config: TrainConfig, crop_rule: CropRule | None = None) -> TrainingData:
    """The corpus (or scored pairs) of the recipe, split into training data and held-out validation.
    ``crop_rule`` overrides the recipe's (a caller that evaluates with a rule of its own passes it)."""
    if config.pairs:
        all_pairs = load_scored_pairs(config.pairs)
        random.Random(config.seed).shuffle(all_pairs)
        n_val = max(2, round(config.validation_fraction * len(all_pairs))) if config.validation else 0
        validation = ScoredPairValidation(all_pairs[:n_val]) if n_val else None
        return TrainingData([], all_pairs[n_val:], CropRule(sentences=config.crop_sentences), validation)
    corpus = list(config.corpus) if isinstance(config.corpus, tuple) else config.corpus
    all_documents = load_corpus(corpus, max_documents=config.max_documents, seed=config.seed)
    documents, validation_documents = _validation_source(config, all_documents)
    rule = crop_rule or (
        choose_crop_rule(documents, sentences=config.crop_sentences)
        if config.crop_rule == "auto"
        else CropRule(sentences=config.crop_sentences)
    )
    if config.views == "texts":
        documents = text_units(documents, config.text_sentences, seed=config.seed, names=config.text_names)
    if config.validation_metric == "teacher_fidelity":
        held_out = (
            text_units(validation_documents, config.text_sentences, seed=config.seed + 1)
            if validation_documents
            else None
        )
        return TrainingData(documents, None, rule, None, held_out)
    crop_validation = CropPairValidation(validation_documents, config.seed, rule) if validation_documents else None
    return TrainingData(documents, None, rule, crop_validation)


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


def recipe_training_texts(recipe_file: Path) -> list[str]:
    """The whole texts a ``views = "texts"`` run trained on (validation held out), rebuilt from the ``recipe.json``
    it wrote: its corpus, documents, seed and split are all there, so the same texts come back."""
    values = json.loads(Path(recipe_file).read_text())
    values.pop(TRAINED_ON_KEY, None)
    config = from_dict(values)
    if config.views != "texts":
        raise ValueError(f"{recipe_file} is not a whole-text run (views = {config.views!r})")
    return load_training_data(config).documents
