"""The teacher's embeddings of the training texts, each computed once and kept — across epochs and across runs.

When both views are the text itself (``views = "texts"``), the frozen teacher's output for a text never changes,
so a text seen again needs no second teacher pass: a 6-layer teacher costs about what the 2-layer student's forward
and backward do together. The embeddings are computed the first time a text is asked for, inside the run's time
budget — embedding the whole corpus up front would cost a full pass even when the budget ends before one epoch.

With a ``store`` folder (``embedder train`` passes ``EMBED_CACHE_DIR/teacher-embeddings``) the vectors also
outlive the run: they are kept in ``<store>/<teacher fingerprint>.npz`` (text SHA-256 → float32 vector), read at
the start of the next run of the same teacher and saved with every checkpoint, so a second seed, another objective
or a resumed run pays the teacher only for texts no run embedded before. The fingerprint covers the teacher's
weights, pooling, normalisation, output layer and token limit: a different teacher never reads another's vectors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from training.encoder import Encoder


def teacher_fingerprint(teacher: Encoder) -> str:
    """SHA-256 (hex, 24 characters) of what decides the teacher's embedding of a text: its weights (the output layer
    included), pooling, normalisation, token limit and vocabulary size."""
    digest = hashlib.sha256()
    digest.update(f"{teacher.pooling}|{teacher.normalize}|{teacher.max_seq_length}|{len(teacher.tokenizer)}".encode())
    for name, tensor in sorted(teacher.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()[:24]


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TeacherTargets:
    """``targets(texts)`` → ``(B, D_t)`` the teacher's embeddings of ``texts``; each distinct text is embedded once.

    ``store``: a folder where the vectors persist between runs of the same teacher (None: this run only).
    """

    def __init__(self, teacher: Encoder, store: Path | None = None) -> None:
        self.teacher = teacher
        self.vectors: dict[str, torch.Tensor] = {}  # text SHA-256 → (D_t,)
        self.path = Path(store) / f"{teacher_fingerprint(teacher)}.npz" if store is not None else None
        self.loaded = 0  # vectors read from the store at the start
        self.computed = 0  # texts this run embedded with the teacher
        self._unsaved = False
        if self.path is not None and self.path.is_file():
            self.vectors = self._read(self.path)
            self.loaded = len(self.vectors)

    def __len__(self) -> int:
        return len(self.vectors)

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        keys = [_text_key(t) for t in texts]
        missing = list(dict.fromkeys((k, t) for k, t in zip(keys, texts, strict=True) if k not in self.vectors))
        if missing:
            new = self.teacher(**self.teacher.tokenize([t for _k, t in missing])).float().cpu()  # (M, D_t)
            self.vectors.update(zip((k for k, _t in missing), new, strict=True))
            self.computed += len(missing)
            self._unsaved = True
        device = self.teacher.device
        return torch.stack([self.vectors[k] for k in keys]).to(device)  # (B, D_t)

    def save(self) -> None:
        """Write the vectors to the store (merged with what another run saved meanwhile), atomically."""
        if self.path is None or not self._unsaved:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        merged = self._read(self.path) if self.path.is_file() else {}
        merged.update(self.vectors)
        keys = list(merged)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, suffix=".npz.tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                np.savez(out, keys=np.array(keys), vectors=torch.stack([merged[k] for k in keys]).numpy())
            os.chmod(temporary, 0o644)  # mkstemp makes it private; the cache is shared like the rest of EMBED_CACHE_DIR
            os.replace(temporary, self.path)  # readers see the old file or the new one, never half of one
        finally:
            Path(temporary).unlink(missing_ok=True)
        self._unsaved = False

    @staticmethod
    def _read(path: Path) -> dict[str, torch.Tensor]:
        with np.load(path, allow_pickle=False) as stored:
            vectors = torch.from_numpy(stored["vectors"].astype(np.float32))
            return dict(zip(stored["keys"].tolist(), vectors, strict=True))
