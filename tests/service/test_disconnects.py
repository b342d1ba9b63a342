"""A client that leaves before its texts run: they are dropped from the queue, never embedded nor counted as served,
and hold no queue place from anyone else (TEI and infinity drop such requests too)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.engine.batcher import Batcher
from service.metrics import ServiceMetrics


def _sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels}")


def _post_and_leave(url: str, path: str, body: dict, *, after: float) -> None:
    """Send a whole request, then close the connection after ``after`` s without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
        )
        time.sleep(after)


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings", "/similarity"])
def test_texts_of_a_client_that_left_are_not_embedded_nor_counted_as_served(make_app, serve, path):
    app = make_app()
    model = {"route": path, "model": "fake-a"}
    with serve(app) as (url, _):
        backend = app.state.engine.models.get("fake-a").backend
        embed, running, release = backend.embed, threading.Event(), threading.Event()

        def held(batch):  # the busy text holds the model until the client that left is counted as gone
            running.set()
            release.wait(30)
            return embed(batch)

        backend.embed = held
        busy = threading.Thread(target=lambda: httpx.post(f"{url}/embed", json={"inputs": "busy"}, timeout=30))
        busy.start()
        try:
            assert running.wait(10)  # the busy text runs; what comes now waits
            gone = ["one two three four five six seven"] * 5  # 9 tokens each: told apart from the busy text's 3
            body = {"inputs": {"source_sentence": gone[0], "sentences": gone}} if path == "/similarity" else (
                {"input": gone} if path == "/v1/embeddings" else {"inputs": gone}
            )  # fmt: skip
            _post_and_leave(url, path, body, after=0.1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                closed = _sample(httpx.get(f"{url}/metrics").text, "embed_request_failures_total", **model,
                                 error_type="client_closed")  # fmt: skip
                if closed:
                    break
                time.sleep(0.02)
        finally:
            release.set()
        busy.join(30)
        after = httpx.post(f"{url}/embed", json={"inputs": "after"}, timeout=30)
        assert after.status_code == 200
        assert backend.batches == [[3], [3]]  # the busy text and the one after it: nothing of the client gone
        metrics = httpx.get(f"{url}/metrics").text
    assert _sample(metrics, "embed_request_failures_total", **model, error_type="client_closed") == 1
    assert _sample(metrics, "embed_embeddings_total", model="fake-a") == 2
    assert _sample(metrics, "embed_queue_depth", model="fake-a") == 0
    assert app.state.engine.admission.in_flight == 0


def test_a_dropped_request_frees_its_queue_places_at_once(publish_fake, tmp_path, fake_backend_cls):
    bundle = publish_fake(tmp_path, "m", max_seq_length=64, delay_s=0.2)
    backend = fake_backend_cls(bundle)

    async def run() -> None:
        batcher = Batcher(
            backend, name="m", max_batch_tokens=40, max_batch_size=4, max_queue_size=6, metrics=ServiceMetrics()
        )
        batcher.start()
        running = batcher.submit(backend.tokenize(["running"]))
        await asyncio.sleep(0.05)
        kept = batcher.submit(backend.tokenize(["kept text"] * 2))
        dropped = batcher.submit(backend.tokenize(["dropped text here"] * 4))  # 5 tokens each
        assert batcher.refusal(1) is not None  # the queue is full
        batcher.cancel(dropped)
        assert dropped.future.cancelled()
        assert batcher.queued == 2 and batcher.waiting_requests == 1
        assert batcher.refusal(4) is None
        await asyncio.gather(running.future, kept.future)
        await batcher.close(timeout=5)

    asyncio.run(run())
    assert backend.batches == [[3], [4, 4]]


def test_the_client_closed_series_exists_at_zero_from_start(make_app):
    """Like every failure kind, a client gone is a series of each served model before any client leaves."""
    from fastapi.testclient import TestClient

    with TestClient(make_app()) as client:
        metrics = client.get("/metrics").text
    for route in ("/embed", "/v1/embeddings", "/similarity"):
        for model in ("fake-a", "fake-b"):
            labels = {"route": route, "model": model, "error_type": "client_closed"}
            assert _sample(metrics, "embed_request_failures_total", **labels) == 0
