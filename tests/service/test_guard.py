"""What a request meets before the routes (`service.guard.GuardMiddleware`): its id and caller, the key checked before
any capacity is taken, the body's pace bounded, per-key admission metrics, and who-did-what in logs and traces."""

from __future__ import annotations

import json
import socket
import time

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.app import create_app
from service.auth import key_id
from service.observability import JsonFormatter, request_id
from tests.service.conftest import service_log

KEY = "client-key-1"


def _raw(url: str, request: bytes, *, timeout: float = 10) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as conn:
        conn.sendall(request)
        return conn.recv(4096).decode()


def test_a_request_without_a_key_is_refused_before_admission_and_before_its_body(make_app, serve):
    app = make_app(models=["fake-a"], api_keys=KEY, overload_hold_seconds=5, max_queue_size=8, max_client_batch_size=8)
    with serve(app) as (url, _):
        batcher = app.state.engine.models.get("fake-a").batcher
        batcher._queued = batcher._queued_by[key_id(KEY)] = 8  # full: a keyed request would wait at the admission
        started = time.perf_counter()
        # headers promising a body that never comes: answered at once, neither admission nor the body waited for
        head = _raw(url, b"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
        elapsed = time.perf_counter() - started
        batcher._queued = 0
        batcher._queued_by.clear()
        metrics = httpx.get(f"{url}/metrics").text
    assert head.startswith("HTTP/1.1 401") and elapsed < 2
    assert app.state.engine.admission.in_flight == 0
    assert 'embed_request_failures_total{error_type="invalid_api_key",model="-",route="/v1/embeddings"} 1.0' in metrics
    assert 'embed_admissions_total{key_id="anonymous",outcome="admitted"} 0.0' in metrics


def test_a_body_that_does_not_arrive_in_time_is_answered_408_and_frees_its_slot(make_app, serve):
    app = make_app(models=["fake-a"], body_timeout_seconds=0.3, body_min_bytes_per_second=1024)
    with serve(app) as (url, _):
        started = time.perf_counter()
        head = _raw(url, b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100"
                         b"\r\n\r\n{")  # fmt: skip
        elapsed = time.perf_counter() - started
        admission = app.state.engine.admission
        in_flight = admission.in_flight
        ok = httpx.post(f"{url}/embed", json={"inputs": ["still served"]})
    assert head.startswith("HTTP/1.1 408") and "body_timeout_seconds=0.3" in head
    assert 0.3 <= elapsed < 3 and in_flight == 0 and ok.status_code == 200


def test_a_body_that_keeps_its_pace_gets_more_time_than_the_bound(make_app, serve):
    app = make_app(models=["fake-a"], body_timeout_seconds=0.3, body_min_bytes_per_second=64)
    body = json.dumps({"inputs": ["a text sent in slow pieces"] * 4}).encode()
    with serve(app) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
            for start in range(0, len(body), 32):  # 32 bytes every 0.2 s: 160 B/s, above the 64 B/s pace
                conn.sendall(body[start : start + 32])
                time.sleep(0.2)
            head = conn.recv(4096).decode()
    assert head.startswith("HTTP/1.1 200")  # took ~0.8 s in all, past the 0.3 s bound


def test_request_ids_are_echoed_when_safe_and_made_up_when_not(make_app, serve):
    with serve(make_app(models=["fake-a"])) as (url, _):
        given = httpx.post(f"{url}/embed", json={"inputs": "x"}, headers={"x-request-id": "trace-42.a:b"})
        forged = httpx.post(f"{url}/embed", json={"inputs": "x"}, headers={"x-request-id": "x" * 65})
        missing = httpx.get(f"{url}/v1/models")
    assert given.headers["x-request-id"] == "trace-42.a:b"
    assert len(forged.headers["x-request-id"]) == 32 and forged.headers["x-request-id"] != "x" * 65
    assert len(missing.headers["x-request-id"]) == 32
    assert request_id(b"a b") != "a b" and request_id("é".encode()) != "é"


def test_admissions_are_counted_per_key(make_app, serve):
    other = "client-key-2"
    app = make_app(models=["fake-a"], api_keys=f"{KEY},{other}")
    with serve(app) as (url, _):
        for key, n in ((KEY, 3), (other, 1)):
            for _ in range(n):
                response = httpx.post(f"{url}/embed", json={"inputs": "x"}, headers={"authorization": f"Bearer {key}"})
                assert response.status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
    assert f'embed_admissions_total{{key_id="{key_id(KEY)}",outcome="admitted"}} 3.0' in metrics
    assert f'embed_admissions_total{{key_id="{key_id(other)}",outcome="admitted"}} 1.0' in metrics
    assert KEY not in metrics and other not in metrics


def test_a_second_authorization_header_does_not_change_who_the_caller_is(make_app, serve):
    """The guard (admission, counters, logs) and the routes read the same Authorization header, the first: a request
    carrying two is served and counted as the first one's key, whatever the second holds."""
    other = "client-key-2"
    app = make_app(models=["fake-a"], api_keys=f"{KEY},{other}")
    with serve(app) as (url, _):
        headers = [("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {other}")]
        assert httpx.post(f"{url}/embed", json={"inputs": "x"}, headers=headers).status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
    assert f'embed_admissions_total{{key_id="{key_id(KEY)}",outcome="admitted"}} 1.0' in metrics
    assert f'embed_admissions_total{{key_id="{key_id(other)}",outcome="admitted"}} 0.0' in metrics


def test_a_requests_log_line_and_trace_carry_its_request_id_and_key_id(make_settings, fake_backend_cls, serve):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(
        make_settings(models=["fake-a"], api_keys=KEY, access_log=True, log_format="json"),
        backend_factory=fake_backend_cls, include_adapt=False, tracer_provider=provider,
    )  # fmt: skip
    with service_log(JsonFormatter()) as stream, serve(app) as (url, _):
        response = httpx.post(
            f"{url}/v1/embeddings", json={"input": ["a", "b"]},
            headers={"authorization": f"Bearer {KEY}", "x-request-id": "req-1"},
        )  # fmt: skip
    assert response.status_code == 200
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    access = [line for line in lines if line["message"].startswith("POST /v1/embeddings 200")]
    assert access and access[0]["request_id"] == "req-1" and access[0]["key_id"] == key_id(KEY)
    assert KEY not in stream.getvalue()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    server = spans["POST /v1/embeddings"]
    assert server.attributes["embedder.request_id"] == "req-1"
    assert server.attributes["embedder.key_id"] == key_id(KEY)
    assert server.attributes["http.response.status_code"] == 200
    stages = ["admission", "tokenization", "queue", "batch", "response"]
    assert set(stages) <= set(spans)
    for name in stages:
        span = spans[name]
        assert span.parent.span_id == server.context.span_id and span.attributes["embedder.request_id"] == "req-1"
        assert server.start_time <= span.start_time <= span.end_time <= server.end_time
    assert spans["queue"].end_time <= spans["batch"].start_time + 1000  # in order (ns; rounding)


def test_a_span_is_named_by_the_route_a_request_matches_never_by_a_made_up_path(make_settings, fake_backend_cls):
    from fastapi.testclient import TestClient

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(make_settings(), backend_factory=fake_backend_cls, include_adapt=False, tracer_provider=provider)
    with TestClient(app) as client:
        client.get("/v1/models/fake-a")
        client.get("/nope-123")
        client.get("/nope-456")
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == ["GET /v1/models/{model}", "GET unmatched", "GET unmatched"], names
