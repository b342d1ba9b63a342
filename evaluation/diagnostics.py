"""Representation diagnostics from the papers.

- `knn_accuracy` — kNN classification accuracy (k = 10, Euclidean or cosine, 9:1 split): cropping
  paper (000) §3.3, Table 2 and Table S3; `knn_cross_validated_accuracy` — the same 9:1 protocol as repeated
  10-fold cross-validation, every point tested once per repeat (the figure to compare models on a few hundred
  points); `knn_leave_one_out_accuracy` — every point classified once by its k nearest others.
- `effective_rank` — entropy-based effective rank (Roy & Vetterli, 2007) as defined in the rank
  paper (002) §2.2.1, Eq. 2.
- `alignment`, `uniformity` — Wang & Isola's (2020) own measures of the two properties (their Eq. for
  L_align with α = 2 and L_uniform with t = 2).
- `dcl_alignment`, `dcl_uniformity` — the same two properties as the rank paper (002) §3.1 measures them (its Figure
  3): the two terms of the decoupled contrastive loss (Yeh et al., 2022), Eq. 4 and Eq. 5. The paper names Wang &
  Isola for the properties but quantifies them with these, which are not the same numbers.
- `layerwise_scores` — the score of every layer's pooled embedding, layer 0 = the embedding layer, no fine-tuning:
  cropping paper (000) Figure 4b. The TMFT paper (003) §3 / Figure 2 plots STS Spearman per layer *after*
  fine-tuning the model truncated at that layer; a curve of the untuned layers is the cheap look before choosing
  which layers to fine-tune, not that figure's measure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.model_selection import RepeatedKFold, cross_val_score
from sklearn.neighbors import KNeighborsClassifier, NearestNeighbors
from tqdm.auto import tqdm

from evaluation.embedding_model import EmbeddingModel
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import score_task
from evaluation.tasks import resolve_task


def _as_matrix(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (N, dim) matrix, got shape {arr.shape}")
    if not np.isfinite(arr).all():  # else NaN flows through to a NaN measure that reads as a number
        raise ValueError(f"{name} holds NaN or infinite values in {int((~np.isfinite(arr)).any(axis=1).sum())} rows")
    return arr


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _knn_inputs(
    emb: Any, labels: Sequence[Any], k: int, metric: str, n_train: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``emb`` as a matrix and ``labels`` as an array, checked for a kNN classifier fitted on ``n_train`` points."""
    x = _as_matrix(emb, "emb")
    y = np.asarray(labels)
    if len(y) != len(x):
        raise ValueError(f"emb has {len(x)} rows but labels has {len(y)} entries")
    if metric not in ("cosine", "euclidean"):
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}")
    n_train = len(x) - 1 if n_train is None else n_train
    if k > n_train:
        raise ValueError(f"k={k} is larger than the {n_train} training points; lower k or add data")
    return x, y


def _knn_classifier(k: int, metric: str) -> KNeighborsClassifier:
    """The papers' kNN classifier: ``k`` uniformly weighted neighbours, exact (brute-force) search."""
    return KNeighborsClassifier(n_neighbors=k, metric=metric, algorithm="brute")


def knn_accuracy(
    emb: Any,
    labels: Sequence[Any],
    k: int = 10,
    metric: str = "cosine",
    split: float = 0.9,
    seed: int = 0,
) -> float:
    """Accuracy (0-1) of a k-nearest-neighbour classifier: fit on a random ``split`` fraction, test on the rest.

    Paper 000 §3.3 (Table 2): k = 10, Euclidean distance, 9:1 train/test split; cosine gives similar
    values (Table S3). A majority vote over uniformly weighted neighbours (scikit-learn's); a tie between classes
    goes to the first of them in sorted order.
    """
    if not 0.0 < split < 1.0:
        raise ValueError(f"split is the train fraction and must be between 0 and 1, got {split}")
    count = len(_as_matrix(emb, "emb"))
    n_train = round(split * count)
    if n_train < 1 or n_train >= count:
        raise ValueError(f"{count} points cannot be split {split:.2f}:{1 - split:.2f} into non-empty parts")
    x, y = _knn_inputs(emb, labels, k, metric, n_train)
    order = np.random.default_rng(seed).permutation(len(x))
    train, test = order[:n_train], order[n_train:]
    clf = _knn_classifier(k, metric)
    clf.fit(x[train], y[train])
    return float(np.mean(clf.predict(x[test]) == y[test]))


def knn_cross_validated_accuracy(
    emb: Any,
    labels: Sequence[Any],
    k: int = 10,
    metric: str = "cosine",
    folds: int = 10,
    repeats: int = 10,
) -> float:
    """Accuracy (0-1) of `knn_accuracy`'s classifier under ``folds``-fold cross-validation repeated ``repeats`` times
    (scikit-learn's `RepeatedKFold`, seeded), the mean over the ``folds × repeats`` folds.

    With 10 folds each fit is the cropping paper's 9:1 split (000 Table 2), but every point is tested once per repeat:
    a mean over a few seeded random splits tests some points twice and others never, and on a few hundred points
    that draw moves the figure by more than two models differ (five random 9:1 splits of 600 points test 300
    predictions, each worth a third of a point). Ties between classes go as in `knn_accuracy`.
    """
    if folds < 2:
        raise ValueError(f"folds must be at least 2, got {folds}")
    count = len(_as_matrix(emb, "emb"))
    if count < folds:
        raise ValueError(f"{count} points cannot be cut into {folds} folds; lower folds or add data")
    x, y = _knn_inputs(emb, labels, k, metric, smallest_training_part(count, folds))
    cv = RepeatedKFold(n_splits=folds, n_repeats=repeats, random_state=0)
    return float(np.mean(cross_val_score(_knn_classifier(k, metric), x, y, cv=cv)))


def smallest_training_part(count: int, folds: int) -> int:
    """Points the smallest training part holds when ``count`` points are cut into ``folds`` folds (the largest fold
    held out): the most neighbours `knn_cross_validated_accuracy` can ask for."""
    return count - -(-count // folds)


def knn_leave_one_out_accuracy(emb: Any, labels: Sequence[Any], k: int = 10, metric: str = "cosine") -> float:
    """Accuracy (0-1) of a k-nearest-neighbour vote with each point classified by its ``k`` nearest other points.

    Every point is a test point exactly once and nothing is drawn, so on a few hundred points the figure moves
    less than a mean over seeded 9:1 splits (`knn_accuracy`, each of which tests a tenth). A tie between classes
    goes to the tied class with the nearest neighbour, so the embedding decides it, not the classes' sort order
    (with 20 classes and k = 10, ties are common enough to move the figure by points).
    """
    x, y = _knn_inputs(emb, labels, k, metric)
    classes, codes = np.unique(y, return_inverse=True)
    neighbours = codes[NearestNeighbors(n_neighbors=k, metric=metric, algorithm="brute").fit(x).kneighbors()[1]]
    rows = np.arange(len(x))[:, None]
    votes = np.zeros((len(x), len(classes)), dtype=np.int64)
    np.add.at(votes, (rows, neighbours), 1)
    tied = votes[rows, neighbours] == votes.max(axis=1, keepdims=True)  # per neighbour, in distance order
    predicted = neighbours[rows[:, 0], tied.argmax(axis=1)]
    return float(np.mean(predicted == codes))


def effective_rank(emb: Any) -> float:
    """Effective rank of a set of embeddings, paper 002 §2.2.1 Eq. 2.

    ``erank(H) = exp(-Σ_j λ_j log λ_j)`` with ``λ_j`` the eigenvalues of ``ZᵀZ / N``, where the rows
    of Z are the rows of H scaled to unit length (so the eigenvalues sum to 1). Ranges from 1 (all
    embeddings on one line) to min(N, dim) (a flat spectrum).
    """
    z = _unit_rows(_as_matrix(emb, "emb"))  # (N, dim)
    singular = np.linalg.svd(z, compute_uv=False)  # eigenvalues of ZᵀZ are singular²
    lam = singular**2 / z.shape[0]
    lam = lam[lam > 1e-12]
    lam = lam / lam.sum()
    return float(np.exp(-np.sum(lam * np.log(lam))))


def alignment(x: Any, y: Any, alpha: float = 2.0) -> float:
    """Alignment loss of positive pairs, Wang & Isola (2020): ``E ||f(x) - f(y)||₂^α`` on unit vectors.

    Rows ``x[i]`` and ``y[i]`` are two views of the same item. Lower is better (0 = identical views). Not the
    alignment the rank paper (002) §3.1 plots: that is `dcl_alignment`.
    """
    a, b = _unit_rows(_as_matrix(x, "x")), _unit_rows(_as_matrix(y, "y"))
    if a.shape != b.shape:
        raise ValueError(f"x and y must have the same shape, got {a.shape} and {b.shape}")
    return float(np.mean(np.linalg.norm(a - b, axis=1) ** alpha))


def uniformity(x: Any, t: float = 2.0) -> float:
    """Uniformity loss, Wang & Isola (2020): ``log E_{i≠j} exp(-t ||f(x_i) - f(x_j)||₂²)`` on unit vectors.

    Lower (more negative) is more uniform on the hypersphere; 0 means every point coincides. Not the uniformity
    the rank paper (002) §3.1 plots: that is `dcl_uniformity`.
    """
    a = _unit_rows(_as_matrix(x, "x"))
    n = a.shape[0]
    if n < 2:
        raise ValueError("uniformity needs at least two embeddings")
    sq = np.maximum(2.0 - 2.0 * (a @ a.T), 0.0)  # squared distances of unit vectors
    off_diagonal = sq[~np.eye(n, dtype=bool)]
    # log-mean-exp, stable
    values = -t * off_diagonal
    peak = values.max()
    return float(peak + np.log(np.mean(np.exp(values - peak))))


def _dcl_pairs(x: Any, y: Any, tau: float) -> np.ndarray:
    """``(N, N)`` cosine similarities ``h_iᵀh'_j / τ`` of two views (rows of ``x`` and ``y``), checked."""
    a, b = _unit_rows(_as_matrix(x, "x")), _unit_rows(_as_matrix(y, "y"))
    if a.shape != b.shape:
        raise ValueError(f"x and y must have the same shape, got {a.shape} and {b.shape}")
    if a.shape[0] < 2:
        raise ValueError("the decoupled contrastive terms need at least two pairs")
    if not tau > 0:
        raise ValueError(f"tau must be a positive temperature, got {tau}")
    return (a @ b.T) / tau


def dcl_alignment(x: Any, y: Any, tau: float = 0.05) -> float:
    """Alignment loss as the rank paper (002) §3.1 measures it: Eq. 4, ``−E_i[h_iᵀh'_i / τ]``.

    Rows ``x[i]`` and ``y[i]`` are two views of item i. The reading taken: ``h`` are unit vectors (SimCSE's
    cosine similarity, which Eq. 1 writes as ``h_iᵀh'_i``) and τ = 0.05, SimCSE's temperature, which the paper
    keeps. Lower is better; −1/τ when every pair coincides.
    """
    sims = _dcl_pairs(x, y, tau)
    return float(-np.mean(np.diag(sims)))


def dcl_uniformity(x: Any, y: Any, tau: float = 0.05) -> float:
    """Uniformity loss as the rank paper (002) §3.1 measures it: Eq. 5, ``E_i[log Σ_{j≠i} exp(h_iᵀh'_j / τ)]``.

    The negatives of view ``x[i]`` are the other items' second views ``y[j]``, j ≠ i (the decoupled contrastive
    loss leaves the positive out). Same reading of ``h`` and τ as `dcl_alignment`. Lower is more uniform. The
    value grows with log(N − 1): compare sets of the same size (the paper's are training batches).
    """
    sims = _dcl_pairs(x, y, tau)
    n = sims.shape[0]
    off = sims[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    peak = off.max(axis=1, keepdims=True)  # log-sum-exp, stable
    return float(np.mean(peak[:, 0] + np.log(np.sum(np.exp(off - peak), axis=1))))


def layerwise_scores(
    model: EmbeddingModel,
    task_or_fn: Any,
    *,
    fast: bool = False,
    batch_size: int = 32,
    progress: bool = True,
) -> list[float]:
    """Score every layer's pooled embedding; index 0 = the embedding layer.

    Paper 000 Figure 4b (kNN accuracy after each layer, before and after fine-tuning). Paper 003 chooses the
    layer *l* to truncate at by STS Spearman after fine-tuning each truncation (§3, Figure 2, Table 1); these
    scores of the untuned layers show where a model's layers stand before that.

    Args:
        model: an `EmbeddingModel` with layer-wise embeddings (`training.torch_model.TorchModel`).
        task_or_fn: an evaluation task (name, class or instance; scored in points 0-100 with its main
            metric) or a callable ``fn(embed) -> float`` where ``embed(texts) -> (N, dim)`` returns one
            layer's unit-norm embeddings.
        fast: small version of a named task.

    Every text is encoded once (all layers in the same forward pass, ``Encoder.encode(all_layers=True)``).
    """
    memo = EmbeddingMemo(model, all_layers=True, batch_size=batch_size, progress=progress)
    n_layers = int(model.num_layers or 0) + 1
    if callable(task_or_fn) and not isinstance(task_or_fn, type):
        fn: Callable[[Callable[[Sequence[str]], np.ndarray]], float] = task_or_fn
        return [float(fn(lambda texts, layer=layer: memo.embed(list(texts), layer))) for layer in range(n_layers)]

    task = resolve_task(task_or_fn, fast=fast)
    scores = []
    for layer in tqdm(range(n_layers), desc=f"layers {task.metadata.name}", disable=not progress, leave=False):
        scores.append(score_task(memo, task, layer=layer)["score"])
    return scores
