"""One interface over everything the evaluation can score: `EmbeddingModel`.

Evaluation defines it and implements it for exported bundles (`OnnxModel`, around
`core.runtime.OnnxBundle`); training implements it for torch checkpoints (`training.torch_model.TorchModel`,
with layer-wise embeddings), so evaluation scores both without importing torch code.

`load_model(spec)` accepts a bundle folder (it holds ``manifest.json``), ``registry:NAME[@VERSION]`` (no
version = the promoted one) or an `EmbeddingModel` (returned as is).

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

from core.catalog import sha256_file
from core.engines import load_engine
from core.model_folder import Prompts
from core.registry import MANIFEST, RegistryError, current_bundle, read_manifest, validate_name
from core.runtime import OnnxBundle

REGISTRY_PREFIX = "registry:"


class ModelSpecError(ValueError):
    """A model spec that names no loadable model."""


class NonFiniteEmbeddingError(ValueError):
    """A model returned NaN or infinite embeddings (diverged weights, an overflow): nothing it embeds can be scored.
    Retrieval would rank the NaN similarities in some order and report a plausible score. ``model``: which one."""

    def __init__(self, model: EmbeddingModel, message: str) -> None:
        super().__init__(message)
        self.model = model


def l2_normalise(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class EmbeddingModel(ABC):
    """A text → unit-vector model the suite, the diagnostics and the speed benchmark can run."""

    name: str
    kind: str
    # what it was loaded from — a folder (resolved), a built-in name — for reports; None when built in memory
    source: str | None = None

    @abstractmethod
    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """``(N, dim)`` float32, L2-normalised rows, in input order."""

    @property
    @abstractmethod
    def dim(self) -> int: ...

    @property
    def prompts(self) -> Prompts:
        """The model's named prompts (sentence-transformers'); `encode` never applies them, `encode_as` does."""
        return Prompts()

    def encode_as(self, texts: Sequence[str], role: str, batch_size: int = 32) -> np.ndarray:
        """`encode` of ``texts`` after the model's prompt for their ``role`` in a retrieval task (``query`` or
        ``document``, `Prompts.for_role`): what a client of the server that names that prompt gets."""
        prompt = self.prompts.for_role(role)
        return self.encode([prompt + text for text in texts] if prompt else texts, batch_size=batch_size)

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
    def trained_on(self) -> tuple[str, ...]:
        """The corpora the model declares it was trained or adapted on (`core.corpora.CORPUS_DOMAINS` names,
        ``custom``, ``adapt:<name>``); empty when none is declared (training data unknown)."""
        return ()

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
            "source": self.source,
            "kind": self.kind,
            "hash": self.hash,
            "dim": self.dim,
            "max_seq_length": self.max_seq_length,
            "num_layers": self.num_layers,
            "trained_on": list(self.trained_on),
        }


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
    def prompts(self) -> Prompts:
        return Prompts.from_manifest(self.bundle.manifest)

    @property
    def trained_on(self) -> tuple[str, ...]:
        return tuple(self.bundle.manifest.get("trained_on") or ())  # bundles exported before it was recorded: none

    @property
    def num_layers(self) -> int | None:
        layers = self.bundle.manifest.get("layers")
        return len(layers) if isinstance(layers, list) else layers

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        return l2_normalise(self.bundle.encode(list(texts), batch_size=batch_size))

    def info(self) -> dict[str, Any]:
        """`EmbeddingModel.info` with the graph scored (``fp32`` or ``int8``) and the engine that ran it."""
        engine = f"{self.bundle.runtime}-{self.bundle.precision}"
        return {**super().info(), "variant": self.bundle.variant, "engine": engine}

    def _compute_hash(self) -> str:
        manifest = self.bundle.manifest
        onnx_file = manifest["onnx"][self.bundle.variant]
        files = manifest.get("files") or {}

        payload = {
            "variant": self.bundle.variant,
            "onnx": files.get(onnx_file) or sha256_file(self.path / onnx_file),
            "tokenizer": files.get("tokenizer.json") or sha256_file(self.path / "tokenizer.json"),
            "max_seq_length": manifest["max_seq_length"],
        }
        if self.prompts.texts:  # the prompts change what `encode_as` scores (none: the key bundles always had)
            payload["prompts"] = [dict(self.prompts.texts), self.prompts.default]
        if self.bundle.runtime != "onnxruntime":  # another engine's vectors differ a little: their own cache key
            payload["engine"] = f"{self.bundle.runtime}-{self.bundle.precision}"
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _load_bundle(path: Path, variant: str | None, threads: int | None) -> OnnxModel:
    threads = threads or os.cpu_count() or 1
    if variant is None:  # the int8 graph where it keeps the parity bars on this CPU, else fp32: the least precise
        # graph the service may serve here, checked without the service's timing rounds (seconds per load)
        model = OnnxModel(load_engine(path, engine="onnxruntime-int8", intra_op_threads=threads)[0])
    else:
        model = OnnxModel(OnnxBundle(path, variant=variant, intra_op_threads=threads))
    model.source = str(path.resolve())  # registry:NAME too: the version folder it named at load
    return model


def _registry_bundle(spec: str, registry_dir: Path | None) -> Path:
    target = spec[len(REGISTRY_PREFIX) :]
    name, _, version = target.partition("@")
    if registry_dir is None:
        raise ModelSpecError(f"{spec!r} names a registry bundle, but no registry folder was given")
    try:
        validate_name(name)
        if not version:
            return current_bundle(registry_dir, name)
        folder = Path(registry_dir) / name / version
        read_manifest(folder)
        return folder
    except (RegistryError, OSError) as exc:
        raise ModelSpecError(
            f"{spec!r}: no such bundle in the registry {registry_dir} ({exc}). "
            "Use registry:NAME for the promoted version or registry:NAME@VERSION; set EMBED_REGISTRY_DIR "
            "to point at another registry."
        ) from exc


def is_bundle_spec(spec: Any) -> bool:
    """True for ``registry:NAME[@VERSION]`` and for a folder holding a bundle manifest."""
    if isinstance(spec, EmbeddingModel) or not isinstance(spec, str | os.PathLike):
        return False
    text = os.fspath(spec)
    return text.startswith(REGISTRY_PREFIX) or (Path(text).expanduser() / MANIFEST).is_file()


def load_model(
    spec: Any, *, registry_dir: Path | None = None, threads: int | None = None, variant: str | None = None
) -> EmbeddingModel:
    """An `EmbeddingModel` as is, or an exported bundle: a folder holding ``manifest.json`` or
    ``registry:NAME[@VERSION]`` (resolved in ``registry_dir``).

    Torch checkpoints and built-in model names are loaded by `training.torch_model.load_any` (evaluation
    scores them through the same interface but never imports torch code).

    Args:
        threads: onnxruntime intra-op threads (default: every core).
        variant: ``fp32`` or ``int8`` for bundles (default: what the service would serve on this CPU: int8 where
            it passes the bundle's probe check, else fp32).

    Raises:
        ModelSpecError: the spec names no bundle; the message says what is accepted.
    """
    if isinstance(spec, EmbeddingModel):
        return spec
    if not is_bundle_spec(spec):
        raise ModelSpecError(
            f"{spec!r} is not an exported bundle (a folder holding {MANIFEST}, or registry:NAME[@VERSION]); "
            "load checkpoints and built-in models with training.torch_model.load_any"
        )
    text = os.fspath(spec)
    if text.startswith(REGISTRY_PREFIX):
        return _load_bundle(_registry_bundle(text, registry_dir), variant, threads)
    return _load_bundle(Path(text).expanduser(), variant, threads)
