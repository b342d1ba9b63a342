"""The registry of objective names the trainer and recipes use (one objective per module here)."""

from __future__ import annotations

from torch import nn

from training.objectives.barlow_twins import BarlowTwins
from training.objectives.cosent import CoSENT
from training.objectives.infonce import InfoNCE
from training.objectives.mse_distillation import MSEDistillation
from training.objectives.rank_reduction import RankReduction
from training.objectives.sct import SCT
from training.objectives.vicreg import VICReg

# "simcse" is InfoNCE on dropout views (papers/002 §2.1.1): the same loss, different views.
# "cosent" is what the trainer runs on scored pairs (a recipe's `pairs`), whatever its `objective`.
OBJECTIVES: dict[str, type[nn.Module]] = {
    "infonce": InfoNCE,
    "simcse": InfoNCE,
    "sct": SCT,
    "barlow_twins": BarlowTwins,
    "vicreg": VICReg,
    "mse_distillation": MSEDistillation,
    "rank_reduction": RankReduction,
    "cosent": CoSENT,
}
