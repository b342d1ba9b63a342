"""``embedder serve`` with the graph's run left out: the same settings, app, tokeniser, padding and engine choice,
but each batch's embeddings are a constant unit vector instead of the engine's ``run``. What a request costs on this
server is then everything the server does around the graph — HTTP, the middleware, validation, tokenising, the
queue, the response. `bench_request_path.py` runs it as its "server, graph skipped" arm: between other arms' graph
runs (caches as cold as a real request finds them) or, with ``--blocks``, back to back (as warm as they get).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/serve_without_graph.py --registry-dir runs/reg --port 8081
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from service.app import create_app
from service.backend.base import Backend, Token, Tokenized
from service.backend.onnx import OnnxBackend, onnx_backend_factory
from service.cli import run_server, settings_from_args
from service.observability import configure_logging
from service.settings import ServiceSettings


class GraphSkipped(Backend):
    """The bundle's own backend (``served``), tokenising and padding as it does, returning a constant unit vector per
    text instead of running the graph."""

    runs_small_batches_inline = OnnxBackend.runs_small_batches_inline

    def __init__(self, served: OnnxBackend) -> None:
        self.served = served
        self.info = served.info

    def tokenize(self, texts: Sequence[str], direction: str = "right") -> list[Tokenized]:
        return self.served.tokenize(texts, direction)

    def count_tokens(self, text: str) -> int:
        return self.served.count_tokens(text)

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        return self.served.tokens(texts, add_special_tokens)

    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        self.served.bundle.pad([item.payload for item in batch])
        return np.full((len(batch), self.info.dim), self.info.dim**-0.5, dtype=np.float32)

    def close(self) -> None:
        self.served.close()


def graph_skipped_factory(bundle_dir: Path, settings: ServiceSettings) -> Backend:
    served = onnx_backend_factory(bundle_dir, settings)
    assert isinstance(served, OnnxBackend)
    return GraphSkipped(served)


def main(argv: list[str] | None = None) -> int:
    settings = settings_from_args(sys.argv[1:] if argv is None else argv)
    configure_logging(settings.log_level, settings.log_format)
    return run_server(create_app(settings, backend_factory=graph_skipped_factory, include_adapt=False), settings)


if __name__ == "__main__":
    raise SystemExit(main())
