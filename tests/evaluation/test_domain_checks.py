"""The short-piece in-domain checks, and a gate that decides on them: an adapted model that wins crop pairs by matching
what every part of a document repeats, while its opening no longer finds the document, is refused."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from core.text import choose_crop_rule
from evaluation.domain_checks import (
    AGREEMENT_PIECES,
    ndcg_at_10,
    piece_pairs,
    piece_retrieval,
    piece_similarities,
    retrieval_agreement,
    short_piece,
    title_retrieval,
)
from evaluation.gate import IN_DOMAIN_TASK, PIECES_TASK, adapt_gate
from evaluation.tasks import CropPairRetrieval
from tests.evaluation.conftest import FakeModel

DIM = 256


def test_short_pieces_are_cut_out_of_the_document() -> None:
    text = "Alpha beta gamma delta epsilon zeta eta theta iota. The rest of it says more about alpha. And more still."
    lead, rest = short_piece(text, "lead")
    assert lead == "Alpha beta gamma delta epsilon zeta eta theta iota."
    assert rest == "The rest of it says more about alpha. And more still." and lead not in rest
    title, rest = short_piece(text, "title")
    assert title == "Alpha beta gamma delta epsilon zeta eta theta" and rest.startswith("The rest")
    summary, rest = short_piece(text, "summary")
    assert summary not in rest and summary in text
    assert short_piece("One sentence only, nothing else to find.", "lead") is None
    with pytest.raises(ValueError, match="kind must be"):
        short_piece(text, "headline")


def test_ndcg_counts_rank_and_ties() -> None:
    sim = np.array([[0.9, 0.1, 0.2], [0.5, 0.4, 0.6], [0.3, 0.3, 0.3]])
    scores = ndcg_at_10(sim, [[0], [1], [2]])
    assert scores[0] == pytest.approx(100.0)
    assert scores[1] == pytest.approx(100 / np.log2(4))  # third
    assert scores[2] == pytest.approx(100 / np.log2(4))  # a tie counts against the query


def _corpus(n: int = 40) -> list[str]:
    """Documents whose opening names the subject (``keyN``), named once more in the body, while every body sentence
    repeats a marker of its own document (``fillN``) — the kind of repeated surface a crop objective learns to match."""
    docs = []
    for i in range(n):
        lead = f"This entry describes key{i} and what key{i} is known for among readers of the series."
        body = [f"Section {j} of the entry goes on {f'about key{i} ' if j == 0 else ''}with the fill{i} wording of "
                "its own writer." for j in range(6)]  # fmt: skip
        docs.append(" ".join([lead, *body]))
    return docs


def _bag(weights: dict[str, float]):
    def embed(text: str) -> np.ndarray:
        v = np.zeros(DIM)
        for word in re.findall(r"[a-z0-9]+", text.lower()):
            w = next((weight for prefix, weight in weights.items() if word.startswith(prefix)), 0.05)
            v[int(hashlib.md5(word.encode()).hexdigest(), 16) % DIM] += w
        return v

    return embed


def test_the_gate_refuses_a_model_that_wins_crops_but_loses_the_summary_task(fake_model_factory) -> None:
    docs = _corpus()
    base = fake_model_factory("base", _bag({"key": 1.0, "fill": 0.0}), DIM)
    adapted = fake_model_factory("adapted", _bag({"key": 0.0, "fill": 1.0}), DIM)
    crops = CropPairRetrieval.from_corpus(docs, seed=0, rule=choose_crop_rule(docs)).crop_pairs()

    def crop_score(model) -> float:
        q, d = model.encode([a for a, _ in crops]), model.encode([b for _, b in crops])
        return float(ndcg_at_10(q @ d.T, [[i] for i in range(len(crops))]).mean())

    def pieces(model) -> float:
        return float(np.mean([v.mean() for v in piece_retrieval(model, docs).values()]))

    crop = {"base": crop_score(base), "adapted": crop_score(adapted)}
    piece = {"base": pieces(base), "adapted": pieces(adapted)}
    assert crop["adapted"] > crop["base"]  # the proxy says the adapted model is better…
    assert piece["adapted"] < piece["base"] - 10  # …but its summary-like pieces no longer find their documents

    assert adapt_gate(crop, None, None, margin=2)["passed"]  # crop pairs alone would promote it
    gate = adapt_gate(crop, None, None, margin=2, pieces=piece)
    assert not gate["passed"] and gate["decided_on"] == PIECES_TASK
    assert any(PIECES_TASK in reason and "must improve" in reason for reason in gate["reasons"])
    # the same checks let a model that really improves through, even while crop pairs dip within the margin
    better = adapt_gate({"base": 80.0, "adapted": 79.0}, None, None, margin=2, pieces={"base": 60.0, "adapted": 63.0})
    assert better["passed"]
    worse_crops = adapt_gate({"base": 80.0, "adapted": 75.0}, None, None, margin=2, pieces={"base": 60, "adapted": 63})
    assert not worse_crops["passed"] and IN_DOMAIN_TASK in worse_crops["reasons"][0]


def test_piece_pairs_and_title_retrieval(fake_model_factory) -> None:
    docs = _corpus(12)
    assert [p.source for p in piece_pairs(docs, "lead")] == list(range(12))
    model = fake_model_factory("base", _bag({"key": 1.0, "fill": 0.0}), DIM)
    titles = [f"key{i}" for i in range(12)]
    assert title_retrieval(model, titles, docs).mean() == pytest.approx(100.0)
    shared = title_retrieval(model, ["same"] * 12, docs)  # one title naming every document: all of them relevant
    assert len(shared) == 1 and shared[0] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="titles for"):
        title_retrieval(model, titles[:3], docs)


def test_retrieval_agreement_measures_how_closely_a_model_retrieves_like_its_reference() -> None:
    """The same ranking agrees fully, a slightly disturbed one mostly, an unrelated or reversed one hardly; and a model
    that matches the documents' markers instead of their subjects agrees less with a subject-matching reference than a
    model that mostly matches subjects."""
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(30, 80))
    assert retrieval_agreement(reference, reference).mean() == pytest.approx(100.0)
    near = retrieval_agreement(reference + 0.1 * rng.normal(size=reference.shape), reference).mean()
    unrelated = retrieval_agreement(rng.normal(size=reference.shape), reference).mean()
    assert near > 80 > 30 > unrelated and retrieval_agreement(-reference, reference).mean() < 1
    with pytest.raises(ValueError, match="shape"):
        retrieval_agreement(reference[:3], reference)
    docs = _corpus()
    teacher = piece_similarities(FakeModel("names", _bag({"key": 1.0, "fill": 0.0}), DIM), docs)
    close = piece_similarities(FakeModel("mostly names", _bag({"key": 1.0, "fill": 0.3}), DIM), docs)
    far = piece_similarities(FakeModel("markers", _bag({"key": 0.0, "fill": 1.0}), DIM), docs)
    for kind in AGREEMENT_PIECES:
        assert (
            retrieval_agreement(close[kind], teacher[kind]).mean()
            > retrieval_agreement(far[kind], teacher[kind]).mean()
        )
