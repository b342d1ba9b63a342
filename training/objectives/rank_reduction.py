"""Rank-reduction regulariser (RR) — ``papers/002`` §4.1, Eq. 6 (effective rank from §2.2.1, Eq. 2).

An add-on term to any objective, on the eigenvalues λ_j of ``ZᵀZ/N`` of the L2-normalised batch
embeddings (they sum to 1, so ``H = −Σ_j λ_j log λ_j`` is an entropy and ``erank = exp(H)``; the paper
follows Kim et al. (2023) and drops the exp). Paper defaults (Appendix B, Tables 6–7): γ = 1e-3 for
SimCSE-BERT-base, grid 1e-3 … 5e-1.

Sign — the reading we took. Eq. 6 is printed as ``L' = L + γ · Σ_j λ_j log λ_j`` = ``L − γ·H``; minimised
with γ > 0 that *raises* the entropy and hence the rank. But the paper says, everywhere else, that
γ > 0 *decreases* rank (Table 1 labels "Decrease (γ > 0)", "Increase (γ < 0)"; Table 2: RR with
γ = 1e-3 takes SimCSE's rank from 324 to 195). The measured effect is what the method is named for,
so we implement the term that does it: ``L' = L + γ · H = L − γ · Σ_j λ_j log λ_j``. γ > 0 lowers
the effective rank, γ < 0 raises it (Table 1's "increase" rows), γ = 0 is off.

Second reading: the paper writes the term for "the representation" of a batch without naming a
view; we stack both views (2B rows) — the batch the contrastive loss sees, and a better estimate of
``ZᵀZ/N`` than one view.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from training import metrics


class RankReduction(nn.Module):
    """``γ · H(λ)``, H = −Σ_j λ_j log λ_j of ``cat(view1, view2)`` (paper 002 Eq. 6, sign as in its
    Tables 1–2: γ > 0 lowers rank). Add its loss to any objective's loss.

    Inputs ``view1`` ``(B, D)`` and optionally ``view2`` ``(B, D)``. Returns ``(term, metrics)`` with
    ``rank_reduction`` (the weighted term), ``eigen_entropy`` (H) and ``effective_rank`` (exp H).
    """

    def __init__(self, gamma: float = 1e-3) -> None:
        super().__init__()
        if not math.isfinite(gamma):
            raise ValueError(f"gamma must be a finite number (paper 002 uses 1e-3; > 0 lowers rank), got {gamma}")
        self.gamma = float(gamma)

    def forward(self, view1: Tensor, view2: Tensor | None = None, **extra: Tensor) -> tuple[Tensor, dict[str, float]]:
        z = view1 if view2 is None else torch.cat([view1, view2])  # (2B, D)
        entropy = metrics.eigenvalue_entropy(z)  # H = −Σ λ log λ, differentiable
        term = self.gamma * entropy
        stats = {
            "rank_reduction": float(term.detach()),
            "eigen_entropy": float(entropy.detach()),
            "effective_rank": float(torch.exp(entropy.detach())),
        }
        return term.to(view1.dtype), stats
