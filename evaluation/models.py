"""One interface over everything the evaluation can score: torch encoders and exported bundles.

`load_model(spec)` accepts

- a built-in name (``minilm-l6``, ``minilm-l3``, ``mpnet-base``) or a Hugging Face folder / training
  checkpoint → a `TorchModel` around `training.encoder.Encoder` (layer-wise embeddings available);
- a bundle folder (it holds ``manifest.json``) or ``registry:NAME[@VERSION]`` (the registry folder
  from settings; no version = the promoted one) → an `OnnxModel` around `core.runtime.OnnxBundle`;
- an `Encoder` or an `EmbeddingModel` object (returned as is / wrapped).

Every model has a ``name``, a content ``hash`` (SHA-256 of its weights and the settings that change
its output), used to cache results, and ``encode(texts, batch_size) -> (N, dim)`` unit-norm rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from core.settings import get_settings

REGISTRY_PREFIX = "registry:"


class ModelSpecError(ValueError):
    """A model spec that names no loadable model."""


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class EmbeddingModel(ABC):
    """A text → unit-vector model the suite, the diagnostics and the speed benchmark can run."""

    name: str
    kind: str

    @abstractmethod
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """``(N, dim)`` float32, L2-normalised rows, in input order."""

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @property
    @abstractmethod
    def max_seq_length(self) -> int: ...

    @abstractmethod
    def _compute_hash(self) -> str: ...

    @cached_property
    def hash(self) -> str:
        """Content hash of the weights and output-changing settings (hex SHA-256)."""
        return self._compute_hash()

    @property
    def supports_layers(self) -> bool:
        return False

    @property
    def num_layers(self) -> int | None:
        return None

    def encode_layers(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """``(L + 1, N, dim)`` pooled embeddings of every layer (layer 0 = embeddings), unit rows."""
        raise TypeError(
            f"{self.name} is a {self.kind} model: layer-wise embeddings need the torch checkpoint, "
            "not an exported bundle (the ONNX graph only outputs the final embedding)"
        )

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "hash": self.hash,
            "dim": self.dim,
            "max_seq_length": self.max_seq_length,
            "num_layers": self.num_layers,
        }


class TorchModel(EmbeddingModel):
    """A `training.encoder.Encoder` (checkpoint or built-in model); gives layer-wise embeddings too."""

    kind = "torch"

    def __init__(self, encoder: Any, name: str | None = None) -> None:
        self.encoder = encoder
        self.name = name or (Path(encoder.source).name if encoder.source else "encoder")

    @property
    def dim(self) -> int:
        return int(self.encoder.dim)

    @property
    def max_seq_length(self) -> int:
        return int(self.encoder.max_seq_length)

    @property
    def supports_layers(self) -> bool:
        return True

    @property
    def num_layers(self) -> int:
        return int(self.encoder.num_layers)

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return _l2_normalise(self.encoder.encode(list(texts), batch_size=batch_size))

    def encode_layers(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return _l2_normalise(self.encoder.encode(list(texts), batch_size=batch_size, all_layers=True))

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
            "vocab": len(enc.tokenizer),
        }
        digest.update(json.dumps(settings, sort_keys=True).encode())
        for key, tensor in sorted(enc.backbone.state_dict().items()):
            if key.startswith("pooler."):  # unused by Encoder; freshly random when the checkpoint has none
                continue
            digest.update(key.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()


class OnnxModel(EmbeddingModel):
    """An exported bundle run by onnxruntime (the serving path)."""

    kind = "onnx"

    def __init__(self, bundle: Any) -> None:
        self.bundle = bundle
        self.name = f"{bundle.name}@{bundle.version}"

    @property
    def path(self) -> Path:
        return Path(self.bundle.path)

    @property
    def dim(self) -> int:
        return int(self.bundle.dim)

    @property
    def max_seq_length(self) -> int:
        return int(self.bundle.max_seq_length)

    @property
    def num_layers(self) -> int | None:
        layers = self.bundle.manifest.get("layers")
        return len(layers) if isinstance(layers, list) else layers

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return _l2_normalise(self.bundle.encode(list(texts), batch_size=batch_size))

    def _compute_hash(self) -> str:
        manifest = self.bundle.manifest
        onnx_file = manifest["onnx"][self.bundle.variant]
        files = manifest.get("files") or {}
        from core.catalog import sha256_file

        payload = {
            "variant": self.bundle.variant,
            "onnx": files.get(onnx_file) or sha256_file(self.path / onnx_file),
            "tokenizer": files.get("tokenizer.json") or sha256_file(self.path / "tokenizer.json"),
            "max_seq_length": manifest["max_seq_length"],
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _bundle_threads() -> int:
    return get_settings().num_threads or os.cpu_count() or 1


def _load_bundle(path: Path, variant: str | None) -> OnnxModel:
    from core.runtime import OnnxBundle, load_checked

    if variant is None:  # what the service would serve on this CPU
        return OnnxModel(load_checked(path, intra_op_threads=_bundle_threads())[0])
    return OnnxModel(OnnxBundle(path, variant=variant, intra_op_threads=_bundle_threads()))


def _registry_bundle(spec: str) -> Path:
    from core.registry import RegistryError, current_bundle, read_manifest, validate_name

    target = spec[len(REGISTRY_PREFIX) :]
    name, _, version = target.partition("@")
    root = get_settings().registry_dir
    try:
        validate_name(name)
        if not version:
            return current_bundle(root, name)
        folder = Path(root) / name / version
        read_manifest(folder)
        return folder
    except (RegistryError, OSError) as exc:
        raise ModelSpecError(
            f"{spec!r}: no such bundle in the registry {root} ({exc}). "
            "Use registry:NAME for the promoted version or registry:NAME@VERSION; set EMBED_REGISTRY_DIR "
            "to point at another registry."
        ) from exc


def load_model(spec: Any, *, device: str = "cpu", variant: str | None = None) -> EmbeddingModel:
    """Load anything the evaluation can score (see the module docstring for the accepted specs).

    Args:
        spec: built-in name, HF folder, bundle folder, ``registry:NAME[@VERSION]``, an ``Encoder``
            or an ``EmbeddingModel``.
        device: torch device for torch encoders.
        variant: ``fp32`` or ``int8`` for bundles (default: what the service would serve on this CPU: int8 where
            it passes the bundle's probe check, else fp32).

    Raises:
        ModelSpecError: the spec names nothing loadable; the message says what is accepted.
    """
    if isinstance(spec, EmbeddingModel):
        return spec
    from training.encoder import Encoder

    if isinstance(spec, Encoder):
        return TorchModel(spec)
    text = os.fspath(spec)
    if text.startswith(REGISTRY_PREFIX):
        return _load_bundle(_registry_bundle(text), variant)
    path = Path(text).expanduser()
    if path.is_dir() and (path / "manifest.json").is_file():
        return _load_bundle(path, variant)
    from core.catalog import ModelNotFoundError

    try:
        encoder = Encoder.from_pretrained(text, device=device)
    except ModelNotFoundError as exc:
        raise ModelSpecError(
            f"{exc}\nBundles are accepted too: a folder holding manifest.json, or registry:NAME[@VERSION]."
        ) from exc
    name = text if path.name == "" or not path.exists() else path.name
    return TorchModel(encoder, name=name)
