"""InfoNCE with in-batch negatives — cropping paper ``papers/000`` §3.1, Eq. 1.

Also the SimCSE baseline: SimCSE (``papers/002`` §2.1.1, Eq. 1) is this loss on *dropout* views —
the same text encoded twice in train mode — so it needs no class of its own; the registry maps the
name ``"simcse"`` here and the trainer supplies the views.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training import metrics


class InfoNCE(nn.Module):
    """ℓ_i = −log [ exp(sim(a_i, p_i)/τ) / Σ_{j∈B} exp(sim(a_i, p_j)/τ) ], averaged over the batch.

    Paper 000 §3.1, Eq. 1: sim is cosine similarity; the negatives of anchor a_i are the positives
    p_j (j ≠ i) of the other anchors in the batch, no hard negatives; τ = 0.05 (A.1: 0.005 and 0.05
    tie, SimCLR's 0.5 is worse). Temperature convention: similarities are *divided* by τ.

    ``symmetric=True`` also adds the positives→anchors direction (mean of both); Eq. 1 is one-way,
    the default.

    Inputs:

    =========  ======  ==========================================
    view1      (B, D)  anchors a (any scale; normalised here)
    view2      (B, D)  positives p, row i pairs with view1 row i
    =========  ======  ==========================================

    Returns ``(loss, metrics)`` with ``loss``, ``accuracy`` (anchor's nearest candidate is its
    positive), ``positive_cosine``, ``negative_cosine`` and the collapse diagnostics of
    :func:`training.metrics.embedding_metrics`.

    >>> loss, stats = InfoNCE(temperature=0.05)(torch.eye(4), torch.eye(4))
    >>> stats["accuracy"]
    1.0
    """

    def __init__(self, temperature: float = 0.05, symmetric: bool = False) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 (paper 000 uses 0.05), got {temperature}")
        self.temperature = float(temperature)
        self.symmetric = bool(symmetric)

    def forward(self, view1: Tensor, view2: Tensor, **extra: Tensor) -> tuple[Tensor, dict[str, float]]:
        if view1.shape != view2.shape or view1.ndim != 2 or view1.shape[0] < 2:
            raise ValueError(
                f"InfoNCE needs two (B, D) views of the same shape with B >= 2 (in-batch negatives), "
                f"got {tuple(view1.shape)} and {tuple(view2.shape)}"
            )
        a = F.normalize(view1, dim=-1)  # (B, D)
        p = F.normalize(view2, dim=-1)  # (B, D)
        cos = a @ p.T  # (B, B): cos[i, j] = sim(a_i, p_j)
        targets = torch.arange(cos.shape[0], device=cos.device)
        loss = F.cross_entropy(cos / self.temperature, targets)  # mean_i ℓ_i, Eq. 1
        if self.symmetric:
            loss = 0.5 * (loss + F.cross_entropy(cos.T / self.temperature, targets))
        with torch.no_grad():
            b = cos.shape[0]
            off_diagonal = ~torch.eye(b, dtype=torch.bool, device=cos.device)
            stats = {
                "loss": float(loss),
                "accuracy": metrics.contrastive_accuracy(cos),
                "positive_cosine": float(cos.diagonal().mean()),
                "negative_cosine": float(cos[off_diagonal].mean()),
                **metrics.embedding_metrics(view1, view2),
            }
        return loss, stats
