"""Plain embedding distillation: the student regresses the teacher's embedding of the same text.

The baseline SCT distillation is measured against (a plain MSE-distilled 2-layer copy of the teacher's first and
last layers already reached 95 %, docs/RESULTS.md); it is the multilingual-distillation loss of Reimers & Gurevych
(2020, §2, Eq. 1: ``1/|B| Σ_j ||M(s_j) − M̂(s_j)||²``) with the teacher M frozen. Both views of a pair are
regressed on their own teacher vectors (they are just two texts here; nothing is contrastive).

Readings: the squared error is summed over dimensions and averaged over the batch, as Eq. 1 writes it (not
``nn.MSELoss``'s mean over elements, which divides the gradient by the dimension); a student whose dimension
differs from the teacher's gets a learned linear map into the teacher's space (dropped after training, as
SCT's projector is), otherwise none.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from training import metrics


def squared_error(x: Tensor, target: Tensor) -> Tensor:
    """Eq. 1's term: ``mean_b ||x_b − target_b||²`` (summed over dimensions); ``target`` gets no gradient."""
    return (x - target.detach()).pow(2).sum(-1).mean()


class MSEDistillation(nn.Module):
    """``loss = ½ (mean_b ||P(view1) − reference1||² + mean_b ||P(view2) − reference2||²)``.

    Inputs: ``view1``/``view2`` ``(B, D_s)`` student embeddings; ``reference1``/``reference2`` ``(B, D_t)``
    the frozen teacher's embeddings of the same texts. Metrics: ``loss``, ``cosine`` (mean student–teacher
    cosine after the map) and the collapse diagnostics of the student embeddings.
    """

    def __init__(self, student_dim: int, reference_dim: int | None = None) -> None:
        super().__init__()
        reference_dim = reference_dim or student_dim
        self.projector: nn.Module = (
            nn.Identity() if reference_dim == student_dim else nn.Linear(student_dim, reference_dim, bias=False)
        )

    def forward(
        self,
        view1: Tensor,
        view2: Tensor,
        reference1: Tensor | None = None,
        reference2: Tensor | None = None,
        **extra: Tensor,
    ) -> tuple[Tensor, dict[str, float]]:
        if reference1 is None or reference2 is None:
            raise ValueError("MSE distillation needs reference1 and reference2: the teacher's embeddings of both views")
        p1, p2 = self.projector(view1), self.projector(view2)  # (B, D_t)
        if p1.shape != reference1.shape or p2.shape != reference2.shape:
            raise ValueError(
                f"student embeddings map to {tuple(p1.shape)} but the teacher's are {tuple(reference1.shape)}: "
                "pass the teacher's dimension as reference_dim"
            )
        loss = 0.5 * (squared_error(p1, reference1) + squared_error(p2, reference2))
        with torch.no_grad():
            cosine = nn.functional.cosine_similarity(p1, reference1, dim=-1).mean()
        return loss, {"loss": float(loss.detach()), "cosine": float(cosine), **metrics.embedding_metrics(view1, view2)}


class EmbeddingAnchor(nn.Module):
    """An MSE anchor to the frozen starting model while fine-tuning, so that it forgets less off the training domain.

    ``weight · mean_b ||z1_b − M₀(first_b)||²`` with ``M₀`` the model as it was before training — the squared error
    of `MSEDistillation` (Reimers & Gurevych 2020, Eq. 1), its teacher being the starting point. Only the first view
    is anchored: one extra forward pass of the frozen model per step instead of two (with the last 2 of 6 layers
    trained, anchoring both views made a /adapt step about twice as slow), and any sample of texts holds the
    geometry in place. Added to the run's objective like the rank-reduction term; the recipe's ``anchor_weight``
    sets ``weight``. The frozen copy is rebuilt from the recipe on resume, never checkpointed.
    """

    def __init__(self, start: nn.Module, weight: float) -> None:
        super().__init__()
        if weight <= 0:
            raise ValueError(f"the anchor's weight must be > 0 (0 = no anchor), got {weight}")
        self.start = start.eval().requires_grad_(False)
        self.weight = float(weight)

    def forward(
        self, view1: Tensor, view2: Tensor, *, first: list[str], **extra: object
    ) -> tuple[Tensor, dict[str, float]]:
        """``view1`` ``(B, D)``: the trained model's embeddings of the texts ``first``; ``view2`` is not anchored."""
        with torch.no_grad():
            anchor = self.start(**self.start.tokenize(first))  # (B, D)
        error = squared_error(view1, anchor)
        with torch.no_grad():
            cosine = nn.functional.cosine_similarity(view1, anchor, dim=-1).mean()
        return self.weight * error, {"loss": float(error.detach()), "cosine": float(cosine)}
