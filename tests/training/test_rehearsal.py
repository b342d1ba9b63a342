"""The similarity rehearsal: its loss, what it holds in place during training, its settings."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.model_folder import RECIPE_FILE, TRAINED_ON_KEY
from training.config import ConfigError, TrainConfig
from training.encoder import Encoder
from training.objectives.rehearsal import SimilarityRehearsal
from training.trainer import train

GENERAL = [
    f"A general sentence number {i} about {topic}, written to be rehearsed."
    for i, topic in enumerate(
        ["tides", "bread", "chess", "glaciers", "opera", "bees", "tax law", "volcanoes", "sailing", "orchids"]
    )
]


def crop_corpus(n: int = 16) -> list[str]:
    topics = ["river ecology", "jazz history", "compiler design", "volcanic soils"]
    return [
        " ".join(
            f"Document {i} is about {topics[i % 4]}, sentence {j}, with enough words to make a crop of two "
            f"sentences about {topics[i % 4]} and its details."
            for j in range(4)
        )
        for i in range(n)
    ]


def config(tmp_path: Path, model: Path, name: str, **changes: object) -> TrainConfig:
    values: dict[str, object] = {
        "name": name, "model": str(model), "corpus": tuple(crop_corpus()), "validation": None, "max_seq_length": 32,
        "batch_size": 4, "max_steps": 6, "lr": 3e-3, "seed": 3, "log_every": 1, "progress_bar": False,
        "output_dir": str(tmp_path / name), **changes,
    }  # fmt: skip
    return TrainConfig(**values)  # type: ignore[arg-type]


def structure(encoder: Encoder, texts: list[str]) -> np.ndarray:
    z = encoder.encode(texts)
    return z @ z.T


def test_loss_is_zero_for_the_reference_itself_and_trains_only_the_student(tiny_bert_path: Path) -> None:
    student = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    same = SimilarityRehearsal(student, student.clone(), GENERAL, weight=2.0, batch_size=8)
    loss, metrics = same(torch.zeros(1), torch.zeros(1))
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-5) and metrics["loss"] == pytest.approx(0.0, abs=1e-5)

    other = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    with torch.no_grad():
        for param in other.parameters():
            param.add_(0.05 * torch.randn_like(param))
    term = SimilarityRehearsal(student, other, GENERAL, weight=2.0, batch_size=8)
    loss, metrics = term(torch.zeros(1), torch.zeros(1))
    assert float(loss.detach()) == pytest.approx(2.0 * metrics["loss"]) and metrics["loss"] > 0
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    assert all(p.grad is None and not p.requires_grad for p in other.parameters())
    assert all(not p.requires_grad for p in term.parameters())  # the student is held, not registered


def test_the_position_term_adds_the_squared_distance_of_the_normalised_embeddings(
    tiny_bert_path: Path, minilm_l6_path: Path
) -> None:
    student = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    reference = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    relations = SimilarityRehearsal(student, reference, GENERAL, weight=2.0, batch_size=len(GENERAL), seed=4)
    both = SimilarityRehearsal(student, reference, GENERAL, weight=2.0, batch_size=len(GENERAL), seed=4,
                               position_weight=5.0)  # fmt: skip
    kl_only, kl_metrics = relations(torch.zeros(1), torch.zeros(1))
    loss, metrics = both(torch.zeros(1), torch.zeros(1))
    z, r = student.encode(GENERAL), reference.eval().encode(GENERAL)  # the batch is every text, in some order
    expected = float(np.mean(2 - 2 * np.sum(z * r, axis=1)))  # normalised: ||z - r||^2 = 2 - 2 cos
    assert metrics["position_loss"] == pytest.approx(expected, rel=1e-3) and expected > 0
    assert metrics["loss"] == pytest.approx(kl_metrics["loss"], rel=1e-5) and "position_loss" not in kl_metrics
    assert float(loss.detach()) == pytest.approx(float(kl_only.detach()) + 5.0 * expected, rel=1e-3)

    same = SimilarityRehearsal(student, student.clone(), GENERAL, weight=1.0, position_weight=5.0)
    assert same(torch.zeros(1), torch.zeros(1))[1]["position_loss"] == pytest.approx(0.0, abs=1e-5)
    wider = Encoder.from_pretrained(minilm_l6_path, max_seq_length=32)
    SimilarityRehearsal(student, wider, GENERAL, weight=1.0)  # relations only: any width
    with pytest.raises(ValueError, match="384-wide and the student's 32"):
        SimilarityRehearsal(student, wider, GENERAL, weight=1.0, position_weight=1.0)
    with pytest.raises(ValueError, match="position_weight must be >= 0"):
        SimilarityRehearsal(student, student.clone(), GENERAL, weight=1.0, position_weight=-1.0)


def test_the_reference_embeds_each_text_once(tiny_bert_path: Path) -> None:
    student = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32).eval()
    reference = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    with torch.no_grad():
        for param in reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    embedded: list[int] = []
    reference.register_forward_hook(lambda _module, _args, output: embedded.append(len(output)))
    term = SimilarityRehearsal(student, reference, GENERAL, weight=1.0, batch_size=6, seed=1)
    losses = [float(term(torch.zeros(1), torch.zeros(1))[0].detach()) for _ in range(5)]
    assert sum(embedded) == len(term._reference_vectors) <= len(GENERAL) < 5 * 6  # each drawn text embedded once

    # the kept vectors are the ones a fresh reference pass gives: the same losses as without a cache
    fresh = SimilarityRehearsal(student, reference, GENERAL, weight=1.0, batch_size=6, seed=1)
    for loss in losses:
        fresh._reference_vectors.clear()
        assert float(fresh(torch.zeros(1), torch.zeros(1))[0].detach()) == pytest.approx(loss, rel=1e-4, abs=1e-6)


def test_bad_settings_are_refused(tmp_path: Path, tiny_bert_path: Path) -> None:
    student = Encoder.from_pretrained(tiny_bert_path, max_seq_length=32)
    with pytest.raises(ValueError, match="at least 3 distinct"):
        SimilarityRehearsal(student, student.clone(), ["one", "one", " "], weight=1.0)
    with pytest.raises(ValueError, match="weight must be > 0"):
        SimilarityRehearsal(student, student.clone(), GENERAL, weight=0.0)
    with pytest.raises(ConfigError, match="needs rehearsal_texts"):
        config(tmp_path, tiny_bert_path, "x", rehearsal_weight=1.0)
    with pytest.raises(ConfigError, match="rehearsal_weight must be >= 0"):
        config(tmp_path, tiny_bert_path, "x", rehearsal_weight=-1.0, rehearsal_texts=tuple(GENERAL))
    with pytest.raises(ConfigError, match="rehearsal_temperature must be > 0"):
        config(tmp_path, tiny_bert_path, "x", rehearsal_temperature=0.0)
    with pytest.raises(ConfigError, match="rehearsal_position_weight must be >= 0"):
        config(tmp_path, tiny_bert_path, "x", rehearsal_position_weight=-1.0)


def test_rehearsal_holds_the_structure_of_its_texts(tmp_path: Path, tiny_bert_path: Path) -> None:
    """A heavy rehearsal ends with the general texts' similarities closer to the start's than no rehearsal, logs
    rehearsal_loss every step, and its texts count among what the model was trained on."""
    start = structure(Encoder.from_pretrained(tiny_bert_path), GENERAL)

    def drift(name: str, **changes: object) -> tuple[float, Path, list[dict]]:
        result = train(config(tmp_path, tiny_bert_path, name, **changes))
        moved = structure(Encoder.from_pretrained(result.final_dir), GENERAL)
        return float(np.abs(moved - start).mean()), result.output_dir, result.history

    free, _, _ = drift("free")
    held, out, history = drift(
        "rehearsed", rehearsal_weight=50.0, rehearsal_texts=tuple(GENERAL), rehearsal_batch_size=6
    )
    assert held < free
    assert all(record["rehearsal_loss"] >= 0 for record in history)
    recipe = json.loads((out / RECIPE_FILE).read_text())
    assert recipe["rehearsal_texts"] == GENERAL and "custom" in recipe[TRAINED_ON_KEY]

    # with the position term the texts' embeddings themselves move less than under the relations alone
    def moved(directory: Path) -> float:
        z0 = Encoder.from_pretrained(tiny_bert_path).encode(GENERAL)
        z = Encoder.from_pretrained(directory).encode(GENERAL)
        return float(np.mean(1 - np.sum(z0 * z, axis=1)))

    positioned = train(config(tmp_path, tiny_bert_path, "positioned", rehearsal_weight=50.0,
                              rehearsal_texts=tuple(GENERAL), rehearsal_batch_size=6, rehearsal_position_weight=50.0))
    assert all(record["rehearsal_position_loss"] >= 0 for record in positioned.history)
    assert moved(positioned.final_dir) < moved(out / "final")
