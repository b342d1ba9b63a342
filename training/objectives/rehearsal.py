"""Similarity rehearsal: keep a frozen model's view of general text while training on one domain.

A regulariser, added to a run's objective like the MSE anchor (`training.objectives.mse_distillation.EmbeddingAnchor`)
and the rank-reduction term. Each step draws ``batch_size`` texts from a pool of general texts (seeded), embeds them
with the trained model (the gradient flows) and with a frozen ``reference``, and adds

    ``weight · mean_i KL(SR(r_i, R_{−i}, τ) ‖ SR(z_i, Z_{−i}, τ))``

with ``SR(z, D, τ) = softmax_j(sim(z, d_j)/τ)`` over L2-normalised vectors: SCT's distillation loss (``papers/001``
§3.4, Eqs. 1 and 4: the student's similarity-score distribution pulled toward the teacher's) with the batch's other
general texts as the candidates instead of a queue, and one τ for both sides. It holds *relations* — which general
texts are near which — not positions, so the reference may be another model (another width or depth). With
``position_weight`` > 0 it also holds their positions, as SCT's loss is combined with MSE in `sct-tiny`
(docs/RESULTS.md: the relational term alone loses the absolute position the out-of-domain tasks read):

    ``+ position_weight · mean_i ||ẑ_i − r̂_i||²``

(L2-normalised, so ``2 − 2·cos``; the reference's width must be the student's, and its space the student's own — the
base student, or the teacher it was distilled from). /adapt's students keep their own structure of general text by
default (the reference: the base student they start from), or the adapted teacher's, while the crop objective trains
them on the customer's documents. On IMDB their own structure kept 0.6 more points of the six-task out-of-domain
average than no rehearsal at the same in-domain score, and 0.4–0.5 more than the adapted teacher's, for ~90 s more
than the 122 s crop step alone on a 2-core VNNI CPU; the position term (weight 10, their default) kept more on each
of five seeds (+0.31 points on average, BBC clustering averaged over its seeds) for 0.35 in domain (docs/BENCHMARKS.md,
"Adapt: a compact student").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.encoder import Encoder
from training.objectives.mse_distillation import squared_error
from training.objectives.sct import similarity_logits


class SimilarityRehearsal(nn.Module):
    """``term(view1, view2, **texts)`` → ``(weight · KL, metrics)``; the views are ignored (the term draws its own
    general texts). ``student`` is the live model being trained (held, not registered: its parameters are the
    optimiser's and the checkpoint's already); ``reference`` is frozen here, so its embedding of a text never
    changes: each text is embedded by it once, when first drawn, and kept (a pool of 4,000 texts × 384 floats is
    6 MB; over /adapt's 120 steps of 64 the reference embeds ~3,400 texts instead of 7,680). The reference is
    rebuilt from the recipe on resume, never checkpointed; the kept embeddings and where the draw of texts is go into
    the checkpoint (``get_extra_state``): a text embedded in another batch may differ in its last bits, so a resumed
    run rehearses on exactly the vectors and texts an uninterrupted one does."""

    def __init__(
        self,
        student: Encoder,
        reference: Encoder,
        texts: Sequence[str],
        *,
        weight: float,
        batch_size: int = 64,
        temperature: float = 0.05,
        position_weight: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if weight <= 0:
            raise ValueError(f"the rehearsal's weight must be > 0 (0 = no rehearsal), got {weight}")
        if temperature <= 0:
            raise ValueError(f"the rehearsal's temperature must be > 0, got {temperature}")
        if batch_size < 3:
            raise ValueError(f"the rehearsal's batch_size must be >= 3 (each text is scored against the others), "
                             f"got {batch_size}")  # fmt: skip
        if position_weight < 0:
            raise ValueError(f"the rehearsal's position_weight must be >= 0 (0 = relations only), got "
                             f"{position_weight}")  # fmt: skip
        if position_weight and reference.dim != student.dim:
            raise ValueError(f"the rehearsal's position term compares embeddings, but the reference's are "
                             f"{reference.dim}-wide and the student's {student.dim}: use a reference of the student's "
                             "width, or position_weight 0")  # fmt: skip
        self.texts = list(dict.fromkeys(t for t in texts if t.strip()))
        if len(self.texts) < 3:
            raise ValueError(f"the rehearsal needs at least 3 distinct non-empty texts, got {len(self.texts)}")
        self._student = (student,)
        self.reference = reference.eval().requires_grad_(False)
        self.weight, self.batch_size, self.temperature = float(weight), int(batch_size), float(temperature)
        self.position_weight = float(position_weight)
        self.rng = random.Random(seed)
        self._reference_vectors: dict[int, Tensor] = {}  # text index → the reference's L2-normalised embedding

    def get_extra_state(self) -> dict[str, Any]:
        """The draw's position and the kept reference embeddings (torch's hook for state outside the registered
        tensors; the trainer's checkpoint saves it)."""
        kept = list(self._reference_vectors)
        vectors = torch.stack([self._reference_vectors[i] for i in kept]).cpu() if kept else None
        return {"rng": self.rng.getstate(), "indices": kept, "vectors": vectors}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        self.rng.setstate(state["rng"])
        self._reference_vectors = {}
        if state["vectors"] is not None:
            device = next(self.reference.parameters()).device
            vectors = state["vectors"].to(device)
            self._reference_vectors = dict(zip(state["indices"], vectors.unbind(0), strict=True))

    def reference_vectors(self, indices: Sequence[int]) -> Tensor:
        """The reference's normalised embeddings of ``self.texts[i]`` for ``indices``, (len, D_ref): the texts not
        seen before are embedded in one batch and kept."""
        new = [i for i in dict.fromkeys(indices) if i not in self._reference_vectors]
        if new:
            with torch.no_grad():
                vectors = self.reference(**self.reference.tokenize([self.texts[i] for i in new]))
            self._reference_vectors.update(zip(new, F.normalize(vectors, dim=-1).unbind(0), strict=True))
        return torch.stack([self._reference_vectors[i] for i in indices])

    def forward(self, view1: Tensor, view2: Tensor, **extra: object) -> tuple[Tensor, dict[str, float]]:
        indices = self.rng.sample(range(len(self.texts)), min(self.batch_size, len(self.texts)))
        batch = [self.texts[i] for i in indices]
        student = self._student[0]
        z = F.normalize(student(**student.tokenize(batch)), dim=-1)  # (B, D), gradient flows
        r = self.reference_vectors(indices).to(device=z.device, dtype=z.dtype)  # (B, D_ref)
        others = ~torch.eye(len(batch), dtype=torch.bool, device=z.device)  # a text is not its own candidate
        online = similarity_logits(z, z, self.temperature)[others].view(len(batch), -1)  # (B, B−1)
        with torch.no_grad():
            target = similarity_logits(r, r, self.temperature)[others].view(len(batch), -1).softmax(-1)
        kl = F.kl_div(F.log_softmax(online, dim=-1), target, reduction="batchmean")
        if not self.position_weight:
            return self.weight * kl, {"loss": float(kl.detach())}
        position = squared_error(z, r)  # mean_i ||ẑ_i − r̂_i||²
        return self.weight * kl + self.position_weight * position, {
            "loss": float(kl.detach()), "position_loss": float(position.detach())
        }
