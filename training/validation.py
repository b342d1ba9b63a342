"""Held-out validation during training: the score the trainer selects ``DIR/best`` by and stops early on.

Three kinds, one interface (``metric``, ``evaluate(encoder)``, ``layer_scores(encoder)``):

* `CropPairValidation` — held-out documents (self-supervised runs): crop-pair retrieval, the task the /adapt
  gate and the evaluation reports score, plus the rank diagnostics of the held-out crops (papers/002 §2.2).
* `ScoredPairValidation` — held-out scored pairs (supervised runs): Spearman correlation of the cosines with
  the gold scores.
* `TeacherFidelityValidation` — held-out texts (distilled students): how closely the student reproduces its
  teacher, the mean cosine of the two embeddings of each text. A student is for standing in for its teacher on
  any text, so it is selected by that, not by retrieval in the training domain (which rises, then falls, while
  out-of-domain scores keep rising).

`layer_scores` is TMFT's layer-wise probe (papers/003 §3): the same score for every layer's pooled output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import spearmanr

from core.text import CropRule
from evaluation.diagnostics import alignment, effective_rank, layerwise_scores, uniformity
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import score_task
from evaluation.tasks.crops import CropPairRetrieval
from training.data import ScoredPair
from training.encoder import Encoder
from training.torch_model import TorchModel


class CropPairValidation:
    """Held-out crop-pair retrieval: `evaluation.tasks.CropPairRetrieval` over the held-out documents — one
    crop of each document must retrieve another crop of the same document among all of them. Score = its
    main metric, nDCG@10 in points (0–100), the same number the /adapt gate and the evaluation reports use. The
    crops are cut by ``rule``, the run's own (default: chosen from ``documents``), as the /adapt gate cuts them."""

    metric = "crop_pair_ndcg_at_10"

    def __init__(self, documents: Sequence[str], seed: int, rule: CropRule | None = None) -> None:
        self.task = CropPairRetrieval.from_corpus(list(documents), seed=seed, name="HeldOutCropPairs", rule=rule)
        self.task.crop_pairs()  # fails now, with what to change, when too few documents have two crops

    def evaluate(self, encoder: Encoder) -> dict[str, float]:
        memo = EmbeddingMemo(TorchModel(encoder), progress=False)
        result = score_task(memo, self.task)
        details = result["details"]
        pairs = self.task.crop_pairs()
        first, second = memo.embed([a for a, _ in pairs]), memo.embed([b for _, b in pairs])  # cached: no re-encode
        both = np.concatenate([first, second])
        return {
            self.metric: float(result["score"]),
            "crop_pair_mrr_at_10": 100.0 * float(details.get("mrr_at_10", float("nan"))),
            "crop_pair_recall_at_1": 100.0 * float(details.get("recall_at_1", float("nan"))),
            # papers/002 §2.2: the held-out crops' effective rank, alignment and uniformity
            "effective_rank": effective_rank(both),
            "alignment": alignment(first, second),
            "uniformity": uniformity(both),
        }

    def layer_scores(self, encoder: Encoder) -> list[float]:
        """The score of every layer's pooled output (index 0 = embeddings): TMFT's layer-wise probe."""
        return [float(s) for s in layerwise_scores(TorchModel(encoder), self.task, progress=False)]


class ScoredPairValidation:
    """Held-out scored pairs: Spearman correlation of cosine similarity with the gold score."""

    metric = "pair_spearman"

    def __init__(self, pairs: Sequence[ScoredPair]) -> None:
        self.pairs = list(pairs)

    def _spearman(self, first: np.ndarray, second: np.ndarray) -> float:
        cos = (first * second).sum(-1) / np.maximum(
            np.linalg.norm(first, axis=-1) * np.linalg.norm(second, axis=-1), 1e-12
        )
        value = spearmanr(cos, [p.score for p in self.pairs]).statistic
        return float(0.0 if np.isnan(value) else value)

    def evaluate(self, encoder: Encoder) -> dict[str, float]:
        n = len(self.pairs)
        vectors = encoder.encode([p.text1 for p in self.pairs] + [p.text2 for p in self.pairs], batch_size=64)
        return {self.metric: self._spearman(vectors[:n], vectors[n:])}

    def layer_scores(self, encoder: Encoder) -> list[float]:
        n = len(self.pairs)
        texts = [p.text1 for p in self.pairs] + [p.text2 for p in self.pairs]
        vectors = encoder.encode(texts, batch_size=64, all_layers=True)
        return [self._spearman(layer[:n], layer[n:]) for layer in vectors]


class TeacherFidelityValidation:
    """Held-out texts: mean cosine of the student's and the frozen teacher's embeddings of each text (the
    teacher's are computed once, here). Also reports the Spearman correlation of the two models' pairwise
    similarities over the texts (what retrieval and clustering read; defined whatever the two dimensions)."""

    metric = "teacher_cosine"

    def __init__(self, texts: Sequence[str], teacher: Encoder, max_pairs: int = 20_000, seed: int = 0) -> None:
        if len(texts) < 2:
            raise ValueError(f"teacher-fidelity validation needs at least 2 held-out texts, got {len(texts)}")
        self.texts = list(texts)
        self.targets = teacher.encode(self.texts, batch_size=64)  # (N, D_t)
        n = len(self.texts)
        rng = np.random.default_rng(seed)
        first, second = rng.integers(0, n, size=(2, max_pairs))
        keep = first != second
        self.pairs = first[keep], second[keep]  # random distinct pairs for the similarity correlation

    def _scores(self, vectors: np.ndarray) -> dict[str, float]:
        if vectors.shape[1] != self.targets.shape[1]:
            raise ValueError(
                f"the student's embeddings have {vectors.shape[1]} dimensions, the teacher's {self.targets.shape[1]}: "
                "teacher_cosine compares them directly — give the student an output layer into the teacher's space "
                "or set validation_metric = 'crop_retrieval'"
            )
        student, teacher = _unit(vectors), _unit(self.targets)
        i, j = self.pairs
        correlation = spearmanr((student[i] * student[j]).sum(-1), (teacher[i] * teacher[j]).sum(-1)).statistic
        return {
            self.metric: float((student * teacher).sum(-1).mean()),
            "similarity_spearman": float(0.0 if np.isnan(correlation) else correlation),
        }

    def evaluate(self, encoder: Encoder) -> dict[str, float]:
        return self._scores(encoder.encode(self.texts, batch_size=64))

    def layer_scores(self, encoder: Encoder) -> list[float]:
        layers = encoder.encode(self.texts, batch_size=64, all_layers=True)
        return [self._scores(layer)[self.metric] for layer in layers]


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


Validation = CropPairValidation | ScoredPairValidation | TeacherFidelityValidation
