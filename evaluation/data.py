"""Evaluation's own data: the scored Lee documents and ratings, and the judgement of a task's domain.

- ``gensim`` ``test/test_data/lee.cor`` + ``similarities0-1.txt``: 50 news documents and the mean
  human similarity of every pair (1,225 pairs) → `LeeDocSTS`.

The corpora that training reads too — Lee background, BBC News and its train/test split, ACLSum and its body
paragraphs — and every corpus's domain live in the torch-free floor (`core.corpora`), so training never imports
evaluation for data. The out-of-domain corpora (Bible, Python docstrings) are `evaluation.frozen_corpora`.

**Domains.** `is_in_domain` judges a task by its corpus's domain (`core.corpora.CORPUS_DOMAINS`) against the
domains of the corpora a model was trained on (reports average in-domain and out-of-domain tasks apart).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from core.corpora import DataUnavailableError, corpus_domain, gensim_test_file, read_nonblank_lines


def is_in_domain(source_corpus: str, trained_on: Iterable[str]) -> bool:
    """Whether a task drawing from ``source_corpus`` is in-domain for a model trained on the corpora ``trained_on``
    (none declared, as for a pretrained model whose training data is unknown: every task is out-of-domain)."""
    return corpus_domain(source_corpus) in {corpus_domain(corpus) for corpus in trained_on}


# --- Lee -------------------------------------------------------------------------------------


@functools.cache
def lee_documents() -> tuple[str, ...]:
    """The 50 documents of the Lee corpus that humans rated pairwise."""
    docs = read_nonblank_lines(gensim_test_file("lee.cor"))
    if len(docs) != 50:
        raise DataUnavailableError(f"lee.cor should hold 50 documents, found {len(docs)}")
    return tuple(docs)


@functools.cache
def lee_similarity_matrix() -> tuple[tuple[float, ...], ...]:
    """50 x 50 mean human similarity in [0, 1]; only the upper triangle (i < j) is filled."""
    rows = [
        tuple(float(x) for x in line.split()) for line in read_nonblank_lines(gensim_test_file("similarities0-1.txt"))
    ]
    if len(rows) != 50 or any(len(r) != 50 for r in rows):
        raise DataUnavailableError("similarities0-1.txt should be a 50 x 50 matrix")
    return tuple(rows)


def lee_pairs() -> list[tuple[int, int, float]]:
    """The 1,225 scored pairs ``(i, j, score)`` with ``i < j``."""
    sims = lee_similarity_matrix()
    return [(i, j, sims[i][j]) for i in range(50) for j in range(i + 1, 50)]
