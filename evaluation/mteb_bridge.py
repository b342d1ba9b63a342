"""Bridge from an `EmbeddingModel` to mteb's encoder protocol, with a per-run embedding memo.

mteb asks for the same texts several times (an STS document appears in many pairs; the three BBC
tasks share their articles). The memo embeds every distinct text once per model and run. For torch
models it can keep the pooled embedding of *every* layer from the same forward pass, so layer-wise
curves cost no extra encoding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from mteb.models.model_meta import ModelMeta
from mteb.similarity_functions import cos_sim, pairwise_cos_sim
from tqdm.auto import tqdm

from evaluation.embedding_model import EmbeddingModel, NonFiniteEmbeddingError


class EmbeddingMemo:
    """Embeds distinct texts once, in length-sorted batches, with a batch progress bar.

    Args:
        model: the model to run.
        all_layers: keep every layer's pooled embedding (torch models only).
        batch_size: texts per forward pass.
        progress: show a tqdm bar per encoding call.
    """

    def __init__(
        self, model: EmbeddingModel, *, all_layers: bool = False, batch_size: int = 32, progress: bool = True
    ) -> None:
        if all_layers and not model.supports_layers:
            raise TypeError(f"{model.name} ({model.kind}) has no layer-wise embeddings; use a torch checkpoint")
        self.model = model
        self.all_layers = all_layers
        self.batch_size = batch_size
        self.progress = progress
        self._rows: dict[str, np.ndarray] = {}  # text -> (dim,) or (L + 1, dim)

    def _fill(self, texts: Sequence[str]) -> None:
        missing = sorted({t for t in texts if t not in self._rows}, key=len, reverse=True)
        if not missing:
            return
        starts = range(0, len(missing), self.batch_size)
        bar = tqdm(starts, desc=f"embed {self.model.name}", unit="batch", disable=not self.progress, leave=False)
        for start in bar:
            batch = missing[start : start + self.batch_size]
            if self.all_layers:
                out = self.model.encode_layers(batch, batch_size=self.batch_size)  # (L + 1, B, dim)
                self._check_finite(batch, np.isfinite(out).all(axis=(0, 2)))
                for i, text in enumerate(batch):
                    self._rows[text] = out[:, i, :]
            else:
                out = self.model.encode(batch, batch_size=self.batch_size)  # (B, dim)
                self._check_finite(batch, np.isfinite(out).all(axis=1))
                for i, text in enumerate(batch):
                    self._rows[text] = out[i]

    def _check_finite(self, batch: Sequence[str], finite: np.ndarray) -> None:
        """Raise `NonFiniteEmbeddingError` unless every text of ``batch`` has a finite embedding (every layer's)."""
        if finite.all():
            return
        first = batch[int(np.argmin(finite))]
        raise NonFiniteEmbeddingError(
            self.model,
            f"{self.model.name} returned NaN or infinite embeddings for {int((~finite).sum())} of {len(batch)} "
            f"texts in a batch (the first: {first[:60]!r}); diverged weights or an overflow: it cannot be scored",
        )

    def embed(self, texts: Sequence[str], layer: int | None = None) -> np.ndarray:
        """``(N, dim)`` unit rows; ``layer`` picks a layer (0 = embeddings) when the memo keeps all layers."""
        self._fill(texts)
        if not texts:
            return np.zeros((0, self.model.dim), dtype=np.float32)
        if self.all_layers:
            index = -1 if layer is None else layer
            return np.stack([self._rows[t][index] for t in texts])
        if layer is not None:
            raise ValueError("this memo keeps only the final layer; build it with all_layers=True")
        return np.stack([self._rows[t] for t in texts])


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


class MtebEncoder:
    """What ``mteb.evaluate`` calls: embeds the ``text`` field of each batch through an `EmbeddingMemo`."""

    def __init__(self, memo: EmbeddingMemo, layer: int | None = None) -> None:
        self.memo = memo
        self.layer = layer
        model = memo.model
        suffix = "" if layer is None else f"-layer{layer}"
        self.mteb_model_meta = ModelMeta.create_empty(
            overwrites={
                "name": f"local/{_safe_name(model.name)}{suffix}",
                "revision": model.hash[:12],
                "embed_dim": model.dim,
                "max_tokens": model.max_seq_length,
                "similarity_fn_name": "cosine",
                "framework": [],
            }
        )

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: Any = None,
        **kwargs: Any,
    ) -> np.ndarray:
        texts: list[str] = []
        for batch in inputs:
            if "text" not in batch:
                raise ValueError(f"{task_metadata.name}: expected text inputs, got fields {sorted(batch)}")
            texts.extend(batch["text"])
        # mteb's prompt types are "query" and "document" (None for tasks without roles: the default prompt)
        prompt = self.memo.model.prompts.for_role(getattr(prompt_type, "value", prompt_type) or "")
        return self.memo.embed([prompt + text for text in texts] if prompt else texts, self.layer)

    def similarity(self, a: Any, b: Any) -> Any:
        return cos_sim(a, b)

    def similarity_pairwise(self, a: Any, b: Any) -> Any:
        return pairwise_cos_sim(a, b)
