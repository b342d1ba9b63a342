"""VICReg — ``papers/004`` §2, Eq. 3 (Bardes et al. 2022), projector from §3.

The terms are Bardes et al.'s Eqs. 1–6, normalised as in their official implementation (facebookresearch/vicreg),
not as the equations are written:

``L = λ · s(Z, Z') + μ · [v(Z) + v(Z')] / 2 + ν · [c(Z) + c(Z')]`` on the projected views, with

* invariance ``s(Z, Z') = (1/B) Σ_b ‖z_b − z'_b‖² / D`` (``F.mse_loss``: the mean over batch × dimensions,
  where Eq. 5 is ``(1/n) Σ ‖z − z'‖²``, D times larger),
* variance ``v(Z) = (1/D) Σ_j max(0, γ − √(Var(z_·j) + ε))`` — a hinge that keeps every dimension's
  std at least γ = 1 (0 once every std ≥ γ),
* covariance ``c(Z) = (1/D) Σ_{i≠j} Cov(Z)_ij²`` — de-correlates the dimensions.

The variance term is averaged over the two branches (``/ 2``), as in that implementation, where Eq. 6 sums them.

Readings taken (paper 004's Eq. 3 symbols and Appendix A values did not survive the conversion):
weights default to Bardes et al.'s λ = 25, μ = 25, ν = 1, γ = 1, ε = 1e-4 (paper 004 A.2 fixes one
weight and scans the other two); those coefficients were tuned under the implementation's normalisation above, which
is why this module follows it rather than Eqs. 5–6 as written. Var and Cov use the unbiased (B − 1) estimate, as the
original.
The projector width defaults to 2048 instead of 8192 for CPU cost — see ``barlow_twins``;
``projector_dim=0`` applies the loss to the embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training import metrics
from training.projectors import VICRegProjector


def variance_term(z: Tensor, target_std: float = 1.0, eps: float = 1e-4) -> Tensor:
    """``v(Z)``: mean over dimensions of ``max(0, γ − √(Var + ε))``; ``(B, D) → ()``."""
    std = torch.sqrt(z.var(dim=0) + eps)  # (D,)
    return F.relu(target_std - std).mean()


def covariance_term(z: Tensor) -> Tensor:
    """``c(Z)``: sum of squared off-diagonal covariances over D; ``(B, D) → ()``."""
    b, d = z.shape
    centered = z - z.mean(0)
    cov = centered.T @ centered / (b - 1)  # (D, D)
    return (cov.pow(2).sum() - torch.diagonal(cov).pow(2).sum()) / d


class VICReg(nn.Module):
    """VICReg loss with its expander (paper 004 Eq. 3, §3).

    Inputs ``view1``, ``view2``: ``(B, D)`` encoder embeddings, B ≥ 2. Returns ``(loss, metrics)`` with
    ``loss``, ``invariance``, ``variance``, ``covariance`` (unweighted terms), in-batch retrieval
    ``accuracy`` of the embeddings and the collapse diagnostics.
    """

    def __init__(
        self,
        input_dim: int,
        projector_dim: int = 2048,
        invariance_weight: float = 25.0,
        variance_weight: float = 25.0,
        covariance_weight: float = 1.0,
        target_std: float = 1.0,
        eps: float = 1e-4,
    ) -> None:
        super().__init__()
        if projector_dim < 0 or input_dim < 1:
            raise ValueError(
                f"need input_dim >= 1 and projector_dim >= 0 (0 = no projector; paper 004 uses 8192), "
                f"got {input_dim} and {projector_dim}"
            )
        weights = {"invariance_weight": invariance_weight, "variance_weight": variance_weight}
        weights["covariance_weight"] = covariance_weight
        negative = [name for name, w in weights.items() if w < 0]
        if negative:
            raise ValueError(f"{', '.join(negative)} must be >= 0 (Bardes et al.: 25, 25, 1)")
        if target_std <= 0 or eps <= 0:
            raise ValueError(f"target_std (γ) and eps must be > 0 (Bardes et al.: 1 and 1e-4), got {target_std}, {eps}")
        self.invariance_weight, self.variance_weight = float(invariance_weight), float(variance_weight)
        self.covariance_weight, self.target_std, self.eps = float(covariance_weight), float(target_std), float(eps)
        self.projector: nn.Module = VICRegProjector(input_dim, projector_dim) if projector_dim else nn.Identity()

    def forward(self, view1: Tensor, view2: Tensor, **extra: Tensor) -> tuple[Tensor, dict[str, float]]:
        if view1.shape != view2.shape or view1.ndim != 2 or view1.shape[0] < 2:
            raise ValueError(
                f"VICReg needs two (B, D) views of the same shape with B >= 2, "
                f"got {tuple(view1.shape)} and {tuple(view2.shape)}"
            )
        za, zb = self.projector(view1), self.projector(view2)  # (B, P) each
        # the official implementation's normalisation (module docstring): MSE over batch × dims,
        # the two branches' variance terms averaged, their covariance terms summed
        invariance = F.mse_loss(za, zb)
        variance = 0.5 * (variance_term(za, self.target_std, self.eps) + variance_term(zb, self.target_std, self.eps))
        covariance = covariance_term(za) + covariance_term(zb)
        loss = (
            self.invariance_weight * invariance + self.variance_weight * variance + self.covariance_weight * covariance
        )
        with torch.no_grad():
            cos = F.normalize(view1, dim=-1) @ F.normalize(view2, dim=-1).T  # (B, B)
            stats = {
                "loss": float(loss),
                "invariance": float(invariance),
                "variance": float(variance),
                "covariance": float(covariance),
                "accuracy": metrics.contrastive_accuracy(cos),
                **metrics.embedding_metrics(view1, view2),
            }
        return loss, stats
