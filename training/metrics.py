"""Per-step diagnostics of a batch of embeddings: the signals that expose collapse.

Effective rank (``papers/002`` §2.2.1, Eq. 2), alignment and uniformity (Wang & Isola, 2020) are reported with
`evaluation.diagnostics`' numpy definitions — the same numbers the validation and the evaluation reports print —
on the batch detached from the graph. What stays here in torch:

* :func:`eigenvalues` and :func:`eigenvalue_entropy` — the spectrum of ``ZᵀZ/N`` *with gradients*: the
  rank-reduction regulariser (``papers/002`` Eq. 6) differentiates through it, which a numpy copy cannot do.
* **Per-dimension std** of the L2-normalised embeddings (SimSiam's collapse signal): about ``1/√D`` for
  well-spread embeddings, → 0 under complete collapse.
* **Contrastive accuracy** — how often an anchor's most similar candidate is its own positive.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from evaluation.diagnostics import alignment, effective_rank, uniformity


def _check_batch(z: Tensor, name: str = "embeddings") -> None:
    if z.ndim != 2 or z.shape[0] < 2:
        raise ValueError(f"{name} must be a (B, D) tensor with B >= 2, got shape {tuple(z.shape)}")


def eigenvalues(z: Tensor) -> Tensor:
    """Eigenvalues of ``ZᵀZ/N`` for the L2-normalised rows Z of ``z`` (paper 002 Eq. 2), differentiable.

    ``ZᵀZ/N`` (D × D) and ``ZZᵀ/N`` (N × N) share their non-zero eigenvalues, so the smaller Gram matrix
    is decomposed (a 64-row batch of 384-d vectors: 128 × 128 instead of 384 × 384), in float64 with
    ``torch.linalg.eigvalsh``, whose gradients are stable even for repeated eigenvalues. Shape
    ``(min(N, D),)``, ascending, clamped at 0 against round-off; they sum to 1.
    """
    _check_batch(z)
    n, d = z.shape
    zn = F.normalize(z.double(), dim=-1)  # (N, D)
    gram = zn @ zn.T if n <= d else zn.T @ zn  # (min(N, D), min(N, D))
    return torch.linalg.eigvalsh(gram / n).clamp_min(0)


def eigenvalue_entropy(z: Tensor, eps: float = 1e-12) -> Tensor:
    """``−Σ_j λ_j log λ_j`` (paper 002 Eq. 2 inside the exp), differentiable; ``λ log λ → 0`` at λ = 0."""
    lam = eigenvalues(z)
    return -(lam * torch.log(lam.clamp_min(eps))).sum()


@torch.no_grad()
def per_dimension_std(z: Tensor) -> float:
    """Mean over dimensions of the batch std of the L2-normalised embeddings (≈ 1/√D healthy, 0 collapsed)."""
    _check_batch(z)
    return float(F.normalize(z.detach().float(), dim=-1).std(dim=0).mean())


@torch.no_grad()
def contrastive_accuracy(scores: Tensor) -> float:
    """Fraction of rows ``i`` of a ``(B, C)`` score matrix whose maximum is at column ``i`` (the positive)."""
    targets = torch.arange(scores.shape[0], device=scores.device)
    return float((scores.argmax(dim=-1) == targets).float().mean())


@torch.no_grad()
def embedding_metrics(view1: Tensor, view2: Tensor) -> dict[str, float]:
    """The collapse diagnostics every objective adds to its step metrics (on the trainer's embeddings)."""
    _check_batch(view1, "view1")
    both = torch.cat([view1, view2]).detach()  # (2B, D)
    vectors = both.float().cpu().numpy()
    b = view1.shape[0]
    return {
        "std": per_dimension_std(both),
        "effective_rank": effective_rank(vectors),
        "alignment": alignment(vectors[:b], vectors[b:]),
        "uniformity": uniformity(vectors),
    }
