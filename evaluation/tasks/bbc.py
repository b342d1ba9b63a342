"""BBC News (2,125 distinct articles of the 2,225 files, 5 classes): clustering, a linear probe and kNN accuracy.

The probe and kNN tasks share one seeded, stratified 70/30 split (`core.corpora.bbc_split`):
classifiers fit on the train part and score the test part. Clustering scores every article.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks.classification import AbsTaskClassification
from mteb.abstasks.clustering import AbsTaskClustering
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier

from core import corpora
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_TRAIN_PER_CLASS = 6
FAST_TEST_PER_CLASS = 3
REFERENCE = "http://mlg.ucd.ie/datasets/bbc.html"


def _subset(indices: list[int], per_class: int) -> list[int]:
    _texts, labels = corpora.bbc_articles()
    taken: dict[str, int] = {}
    chosen = []
    for i in indices:
        if taken.get(labels[i], 0) < per_class:
            taken[labels[i]] = taken.get(labels[i], 0) + 1
            chosen.append(i)
    return chosen


def bbc_task_split(fast: bool, seed: int = 0) -> tuple[list[int], list[int]]:
    """Train/test article indices the supervised BBC tasks use (fast: a few per class of each part)."""
    train, test = corpora.bbc_split_indices(seed=seed)
    if fast:
        return _subset(train, FAST_TRAIN_PER_CLASS), _subset(test, FAST_TEST_PER_CLASS)
    return train, test


class _BBCData(OfflineTask):
    revision = "3"  # 2: duplicates dropped, UTF-8 decoding; 3: sampling reseeded per evaluation
    source_corpus = corpora.CORPUS_BBC

    def check_data(self) -> None:
        corpora.bbc_articles()

    def _split_dataset(self) -> DatasetDict:
        texts, labels = corpora.bbc_articles()
        label_ids = {name: i for i, name in enumerate(corpora.BBC_CLASSES)}
        train, test = bbc_task_split(self.fast)
        return DatasetDict(
            {
                part: Dataset.from_dict({"text": [texts[i] for i in idx], "label": [label_ids[labels[i]] for i in idx]})
                for part, idx in (("train", train), ("test", test))
            }
        )


class BBCNewsClustering(_BBCData, AbsTaskClustering):
    """K-means on the embeddings of all 2,125 distinct articles, k = 5; main score: V-measure (points = × 100).

    mteb's fast clustering evaluator runs 10 k-means restarts (different seeds) over all documents
    (``max_fraction_of_documents_to_embed = None``; mteb's default would embed only 4 %) and averages.
    """

    metadata = offline_metadata(
        "BBCNewsClustering",
        "Clustering",
        "v_measure",
        "BBC News articles (5 topical classes) clustered with k-means; V-measure against the classes.",
        REFERENCE,
    )
    max_fraction_of_documents_to_embed = None

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        texts, labels = corpora.bbc_articles()
        if self.fast:
            train, test = bbc_task_split(True)
            indices = sorted(train + test)
        else:
            indices = list(range(len(texts)))
        self.dataset = DatasetDict(
            {
                "test": Dataset.from_dict(
                    {"sentences": [texts[i] for i in indices], "labels": [[labels[i]] for i in indices]}
                )
            }
        )
        self.data_loaded = True


class BBCNewsClassification(_BBCData, AbsTaskClassification):
    """Logistic-regression probe fit on the train part (70 %), accuracy on the test part (30 %)."""

    metadata = offline_metadata(
        "BBCNewsClassification",
        "Classification",
        "accuracy",
        "BBC News topic classification with a logistic-regression probe on frozen embeddings (seeded 70/30 split).",
        REFERENCE,
    )
    evaluator_model = LogisticRegression(max_iter=1000)
    n_experiments = 1
    samples_per_label = 1_000_000  # use the whole train part (mteb undersamples to 8 per label by default)

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = self._split_dataset()
        self.data_loaded = True


class BBCNewsKNN(_BBCData, AbsTaskClassification):
    """kNN accuracy (k = 10, cosine) of test articles against the train part: paper 000 §3.3's (Table 2) metric
    of local coherence, on the same split as the probe."""

    metadata = offline_metadata(
        "BBCNewsKNN",
        "Classification",
        "accuracy",
        "BBC News topic classification by the 10 nearest train articles (cosine), seeded 70/30 split.",
        REFERENCE,
    )
    evaluator_model = KNeighborsClassifier(n_neighbors=10, metric="cosine", algorithm="brute")
    n_experiments = 1
    samples_per_label = 1_000_000

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        self.dataset = self._split_dataset()
        self.data_loaded = True
