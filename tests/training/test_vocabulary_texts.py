"""The vocabulary texts of `benchmarks/varied_corpus.py` and the fidelity measure of
`benchmarks/short_text_fidelity.py`."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
VOCABULARY = ["[PAD]", "[CLS]", "a", "an", "cat", "house", "river", "stone", "##s", "##ing", "##ite", "##x", "12"]


@pytest.fixture()
def scripts(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("varied_corpus", "short_text_fidelity"):
        sys.modules.pop(name, None)
    return importlib.import_module("varied_corpus"), importlib.import_module("short_text_fidelity")


def test_vocabulary_texts_are_words_and_pieces_of_the_vocabulary(scripts: tuple[ModuleType, ModuleType]) -> None:
    varied_corpus, _ = scripts
    texts = varied_corpus.vocabulary_texts(VOCABULARY, 8, seed=0)
    assert texts == varied_corpus.vocabulary_texts(VOCABULARY, 8, seed=0)
    assert texts != varied_corpus.vocabulary_texts(VOCABULARY, 8, seed=1)
    words, pieces = {"cat", "house", "river", "stone"}, {"ing", "ite"}  # "a", "an", "##s", "##x" are too short
    singles, lengthened, phrases = texts[:4], texts[4:6], texts[6:]
    assert set(singles) == words
    for text in lengthened:
        stem = next(w for w in words if text.startswith(w))
        rest = text[len(stem) :]
        assert rest in pieces or any(rest == p + q for p in pieces for q in pieces if p != q)
    assert all(2 <= len(p.split()) <= 3 for p in phrases)
    assert all(any(w.startswith(stem) for stem in words) for p in phrases for w in p.split())


def test_a_vocabulary_without_wordpiece_continuations_is_refused(scripts: tuple[ModuleType, ModuleType]) -> None:
    varied_corpus, _ = scripts
    with pytest.raises(ValueError, match="not a WordPiece vocabulary"):
        varied_corpus.vocabulary_texts(["▁cat", "▁house", "house", "river"], 4)


def test_fidelity_reads_direction_and_similarities(scripts: tuple[ModuleType, ModuleType]) -> None:
    _, short_text_fidelity = scripts
    teacher = np.random.default_rng(0).normal(size=(20, 8))
    assert short_text_fidelity.fidelity(teacher, 3 * teacher) == pytest.approx((1.0, 1.0))
    rotation, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(8, 8)))
    cosine, pairs = short_text_fidelity.fidelity(teacher, teacher @ rotation)  # same similarities, other directions
    assert cosine < 0.9 and pairs == pytest.approx(1.0)
    cosine, pairs = short_text_fidelity.fidelity(teacher, np.random.default_rng(2).normal(size=(20, 8)))
    assert pairs < 0.5
