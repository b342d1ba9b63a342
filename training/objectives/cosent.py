"""CoSENT — Su (2022), "CoSENT (1): a sentence-vector scheme more effective than Sentence-BERT" (blog post,
kexue.fm/archives/8847, in Chinese): the loss this project uses where TMFT's supervised step (``papers/003`` §3)
fine-tunes a truncated model on scored pairs. The choice is the project's: §3 says only that the two pooled
embeddings are compared with cosine similarity, and the authors' training script regresses that cosine onto the
gold score with MSE.

A ranking form of the cosine loss: it never asks a cosine to reach a target value, only that a pair scored
higher has the higher cosine, which is what retrieval and STS's Spearman correlation measure.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CoSENT(nn.Module):
    """``L = log(1 + Σ_{(i,j): y_i > y_j} exp(λ (cos_j − cos_i)))``, cos_k = cos(u_k, v_k).

    Every pair ``i`` scored higher than a pair ``j`` must have the higher cosine; violations are penalised
    softly, ``λ`` = ``scale`` sharpening the penalty. Scale convention: cosines are *multiplied* by λ (λ = 20,
    Su's value and sentence-transformers' ``CoSENTLoss`` default, is a temperature of 0.05). Only the order of
    the gold scores matters, not their range; a batch with no ordered pair has loss ``log 1 = 0``.

    Inputs:

    =========  ======  ===============================================
    view1      (B, D)  first text of each pair (any scale)
    view2      (B, D)  second text of each pair, row i pairs with row i
    scores     (B,)    gold similarity of each pair (higher = closer)
    =========  ======  ===============================================

    Returns ``(loss, metrics)`` with ``loss``, ``cosine`` (mean pair cosine) and ``ordered_accuracy`` (the
    fraction of ordered pairs ``y_i > y_j`` whose cosines are in the same order; 1.0 when there is none).

    >>> loss, stats = CoSENT()(torch.eye(3), torch.eye(3), scores=torch.zeros(3))
    >>> float(loss)
    0.0
    """

    def __init__(self, scale: float = 20.0) -> None:
        super().__init__()
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"scale must be a positive number (Su 2022 uses 20), got {scale}")
        self.scale = float(scale)

    def forward(
        self, view1: Tensor, view2: Tensor, scores: Tensor | None = None, **extra: Tensor
    ) -> tuple[Tensor, dict[str, float]]:
        if scores is None:
            raise ValueError("CoSENT needs scores: the gold similarity of each (view1, view2) pair")
        if view1.shape != view2.shape or view1.ndim != 2 or scores.shape != view1.shape[:1]:
            raise ValueError(
                f"CoSENT needs two (B, D) views of the same shape and (B,) scores, got {tuple(view1.shape)}, "
                f"{tuple(view2.shape)} and {tuple(scores.shape)}"
            )
        cos = F.cosine_similarity(view1, view2, dim=-1)  # (B,)
        scaled = self.scale * cos  # (B,)
        diff = scaled[None, :] - scaled[:, None]  # (B, B): entry [i, j] = λ (cos_j − cos_i)
        higher = scores[:, None] > scores[None, :]  # (B, B): y_i > y_j
        zero = torch.zeros(1, device=cos.device, dtype=cos.dtype)  # the "1 +" inside the log
        loss = torch.logsumexp(torch.cat([zero, diff[higher]]), dim=0)
        with torch.no_grad():
            ordered = int(higher.sum())
            correct = int((diff[higher] < 0).sum())
            stats = {
                "loss": float(loss),
                "cosine": float(cos.mean()),
                "ordered_accuracy": correct / ordered if ordered else 1.0,
            }
        return loss, stats
