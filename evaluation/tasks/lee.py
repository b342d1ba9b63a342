"""LeeDocSTS: document-level semantic similarity with human ratings (the only human-scored set offline)."""

from __future__ import annotations

from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks.sts import AbsTaskSTS

from core import corpora
from evaluation import data
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_DOCUMENTS = 12  # 66 pairs


class LeeDocSTS(OfflineTask, AbsTaskSTS):
    """1,225 pairs of the 50 Lee news documents, scored by the mean of human ratings in [0, 1];
    main score: Spearman correlation of cosine similarity (points = ρ × 100).

    Lee, Pincombe & Welsh (2005), shipped in gensim's test data. Documents are whole news articles,
    so models truncate them at their ``max_seq_length``; the ratings are noisy (≈ 10 raters per pair).
    """

    metadata = offline_metadata(
        "LeeDocSTS",
        "STS",
        "cosine_spearman",
        "Lee et al. (2005) 50 news documents, 1,225 pairs with mean human similarity (gensim test data).",
        "https://radimrehurek.com/gensim/auto_examples/tutorials/run_doc2vec_lee.html",
    )
    source_corpus = corpora.CORPUS_LEE
    min_score = 0
    max_score = 1

    def check_data(self) -> None:
        data.lee_documents()
        data.lee_similarity_matrix()

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        docs = data.lee_documents()
        pairs = data.lee_pairs()
        if self.fast:
            pairs = [(i, j, s) for i, j, s in pairs if j < FAST_DOCUMENTS]
        self.dataset = DatasetDict(
            {
                "test": Dataset.from_dict(
                    {
                        "sentence1": [docs[i] for i, _, _ in pairs],
                        "sentence2": [docs[j] for _, j, _ in pairs],
                        "score": [s for _, _, s in pairs],
                    }
                )
            }
        )
        self.data_loaded = True
