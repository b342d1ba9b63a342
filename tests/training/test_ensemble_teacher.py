"""`benchmarks/ensemble_teacher.py`: the map it fits, and targets keyed by the very texts a build trains on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tests.benchmark_scripts import load_script
from training.config import load_config
from training.encoder import Encoder
from training.inputs import load_training_data
from training.targets import read_vectors, text_key

ensemble_teacher = load_script("ensemble_teacher")


def test_ridge_recovers_a_linear_map_and_shrinks_with_strength() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8))
    w = rng.normal(size=(8, 3))
    assert np.allclose(ensemble_teacher.ridge(x, x @ w, 1e-9), w, atol=1e-6)
    assert np.linalg.norm(ensemble_teacher.ridge(x, x @ w, 10.0)) < 0.5 * np.linalg.norm(w)


def test_targets_cover_every_training_text_of_the_build(tmp_path: Path) -> None:
    overrides = ["max_documents=12", "max_validation_documents=2"]
    out = tmp_path / "pair.npz"
    # minilm-l6 paired with itself: the pair's mean is minilm-l6's own embedding, so each vector can be checked
    report = ensemble_teacher.write_targets(out, "minilm-l6", 1.0, "sct-tiny", overrides)
    texts = list(load_training_data(load_config("sct-tiny", overrides)).documents)
    vectors = read_vectors(out)
    assert report["texts"] == len(texts) == len(vectors) > 12  # paragraphs and one sentence of each
    assert report["cosine_to_minilm"] > 0.9999
    encoder = Encoder.from_pretrained("minilm-l6", max_seq_length=128)
    expected = torch.as_tensor(np.asarray(encoder.encode(texts[:3])))
    got = torch.stack([vectors[text_key(t)] for t in texts[:3]])
    assert torch.allclose(got, expected, atol=1e-5)


def test_the_build_overrides_are_read_as_embedder_train_takes_them() -> None:
    argv = ["targets", "out.npz", "--mapped", "m", "--set", "seed=1", "--set", "max_steps=3"]
    args = ensemble_teacher.arguments(argv)
    assert args.overrides == ["seed=1", "max_steps=3"] and args.mapped == "m" and args.weight == 1.0
