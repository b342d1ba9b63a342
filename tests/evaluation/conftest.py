"""Fixtures for the evaluation tests: a deterministic fake model (known embeddings → known scores)
and a tiny exported bundle."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from evaluation.embedding_model import EmbeddingModel


class FakeModel(EmbeddingModel):
    """Embeds each text with a given function; no layers. Lets tests know the right answer."""

    kind = "fake"

    def __init__(self, name: str, fn: Callable[[str], Sequence[float]], dim: int) -> None:
        self.name = name
        self._fn = fn
        self._dim = dim
        self.calls = 0

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def max_seq_length(self) -> int:
        return 512

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.calls += 1
        rows = np.asarray([self._fn(t) for t in texts], dtype=np.float32).reshape(len(texts), self._dim)
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)

    def _compute_hash(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()


@pytest.fixture
def fake_model_factory() -> Callable[..., FakeModel]:
    return FakeModel


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core machine two spinning
    threads per process slow every forward pass several-fold. Restored after each test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
