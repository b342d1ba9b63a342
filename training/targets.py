"""The teacher's embeddings of the training texts, each computed once and kept.

When both views are the text itself (``views = "texts"``), the frozen teacher's output for a text never changes,
so a text seen again needs no second teacher pass: a 6-layer teacher costs about what the 2-layer student's forward
and backward do together. The embeddings are computed the first time a text is asked for, inside the run's time
budget — embedding the whole corpus up front would cost a full pass even when the budget ends before one epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from training.encoder import Encoder


class TeacherTargets:
    """``targets(texts)`` → ``(B, D_t)`` the teacher's embeddings of ``texts``; each distinct text is embedded once."""

    def __init__(self, teacher: Encoder) -> None:
        self.teacher = teacher
        self.vectors: dict[str, torch.Tensor] = {}  # text → (D_t,)

    def __len__(self) -> int:
        return len(self.vectors)

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        missing = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        if missing:
            new = self.teacher(**self.teacher.tokenize(missing))  # (M, D_t)
            self.vectors.update(zip(missing, new, strict=True))
        return torch.stack([self.vectors[t] for t in texts])  # (B, D_t)
