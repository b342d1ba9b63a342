"""`OnnxBackend.tokens` and `count_tokens` share one tokenizer without truncation: a small request, which the engine
tokenises on the event loop, never waits for a large one running in a worker thread."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from core import registry
from service.backend.onnx import OnnxBackend


def test_a_small_token_listing_does_not_wait_for_a_large_one_in_another_thread(tiny_registry: Path) -> None:
    backend = OnnxBackend(registry.current_bundle(tiny_registry, "tiny"), intra_op_threads=1, engine="onnxruntime-fp32")
    large = ["word " * 20_000] * 20  # 2 MB of text: a /tokenize request near the body limit, run in a thread
    listed: list[float] = []

    def list_large() -> None:
        started = time.perf_counter()
        backend.tokens(large)
        listed.append(time.perf_counter() - started)

    worker = threading.Thread(target=list_large)
    worker.start()
    time.sleep(0.05)
    started = time.perf_counter()
    small = backend.tokens(["a short text"])  # what the engine runs on the event loop
    waited = time.perf_counter() - started
    count = backend.count_tokens("a short text")
    worker.join()
    assert [token.text for token in small[0][1:-1]] == ["a", "short", "text"] and count == 5
    assert waited < listed[0] / 4, f"the small request waited {waited:.2f} s of the large one's {listed[0]:.2f} s"
