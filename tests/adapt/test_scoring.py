"""The job's kNN check on labelled corpora of any size the API accepts."""

from __future__ import annotations

import pytest

from adapt_worker.scoring import knn_points
from tests.evaluation.conftest import FakeModel


def _by_label(text: str) -> list[float]:
    """Reviews of two conditions, each near its own axis (a per-text tilt keeps the distances apart)."""
    tilt = (sum(map(ord, text)) % 7) / 100
    return [1.0, tilt] if text.startswith("asthma") else [tilt, 1.0]


def test_knn_check_finds_each_documents_label_through_ten_folds() -> None:
    texts = [f"asthma review {i}" for i in range(10)] + [f"migraine review {i}" for i in range(10)]
    labels = ["asthma"] * 10 + ["migraine"] * 10
    assert knn_points(FakeModel("by-label", _by_label, 2), texts, labels) == 100.0


@pytest.mark.parametrize("documents", [2, 3, 6, 11])
def test_knn_check_runs_on_the_smallest_labelled_corpora(documents: int) -> None:
    # Fewer documents than folds: each document is its own fold, k below the training part.
    texts = [f"{'asthma' if i % 2 else 'migraine'} review {i}" for i in range(documents)]
    labels = ["asthma" if i % 2 else "migraine" for i in range(documents)]
    assert 0.0 <= knn_points(FakeModel("by-label", _by_label, 2), texts, labels) <= 100.0
