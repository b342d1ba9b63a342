"""What /metrics tells an operator about requests beyond the counts: the lengths of long-context models' texts, the
latency of failed requests, and /tokenize's own work."""

from __future__ import annotations

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _bucket(samples: dict, le: str, **labels: str) -> float:
    return samples[tuple(sorted({**labels, "le": le}.items()))]


def test_input_lengths_of_a_long_context_model_land_in_finite_buckets(make_app, publish_fake, fake_registry):
    """A model accepting 8192 tokens (any Hugging Face folder may be served): its texts past 1024 tokens are told
    apart by length up to its limit, not all lumped in +Inf; every bucket exists before the first request."""
    publish_fake(fake_registry, "long", max_seq_length=8192)
    app = make_app(max_batch_tokens=8192, max_input_chars=100_000)
    with TestClient(app) as client:
        before = _samples(client.get("/metrics").text, "embed_input_length_tokens_bucket")
        assert _bucket(before, "8192.0", model="long") == 0
        texts = [" ".join(["w"] * n) for n in (1500, 3000, 9000)]  # 1502, 3002 and 8192 (cut) tokens
        assert client.post("/embed", json={"inputs": texts, "model": "long", "truncate": True}).status_code == 200
        after = _samples(client.get("/metrics").text, "embed_input_length_tokens_bucket")
    counts = {le: _bucket(after, le, model="long") for le in ("1024.0", "2048.0", "4096.0", "8192.0", "+Inf")}
    assert counts == {"1024.0": 0, "2048.0": 1, "4096.0": 2, "8192.0": 3, "+Inf": 3}


def test_failed_requests_are_timed_by_outcome(make_app, publish_fake, fake_registry):
    """How long a 429 was held, or a request ran before its 500 or 503, shows in a histogram of its own (the
    successes' histogram keeps meaning successes), labelled by route and outcome: every series there from the start."""
    publish_fake(fake_registry, "flaky", fail_word="boom", delay_s=0.2)
    app = make_app(overload_hold_seconds=0.3, max_queue_size=8, max_client_batch_size=8)
    name = "embed_request_failure_duration_seconds"
    with TestClient(app, raise_server_exceptions=False) as client:
        before = client.get("/metrics").text
        for route in ("/v1/embeddings", "/embed", "/", "/similarity", "/tokenize"):
            for outcome in ("client_error", "overloaded", "client_closed", "unavailable", "server_error"):
                assert _samples(before, f"{name}_count")[(("outcome", outcome), ("route", route))] == 0
        assert client.post("/embed", json={"inputs": [""]}).status_code == 422
        assert client.post("/embed", json={"inputs": ["a boom"], "model": "flaky"}).status_code == 500
        for served in app.state.engine.models.models():  # every queue full: held at the admission, then refused
            served.batcher._queued = served.batcher._queued_by["anonymous"] = 8
        assert client.post("/embed", json={"inputs": ["held"]}).status_code == 429
        for served in app.state.engine.models.models():
            served.batcher._queued = 0
            served.batcher._queued_by.clear()
        app.state.draining = True
        assert client.post("/embed", json={"inputs": ["late"]}).status_code == 503
        app.state.draining = False
        assert client.post("/embed", json={"inputs": ["fine"]}).status_code == 200
        after = client.get("/metrics").text
    counts, sums = _samples(after, f"{name}_count"), _samples(after, f"{name}_sum")
    expected = {"client_error": 1, "server_error": 1, "overloaded": 1, "unavailable": 1, "client_closed": 0}
    for outcome, n in expected.items():
        assert counts[(("outcome", outcome), ("route", "/embed"))] == n, outcome
    assert sums[(("outcome", "overloaded"), ("route", "/embed"))] >= 0.3  # held for overload_hold_seconds
    assert sums[(("outcome", "server_error"), ("route", "/embed"))] >= 0.2  # ran its batch before failing
    assert sums[(("outcome", "unavailable"), ("route", "/embed"))] < 0.3
    successes = _samples(after, "embed_request_duration_seconds_count")
    assert successes[(("model", "fake-a"), ("route", "/embed"))] == 1  # failures stay out of the successes' histogram
    assert successes[(("model", "flaky"), ("route", "/embed"))] == 0


def test_tokenize_is_timed_and_measured_like_the_embedding_routes(make_settings, fake_backend_cls):
    """/tokenize tokenises: its time is in the tokenisation histogram, its header and its trace, its texts' lengths —
    none cut, so longer than the model takes — in a histogram of their own (the embedded texts' one counts what was
    embedded)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(make_settings(), backend_factory=fake_backend_cls, include_adapt=False, tracer_provider=provider)
    with TestClient(app) as client:
        before = client.get("/metrics").text
        assert _samples(before, "embed_tokenize_input_length_tokens_count")[(("model", "fake-b"),)] == 0
        text = " ".join(["w"] * 40)  # 42 tokens, over fake-a's 16
        answer = client.post("/tokenize", json={"inputs": [text, "a b"]})
        after = client.get("/metrics").text
    assert answer.status_code == 200 and [len(t) for t in answer.json()] == [42, 4]
    assert float(answer.headers["x-tokenization-time"]) >= 0 and float(answer.headers["x-total-time"]) >= 0
    assert _samples(after, "embed_tokenization_seconds_count")[(("model", "fake-a"),)] == 1
    lengths = _samples(after, "embed_tokenize_input_length_tokens_bucket")
    assert _bucket(lengths, "8.0", model="fake-a") == 1 and _bucket(lengths, "64.0", model="fake-a") == 2
    assert _samples(after, "embed_input_length_tokens_count")[(("model", "fake-a"),)] == 0  # nothing was embedded
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert spans["tokenization"].parent.span_id == spans["POST /tokenize"].context.span_id
