"""Student builders for distillation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from training.encoder import Encoder
from training.students import layer_subset_student, pca_projection, tiny_bert_student


@pytest.fixture(scope="module")
def teacher(minilm_l6_path: Path) -> Encoder:
    return Encoder.from_pretrained(minilm_l6_path)


def test_layer_subset_keeps_the_chosen_teacher_layers(teacher: Encoder, tmp_path: Path) -> None:
    student = layer_subset_student(teacher, [0, 5])
    assert student.num_layers == 2 and teacher.num_layers == 6
    for kept, original in zip(
        student.backbone.encoder.layer, [teacher.backbone.encoder.layer[i] for i in (0, 5)], strict=True
    ):
        assert torch.equal(kept.output.dense.weight, original.output.dense.weight)
        assert kept.output.dense.weight.data_ptr() != original.output.dense.weight.data_ptr()
    student.save(tmp_path / "student")
    assert Encoder.from_pretrained(tmp_path / "student").num_layers == 2


def test_tiny_bert_student_starts_from_teacher_pca(teacher: Encoder, tmp_path: Path) -> None:
    student = tiny_bert_student(teacher, num_layers=2, hidden_size=128, num_heads=2)
    assert student.num_layers == 2 and student.dim == 128
    assert sum(p.numel() for p in student.parameters()) < 5_000_000
    word = teacher.backbone.embeddings.word_embeddings.weight.detach()
    projection = pca_projection(word, 128)
    assert torch.allclose(student.backbone.embeddings.word_embeddings.weight, word @ projection)
    # PCA keeps the directions of largest variance: far more than a random 128-d projection.
    random = torch.linalg.qr(torch.randn(word.shape[1], 128, generator=torch.Generator().manual_seed(0)))[0]
    assert (word @ projection).var(0).sum() > 1.5 * (word @ random).var(0).sum()
    student.save(tmp_path / "tiny")
    reloaded = Encoder.from_pretrained(tmp_path / "tiny")
    texts = ["tiny students are cheap", "and start from the teacher's embedding space"]
    np.testing.assert_allclose(reloaded.encode(texts), student.encode(texts), atol=1e-5)


def test_tiny_bert_output_layer_is_kept_and_loads_in_sentence_transformers(teacher: Encoder, tmp_path: Path) -> None:
    """The 128 → 384 map is part of the model: it starts on the PCA basis, is saved as a Dense module, and both
    this project's loader and sentence-transformers give the same vectors from the saved folder."""
    student = tiny_bert_student(teacher, num_layers=2, hidden_size=128, num_heads=2, output_dim=384)
    assert (student.hidden_size, student.dim) == (128, 384)
    word = teacher.backbone.embeddings.word_embeddings.weight.detach()
    assert torch.allclose(student.output.linear.weight, pca_projection(word, 128))
    with torch.no_grad():  # a trained layer is not the PCA basis: make sure the saved weights are the live ones
        student.output.linear.bias.add_(0.01)
    texts = ["tiny students are cheap", "and map back into the teacher's space"]
    vectors = student.encode(texts)
    assert vectors.shape == (2, 384)
    student.save(tmp_path / "tiny")
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((tmp_path / "tiny" / "modules.json").read_text())]
    assert modules == ["Transformer", "Pooling", "Dense", "Normalize"]
    np.testing.assert_allclose(Encoder.from_pretrained(tmp_path / "tiny").encode(texts), vectors, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(tmp_path / "tiny"), device="cpu")
    np.testing.assert_allclose(st.encode(texts), vectors, atol=1e-5)


def test_tiny_bert_student_is_deterministic(teacher: Encoder) -> None:
    a = tiny_bert_student(teacher, seed=3)
    b = tiny_bert_student(teacher, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_student_builder_errors(teacher: Encoder) -> None:
    with pytest.raises(ValueError, match=r"hidden_size \(130\) must be divisible by num_heads \(4\)"):
        tiny_bert_student(teacher, hidden_size=130, num_heads=4)
    with pytest.raises(ValueError, match="exceeds the teacher's embedding width 384"):
        tiny_bert_student(teacher, hidden_size=512, num_heads=8)
    with pytest.raises(ValueError, match="output_dim must be a positive width"):
        tiny_bert_student(teacher, output_dim=0)
    with pytest.raises(ValueError, match="distinct indices"):
        layer_subset_student(teacher, [1, 1])


def test_probe_picks_the_deepest_layer_within_the_tolerance() -> None:
    from training.assembly import pick_layer

    scores = [10.0, 70.0, 80.0, 79.6, 75.0, 60.0, 50.0]  # index 0 = the embedding layer
    assert pick_layer(scores) == 2  # no tolerance: the best layer
    assert pick_layer(scores, tolerance=0.5) == 3  # layer 3 is within 0.5 points: deeper wins
    assert pick_layer(scores, tolerance=0.5, max_layers=2) == 2  # the speed cap still holds
    assert pick_layer(scores, tolerance=20.0) == 5  # 60.0 is exactly 20 points below the best
    with pytest.raises(ValueError, match="scored no transformer layer"):
        pick_layer([10.0])
