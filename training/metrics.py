"""Per-step diagnostics of a batch of embeddings: the signals that expose collapse.

Small pure functions on ``(B, D)`` tensors; all return plain floats except :func:`eigenvalues` and
:func:`eigenvalue_entropy`, which stay differentiable for the rank-reduction regulariser.

* **Effective rank** — ``papers/002`` §2.2.1, Eq. 2: ``erank(H) = exp(−Σ_j λ_j log λ_j)`` with λ_j the
  eigenvalues of ``ZᵀZ/N``, Z the L2-normalised rows of H (so ``tr(ZᵀZ/N) = 1`` and λ is a
  distribution). Ranges from 1 (every row on one line) to ``min(N, D)``.
* **Alignment and uniformity** — Wang & Isola (2020), which ``papers/002`` §3.1 builds on:
  ``align = E_i ‖z_i − z'_i‖²`` (lower = positives closer) and
  ``uniform = log E_{i≠j} exp(−2 ‖z_i − z_j‖²)`` (lower = spread more evenly on the sphere). Paper 002
  plots the temperature-scaled DCL split (Eqs. 3–5) instead; we report the temperature-free original
  so values compare across objectives with different τ.
* **Per-dimension std** of the L2-normalised embeddings (SimSiam's collapse signal): about
  ``1/√D`` for well-spread embeddings, → 0 under complete collapse.
* **Contrastive accuracy** — how often an anchor's most similar candidate is its own positive.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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
def effective_rank(z: Tensor) -> float:
    """``exp(−Σ λ log λ)`` (paper 002 Eq. 2): 1 for collapsed, ``min(N, D)`` for isotropic embeddings."""
    return float(torch.exp(eigenvalue_entropy(z.detach())))


@torch.no_grad()
def per_dimension_std(z: Tensor) -> float:
    """Mean over dimensions of the batch std of the L2-normalised embeddings (≈ 1/√D healthy, 0 collapsed)."""
    _check_batch(z)
    return float(F.normalize(z.detach().float(), dim=-1).std(dim=0).mean())


@torch.no_grad()
def alignment(view1: Tensor, view2: Tensor) -> float:
    """Wang & Isola (2020) alignment ``E_i ‖z_i − z'_i‖²`` on L2-normalised pairs (0 = identical)."""
    a = F.normalize(view1.detach().float(), dim=-1)
    p = F.normalize(view2.detach().float(), dim=-1)
    return float((a - p).pow(2).sum(-1).mean())


@torch.no_grad()
def uniformity(z: Tensor, t: float = 2.0) -> float:
    """Wang & Isola (2020) uniformity ``log E_{i≠j} exp(−t ‖z_i − z_j‖²)`` (t = 2); lower = more uniform."""
    _check_batch(z)
    zn = F.normalize(z.detach().float(), dim=-1)
    return float(torch.pdist(zn).pow(2).mul(-t).exp().mean().log())


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
    return {
        "std": per_dimension_std(both),
        "effective_rank": effective_rank(both),
        "alignment": alignment(view1, view2),
        "uniformity": uniformity(both),
    }
