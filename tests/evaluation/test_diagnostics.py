"""Metric functions against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.model_selection import RepeatedKFold

from evaluation.diagnostics import (
    alignment,
    dcl_alignment,
    dcl_uniformity,
    effective_rank,
    knn_accuracy,
    knn_cross_validated_accuracy,
    knn_leave_one_out_accuracy,
    uniformity,
)


def test_knn_accuracy_separated_clusters_is_perfect() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 8)) * 0.05 + np.eye(8)[0] * 5
    b = rng.normal(size=(50, 8)) * 0.05 + np.eye(8)[1] * 5
    emb = np.vstack([a, b])
    labels = ["a"] * 50 + ["b"] * 50
    for metric in ("cosine", "euclidean"):
        assert knn_accuracy(emb, labels, k=10, metric=metric) == 1.0


def test_knn_accuracy_hand_computed_with_flipped_labels() -> None:
    # Points on a line, two classes; one test point's 3 neighbours are 2 "x" and 1 "y".
    emb = np.array([[0.0], [1.0], [2.0], [10.0], [11.0], [1.4], [10.5], [1.6]])
    emb = np.hstack([emb, np.ones((8, 1))])  # avoid zero vectors
    labels = ["x", "x", "y", "y", "y", "x", "y", "y"]
    # split=0.75 with seed 0: find the test rows, then compute the expected accuracy by hand.
    order = np.random.default_rng(0).permutation(8)
    train, test = order[:6], order[6:]
    expected = 0
    for i in test:
        dist = np.abs(emb[train, 0] - emb[i, 0])
        nearest = train[np.argsort(dist, kind="stable")[:3]]
        votes = [labels[j] for j in nearest]
        expected += max(set(votes), key=votes.count) == labels[i]
    assert knn_accuracy(emb, labels, k=3, metric="euclidean", split=0.75, seed=0) == expected / 2


def test_knn_accuracy_errors_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="metric must be 'cosine' or 'euclidean'"):
        knn_accuracy(np.ones((10, 2)), [0] * 10, metric="manhattan")
    with pytest.raises(ValueError, match="labels has 3 entries"):
        knn_accuracy(np.ones((10, 2)), [0, 1, 0])
    with pytest.raises(ValueError, match="k=10 is larger than the 9 training points"):
        knn_accuracy(np.ones((10, 2)), [0] * 10, k=10)


def test_knn_leave_one_out_classifies_each_point_by_its_nearest_others() -> None:
    # On a line with no two distances equal: each point's 3 nearest others, found by hand.
    xs = [0.0, 1.0, 2.3, 10.0, 11.1, 1.4, 10.6, 1.75]
    emb = np.hstack([np.array(xs)[:, None], np.ones((8, 1))])
    labels = ["x", "x", "y", "y", "y", "x", "y", "y"]
    right = 0
    for i in range(8):
        nearest = sorted((j for j in range(8) if j != i), key=lambda j: abs(xs[j] - xs[i]))[:3]
        votes = [labels[j] for j in nearest]
        right += max(set(votes), key=votes.count) == labels[i]
    assert (
        right == 5
    )  # 2.3 (y: 1.75 y, 1.4 x, 1.0 x), 1.4 (x: 1.75 y, 1.0 x, 2.3 y) and 1.75 (y: 1.4 x, 2.3 y, 1.0 x) missed
    assert knn_leave_one_out_accuracy(emb, labels, k=3, metric="euclidean") == right / 8
    # A point is never its own neighbour, even where another point sits on it: a lone "b" among "a"s is missed.
    assert knn_leave_one_out_accuracy(np.ones((4, 2)), ["a", "a", "a", "b"], k=3) == 0.75


def test_knn_cross_validation_tests_every_point_once_per_repeat() -> None:
    # With as many folds as points each fold holds one point: the figure is leave-one-out's (k odd, two classes:
    # no ties), whatever the seeded order, and repeating it changes nothing.
    xs = [0.0, 1.0, 2.3, 10.0, 11.1, 1.4, 10.6, 1.75]
    emb = np.hstack([np.array(xs)[:, None], np.ones((8, 1))])
    labels = ["x", "x", "y", "y", "y", "x", "y", "y"]
    expected = knn_leave_one_out_accuracy(emb, labels, k=3, metric="euclidean")
    assert expected == 5 / 8
    for repeats in (1, 3):
        assert knn_cross_validated_accuracy(emb, labels, k=3, metric="euclidean", folds=8, repeats=repeats) == expected
    # Two folds of four: each point is classified by the 3 nearest of the other fold's four points, by hand.
    right = 0
    for train, test in RepeatedKFold(n_splits=2, n_repeats=1, random_state=0).split(emb):
        for i in test:
            votes = [labels[j] for j in sorted(train, key=lambda j: abs(xs[j] - xs[i]))[:3]]
            right += max(set(votes), key=votes.count) == labels[i]
    assert knn_cross_validated_accuracy(emb, labels, k=3, metric="euclidean", folds=2, repeats=1) == right / 8


def test_knn_cross_validation_errors_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="folds must be at least 2"):
        knn_cross_validated_accuracy(np.ones((10, 2)), [0] * 10, k=1, folds=1)
    with pytest.raises(ValueError, match="5 points cannot be cut into 10 folds"):
        knn_cross_validated_accuracy(np.ones((5, 2)), [0] * 5, k=1)
    with pytest.raises(ValueError, match="k=10 is larger than the 9 training points"):
        knn_cross_validated_accuracy(np.ones((10, 2)), [0] * 10, k=10)


def test_knn_leave_one_out_ties_go_to_the_tied_class_with_the_nearest_neighbour() -> None:
    # k=2 on a line. 0.0 (b) sees 1.0 b and 1.7 a: a tie, won by b, the nearer (sort order would say a). 1.0 (b)
    # sees 1.7 a and 0.0 b: a tie won by a (wrong). 1.7 (a) sees 1.0 b and 0.0 b (wrong); 5.0 and 5.5 see a's.
    emb = np.hstack([np.array([[0.0], [1.0], [1.7], [5.0], [5.5]]), np.ones((5, 1))])
    assert knn_leave_one_out_accuracy(emb, ["b", "b", "a", "a", "a"], k=2, metric="euclidean") == 0.6
    with pytest.raises(ValueError, match="k=5 is larger than the 4 training points"):
        knn_leave_one_out_accuracy(emb, ["b", "b", "a", "a", "a"], k=5)


def test_effective_rank_of_known_spectra() -> None:
    assert effective_rank(np.eye(16)) == pytest.approx(16.0)
    assert effective_rank(np.tile([[3.0, 4.0, 0.0]], (7, 1))) == pytest.approx(1.0)
    # rows e1, e1, e1, e2 -> eigenvalues (3/4, 1/4)
    z = np.array([[1.0, 0], [2.0, 0], [0.5, 0], [0, 7.0]])
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert effective_rank(z) == pytest.approx(expected)


def test_alignment_of_known_points() -> None:
    x = np.array([[1.0, 0.0], [0.0, 2.0]])
    assert alignment(x, x) == pytest.approx(0.0)
    assert alignment(x, -x) == pytest.approx(4.0)  # antipodal unit vectors: squared distance 4
    assert alignment(x, np.array([[0.0, 1.0], [0.0, 1.0]])) == pytest.approx(1.0)  # (2 + 0) / 2
    with pytest.raises(ValueError, match="same shape"):
        alignment(x, x[:1])


def test_uniformity_of_known_points() -> None:
    assert uniformity(np.array([[1.0, 0.0], [-1.0, 0.0]]), t=2) == pytest.approx(-8.0)
    assert uniformity(np.ones((5, 3)), t=2) == pytest.approx(0.0)
    square = np.array([[1.0, 0], [0, 1.0], [-1.0, 0], [0, -1.0]])
    # each point: two neighbours at squared distance 2, one at 4
    assert uniformity(square, t=1) == pytest.approx(math.log((2 * math.exp(-2) + math.exp(-4)) / 3))
    with pytest.raises(ValueError, match="at least two"):
        uniformity(np.ones((1, 3)))


def test_dcl_alignment_and_uniformity_are_paper_002_eq_4_and_5() -> None:
    # Views h_i (rows of x) and h'_i (rows of y), scaled to unit rows; tau = 0.5.
    x = np.array([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    y = np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.6, 0.8]])
    # h_iᵀh'_j: row i of x against row j of y
    #   i=0: (1, 1, 0)   i=1: (0, 0, 0.6)   i=2: (0, 0, 0.8)
    tau = 0.5
    # Eq. 4: -E_i[h_iᵀh'_i / tau] = -(1 + 0 + 0.8) / 3 / 0.5
    assert dcl_alignment(x, y, tau=tau) == pytest.approx(-(1 + 0 + 0.8) / 3 / tau)
    # Eq. 5: E_i[log Σ_{j≠i} exp(h_iᵀh'_j / tau)], the positive j = i left out
    expected = (
        math.log(math.exp(1 / tau) + math.exp(0 / tau))  # i=0: j=1, 2
        + math.log(math.exp(0 / tau) + math.exp(0.6 / tau))  # i=1: j=0, 2
        + math.log(math.exp(0 / tau) + math.exp(0 / tau))  # i=2: j=0, 1
    ) / 3
    assert dcl_uniformity(x, y, tau=tau) == pytest.approx(expected)
    # They are not Wang & Isola's numbers, which the paper cites for the properties only.
    assert dcl_alignment(x, y, tau=tau) != pytest.approx(alignment(x, y))
    # Stable at any temperature: exp(1 / 0.001) overflows a float unless the sum is taken in log space.
    assert math.isfinite(dcl_uniformity(x, y, tau=0.001))
    with pytest.raises(ValueError, match="same shape"):
        dcl_alignment(x, y[:2])
    with pytest.raises(ValueError, match="at least two pairs"):
        dcl_uniformity(x[:1], y[:1])
    with pytest.raises(ValueError, match="positive temperature"):
        dcl_uniformity(x, y, tau=0.0)
