"""An `Encoder` as evaluation's `EmbeddingModel`: what the suite, the diagnostics and the gates score when the
model is a torch checkpoint (layer-wise embeddings included). Lives in training so evaluation never imports
torch code: evaluation defines the interface, training implements it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.catalog import ModelNotFoundError
from core.model_folder import BEST_DIR, FINAL_DIR, Prompts, read_trained_on
from evaluation.embedding_model import EmbeddingModel, ModelSpecError, is_bundle_spec, l2_normalise, load_model
from training.encoder import Encoder


class TorchModel(EmbeddingModel):
    """A `training.encoder.Encoder` (checkpoint or built-in model); gives layer-wise embeddings too."""

    kind = "torch"

    def __init__(self, encoder: Encoder, name: str | None = None) -> None:
        self.encoder = encoder
        self.name = name or (Path(encoder.source).name if encoder.source else "encoder")

    @property
    def dim(self) -> int:
        return int(self.encoder.dim)

    @property
    def max_seq_length(self) -> int:
        return int(self.encoder.max_seq_length)

    @property
    def prompts(self) -> Prompts:
        return self.encoder.prompts

    @property
    def trained_on(self) -> tuple[str, ...]:
        """From the checkpoint's recipe.json; a built-in model declares none."""
        return tuple(read_trained_on(self.encoder.source)) if self.encoder.source else ()

    @property
    def supports_layers(self) -> bool:
        return True

    @property
    def num_layers(self) -> int:
        return int(self.encoder.num_layers)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return l2_normalise(self.encoder.encode(list(texts), batch_size=batch_size))

    def encode_layers(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return l2_normalise(self.encoder.encode(list(texts), batch_size=batch_size, all_layers=True))

    def _compute_hash(self) -> str:
        digest = hashlib.sha256()
        enc = self.encoder
        settings = {
            "pooling": enc.pooling,
            "normalize": enc.normalize,
            "max_seq_length": enc.max_seq_length,
            "config": {
                k: v
                for k, v in enc.backbone.config.to_dict().items()
                if not k.startswith("_") and k != "transformers_version"  # paths and versions: not content
            },
            "tokenizer": _tokenizer_digest(enc.tokenizer),
        }
        if enc.output is not None:  # a Dense layer after pooling: its shape and activation, its weights below
            settings["output"] = dataclasses.asdict(enc.output.spec)
        if enc.prompts.texts:  # the prompts change what `encode_as` scores (none: the key checkpoints always had)
            settings["prompts"] = [dict(enc.prompts.texts), enc.prompts.default]
        digest.update(json.dumps(settings, sort_keys=True).encode())
        for key, tensor in sorted(enc.backbone.state_dict().items()):
            if key.startswith("pooler."):  # unused by Encoder; freshly random when the checkpoint has none
                continue
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        if enc.output is not None:
            for key, tensor in sorted(enc.output.state_dict().items()):
                digest.update(f"output.{key}".encode())
                digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()


def _tokenizer_digest(tokenizer: Any) -> str:
    """What decides the tokens a text becomes: a fast tokenizer's whole definition (vocabulary, normaliser —
    lower-casing among others —, pre-tokeniser, post-processor), else a slow one's vocabulary and settings."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        settings = {k: v for k, v in tokenizer.init_kwargs.items() if isinstance(v, str | int | float | bool)}
        text = json.dumps([sorted(tokenizer.get_vocab().items()), settings], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def load_any(
    spec: Any,
    *,
    device: str = "cpu",
    registry_dir: Path | None = None,
    threads: int | None = None,
    variant: str | None = None,
) -> EmbeddingModel:
    """Anything the evaluation can score: an `EmbeddingModel` or `Encoder` object, a bundle (folder or
    ``registry:NAME[@VERSION]``, see `evaluation.embedding_model.load_model`), a built-in model name or a Hugging Face
    folder / training checkpoint (a `TorchModel` on ``device``)."""
    if isinstance(spec, Encoder):
        return TorchModel(spec)
    if isinstance(spec, EmbeddingModel) or is_bundle_spec(spec):
        return load_model(spec, registry_dir=registry_dir, threads=threads, variant=variant)
    text = os.fspath(spec)
    try:
        encoder = Encoder.from_pretrained(text, device=device)
    except ModelNotFoundError as exc:
        raise ModelSpecError(
            f"{exc}\nBundles are accepted too: a folder holding manifest.json, or registry:NAME[@VERSION]."
        ) from exc
    path = Path(text).expanduser()
    return TorchModel(encoder, name=text if path.name == "" or not path.exists() else checkpoint_name(path))


def checkpoint_name(folder: Path) -> str:
    """A model folder's name in reports: a training run's ``best``/``final`` named with its run (``sct-tiny/best``),
    so two runs' checkpoints compared side by side are told apart."""
    folder = folder.resolve()
    if folder.name in (BEST_DIR, FINAL_DIR) and folder.parent.name:
        return f"{folder.parent.name}/{folder.name}"
    return folder.name
