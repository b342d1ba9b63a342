"""MLP projection heads that sit between an encoder and an objective (trained with it, then dropped).

* :class:`SCTProjector` — ``papers/001`` §4.1 "Architecture": the projection head h(·) "contains three
  MLP layers. Each MLP layer has one feed-forward with a ReLU activation function, which is then fed
  into a linear feed-forward layer. The size of the first and second feed-forward layers are uw and
  u", u the output dimension and w = 10 the expansion factor. Reading taken: each of the three blocks
  is ``Linear(·, u·w) → ReLU → Linear(u·w, u)``; the first block takes the encoder dimension, so the
  head also maps a student's embedding into a teacher's space (u = teacher dim).
* :class:`VICRegProjector` — ``papers/004`` §3: for Barlow Twins and VICReg "two linear layers with
  batch normalization and ReLU activation, followed by an additional linear layer, all of dimension
  8192" (Bardes et al. 2022's expander): ``(Linear → BN → ReLU) × 2 → Linear``.
"""

from __future__ import annotations

from torch import Tensor, nn


class SCTProjector(nn.Module):
    """h(·) of SCT (paper 001 §3.1, §4.1): ``layers`` blocks of ``Linear(·, u·w) → ReLU → Linear(u·w, u)``.

    ``(B, in_dim) → (B, out_dim)``.
    """

    def __init__(self, in_dim: int, out_dim: int, expansion: int = 10, layers: int = 3) -> None:
        super().__init__()
        if min(in_dim, out_dim, expansion, layers) < 1:
            raise ValueError(
                f"SCTProjector needs positive sizes, got in_dim={in_dim}, out_dim={out_dim}, "
                f"expansion={expansion}, layers={layers} (paper 001: expansion 10, 3 layers)"
            )
        hidden = out_dim * expansion
        blocks: list[nn.Module] = []
        for i in range(layers):
            blocks += [nn.Linear(in_dim if i == 0 else out_dim, hidden), nn.ReLU(), nn.Linear(hidden, out_dim)]
        self.net = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class VICRegProjector(nn.Module):
    """The Barlow Twins / VICReg expander (paper 004 §3): ``(Linear → BN → ReLU) × 2 → Linear``, all ``width``
    wide. ``(B, in_dim) → (B, width)``. BatchNorm needs B >= 2 in training mode."""

    def __init__(self, in_dim: int, width: int = 2048) -> None:
        super().__init__()
        if in_dim < 1 or width < 1:
            raise ValueError(f"VICRegProjector needs in_dim >= 1 and width >= 1, got {in_dim} and {width}")
        self.net = nn.Sequential(
            nn.Linear(in_dim, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.BatchNorm1d(width),
            nn.ReLU(),
            nn.Linear(width, width),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
