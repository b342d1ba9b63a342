"""Python standard-library documentation: the one-line summary of a docstring retrieves the rest of it, and
summaries cluster by module."""

from __future__ import annotations

import random
from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks.clustering import AbsTaskClustering
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core import corpora
from evaluation import frozen_corpora
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_DOCSTRINGS = 40
FAST_PER_MODULE = 5
CLUSTER_PER_MODULE = 40
CLUSTER_SEED = 0
REFERENCE = "https://docs.python.org/3.11/library/"


class _PyDocData(OfflineTask):
    source_corpus = corpora.CORPUS_PYDOC

    def check_data(self) -> None:
        frozen_corpora.stdlib_docstrings()


class PyDocSummaryRetrieval(_PyDocData, AbsTaskRetrieval):
    """340 queries (a docstring's one-line summary, e.g. "Compare two sequences of lines; generate the delta as a
    unified diff.") over a corpus of the 340 docstring bodies (the prose after the summary, doctest examples
    left out, ≥ 100 characters) of 23 standard-library modules; main score nDCG@10.

    Short query, paragraph document, technical register: the retrieval shape of documentation search.
    """

    metadata = offline_metadata(
        "PyDocSummaryRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Python 3.11 standard-library docstrings: the one-line summary retrieves the rest of its docstring.",
        REFERENCE,
    )

    def docstrings(self) -> list[frozen_corpora.Docstring]:
        chosen = [d for d in frozen_corpora.stdlib_docstrings() if len(d.body) >= frozen_corpora.PYDOC_MIN_BODY_CHARS]
        return chosen[:FAST_DOCSTRINGS] if self.fast else chosen

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        docs = self.docstrings()
        ids = [f"{d.module}:{d.name}" for d in docs]
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": f"q:{i}", "text": d.summary} for i, d in zip(ids, docs, strict=True)]),
            corpus=Dataset.from_list([{"id": i, "text": d.body, "title": ""} for i, d in zip(ids, docs, strict=True)]),
            relevant_docs={f"q:{i}": {i: 1} for i in ids},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


class PyDocModuleClustering(_PyDocData, AbsTaskClustering):
    """K-means on 710 one-line summaries — up to 40 docstrings per module (a seeded sample) of 23
    standard-library modules —, k = 23; main score V-measure against the modules.

    Short technical titles grouped by subject ("Return the median (middle value) of numeric data." →
    statistics, "Move the turtle forward by the specified distance." → turtle). Some modules share a subject
    (imaplib, smtplib, ftplib; tarfile, zipfile), which caps the attainable score below 100.
    """

    metadata = offline_metadata(
        "PyDocModuleClustering",
        "Clustering",
        "v_measure",
        "One-line summaries of Python 3.11 standard-library docstrings clustered by module (23 modules).",
        REFERENCE,
    )
    max_fraction_of_documents_to_embed = None

    def summaries(self) -> list[frozen_corpora.Docstring]:
        """Up to `CLUSTER_PER_MODULE` docstrings per module (fast: `FAST_PER_MODULE`), in selection order."""
        by_module: dict[str, list[int]] = {}
        for i, doc in enumerate(frozen_corpora.stdlib_docstrings()):
            by_module.setdefault(doc.module, []).append(i)
        rng = random.Random(CLUSTER_SEED)
        per_module = FAST_PER_MODULE if self.fast else CLUSTER_PER_MODULE
        chosen = sorted(i for indices in by_module.values() for i in rng.sample(indices, min(per_module, len(indices))))
        return [frozen_corpora.stdlib_docstrings()[i] for i in chosen]

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        docs = self.summaries()
        self.dataset = DatasetDict(
            {"test": Dataset.from_dict({"sentences": [d.summary for d in docs], "labels": [[d.module] for d in docs]})}
        )
        self.data_loaded = True
