"""The interface the engine needs from a model: five methods, in the spirit of TEI's backend trait.

The engine never sees onnxruntime or tokenizers types: a backend tokenises texts into opaque
`Tokenized` items (the engine only reads their length and whether they were cut), embeds a batch
of them, and can count the tokens of a text it would truncate (for the 422 message).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from core.model_folder import Prompts


class Tokenized(NamedTuple):
    """One text after tokenisation: the backend's own payload, its length (with special tokens), cut or not."""

    payload: Any
    n_tokens: int
    truncated: bool


class Token(NamedTuple):
    """One token of a text as `Backend.tokens` gives it (TEI's ``/tokenize`` fields): its id, its piece of the text
    (the token's own string for a special token), and its character span in the text (None for a special token)."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


@dataclass(frozen=True)
class ModelInfo:
    """What clients and the engine may know about a served model (from the bundle manifest)."""

    name: str
    version: str
    dim: int
    max_seq_length: int
    normalized: bool
    path: Path
    manifest: dict[str, Any] = field(repr=False, default_factory=dict)
    variant: str = "fp32"  # the graph being served: "int8" only where it passed the probe check on this CPU
    engine: dict[str, Any] = field(default_factory=dict)  # `core.engine_choice.EngineChoice.as_dict()`: which and why
    prompts: Prompts = field(default_factory=Prompts)  # put before a request's texts by `service.engine.engine`


class Backend(ABC):
    """A loaded model. Implementations must let `embed` run in a worker thread while `tokenize` runs on
    the event loop (onnxruntime and tokenizers both release the GIL in their native code)."""

    info: ModelInfo
    # Whether a small batch takes a predictable few milliseconds, so a lone one may run on the event loop rather
    # than pay two thread hand-offs (`service.engine.batcher`); off unless a backend says so.
    runs_small_batches_inline: bool = False

    @abstractmethod
    def tokenize(self, texts: Sequence[str], direction: str = "right") -> list[Tokenized]:
        """Token ids per text, truncated to ``info.max_seq_length``: a long text loses its end (``direction``
        "right") or its start ("left"), never its special tokens."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` without truncation (only called for texts that were cut)."""

    @abstractmethod
    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        """Every token of each text, none cut (what ``/tokenize`` answers)."""

    @abstractmethod
    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        """``(len(batch), info.dim)`` float32 embeddings, rows in batch order."""

    def warmup(self) -> None:
        """A few forward passes of typical shapes so the first request pays no lazy initialisation."""
        short = self.tokenize(["warm up the model"] * 8)
        long = self.tokenize(["warm up " * self.info.max_seq_length])
        self.embed(short[:1])
        self.embed(short)
        self.embed(long)

    def close(self) -> None:  # noqa: B027 (optional hook: most backends free everything on garbage collection)
        """Release native resources (called once the model's queue is drained)."""


# (bundle folder, settings) -> loaded backend; the app takes one so tests can plug a fake model in.
BackendFactory = Callable[[Path, Any], Backend]
