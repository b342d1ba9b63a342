"""What every offline task shares: mteb metadata that never points at a hub, a fast mode, and a
reason to skip when the package holding its data is missing."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np
from mteb.abstasks.task_metadata import TaskMetadata

from core.corpora import DataUnavailableError


def offline_metadata(
    name: str, type_: str, main_score: str, description: str, reference: str | None = None
) -> TaskMetadata:
    """mteb metadata for a task whose ``load_data`` reads package files: ``dataset.path`` is never fetched."""
    return TaskMetadata(
        name=name,
        type=type_,
        main_score=main_score,
        description=description,
        reference=reference,
        dataset={"path": f"local/{name}", "revision": "1"},
        category="t2t",
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        date=None,
        dialect=[],
        domains=[],
        task_subtypes=[],
        license=None,
        annotations_creators=None,
        modalities=["text"],
        sample_creation="found",
        bibtex_citation=None,
    )


class OfflineTask(ABC):
    """Mixin for the mteb task classes below.

    Args:
        fast: a few documents per task, for tests and smoke runs (scores are not comparable to full runs).
        seed: mteb's seed (k-means, classifier initialisation).
    """

    metadata: TaskMetadata
    dataset: Any
    data_loaded: bool
    revision: ClassVar[str] = "1"  # bump when the data or protocol changes: cached results are keyed by it
    # the corpus the task's texts come from (a `core.corpora.CORPUS_*` name): a model trained on any corpus of
    # its domain (`core.corpora.CORPUS_DOMAINS`) is in-domain on this task, and reports average it apart
    source_corpus: str

    def __init__(self, fast: bool = False, seed: int = 42, **kwargs: Any) -> None:
        self.fast = fast
        super().__init__(seed=seed, **kwargs)  # type: ignore[call-arg]

    def evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """mteb's evaluation, from a freshly seeded task RNG every time.

        mteb draws clustering's bootstrap samples (and other sampling) from RNGs created once per task instance,
        so the second model scored by one instance saw different samples than the first: BBCNewsClustering gave
        minilm-l3 66.2 in one run and 70.8 in another, depending on what the instance had scored before. Only the
        task's own RNGs are reset (mteb's ``_set_seed`` would also reseed the global ones, which training relies on).
        """
        self.rng_state = random.Random(self.seed)
        self.np_rng = np.random.default_rng(self.seed)
        return super().evaluate(*args, **kwargs)  # type: ignore[misc]

    @abstractmethod
    def check_data(self) -> None:
        """Raise `DataUnavailableError` when the data cannot be read (cheap: files are read once per process)."""

    def unavailable_reason(self) -> str | None:
        """Why this task cannot run here, or None when its data is installed."""
        try:
            self.check_data()
        except DataUnavailableError as exc:
            return str(exc)
        return None

    @property
    def cache_key(self) -> str:
        """Identifies the exact data and protocol of this task instance, for result caching."""
        return f"{self.metadata.name}-r{self.revision}-{'fast' if self.fast else 'full'}"
