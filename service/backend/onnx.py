"""The production backend: an exported bundle run by `core.runtime.OnnxBundle` (no torch)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from core.engines import load_engine
from core.model_folder import Prompts
from service.backend.base import Backend, ModelInfo, Token, Tokenized
from service.settings import ServiceSettings


def resolve_threads(intra_op_threads: int) -> int:
    """0 means one thread per CPU this process may run on (not onnxruntime's own default)."""
    if intra_op_threads > 0:
        return intra_op_threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class OnnxBackend(Backend):
    """Tokenise with the bundle's fast tokenizer; embed with the engine chosen for this CPU (pooled and normalised
    in the graph, so one `run` gives final embeddings): the fastest candidate that keeps the parity bars on the
    bundle's probes here, or the pinned one (`core.engines.load_engine`); ``info`` says which and why."""

    runs_small_batches_inline = True  # one short text: a graph run of a few milliseconds

    def __init__(
        self,
        bundle_dir: Path,
        *,
        intra_op_threads: int = 0,
        inter_op_threads: int = 1,
        spinning: str = "during-runs",
        serve_int8: bool = True,
        engine: str = "auto",
    ) -> None:
        self.bundle, choice = load_engine(
            bundle_dir,
            engine=engine,
            serve_int8=serve_int8,
            intra_op_threads=resolve_threads(intra_op_threads),
            inter_op_threads=inter_op_threads,
            spinning=spinning,
        )
        manifest = self.bundle.manifest
        self.info = ModelInfo(
            name=self.bundle.name,
            version=self.bundle.version,
            dim=self.bundle.dim,
            max_seq_length=self.bundle.max_seq_length,
            normalized=bool(manifest.get("normalized", True)),
            path=Path(bundle_dir),
            manifest=manifest,
            variant=self.bundle.variant,
            engine=choice.as_dict(),
            prompts=Prompts.from_manifest(manifest),
        )
        # A second tokenizer without truncation, for counting and listing every token: the shared one's settings
        # must not change under other threads. Made here, in the loading thread, so its callers share it without a
        # lock: a small /tokenize runs on the event loop, and must not wait for a large one running in a thread.
        self._whole = Tokenizer.from_str(self.bundle.tokenizer.to_str())
        self._whole.no_truncation()

    def tokenize(self, texts: Sequence[str], direction: str = "right") -> list[Tokenized]:
        return [Tokenized(enc, len(enc), bool(enc.overflowing)) for enc in self.bundle.tokenize(texts, direction)]

    def count_tokens(self, text: str) -> int:
        return len(self._whole.encode(text, add_special_tokens=True))

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        encodings = self._whole.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [
            [
                Token(i, token, True, None, None) if special else Token(i, text[start:stop], False, start, stop)
                for i, token, special, (start, stop) in zip(
                    enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets, strict=True
                )
            ]
            for text, enc in zip(texts, encodings, strict=True)
        ]

    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        return self.bundle.run(self.bundle.pad([item.payload for item in batch]))


def onnx_backend_factory(bundle_dir: Path, settings: ServiceSettings) -> Backend:
    """The app's default `BackendFactory`."""
    return OnnxBackend(
        bundle_dir,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        spinning=settings.ort_spinning,
        serve_int8=settings.serve_int8,
        engine=settings.engine,
    )
