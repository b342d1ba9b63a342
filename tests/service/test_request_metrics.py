"""What /metrics tells an operator about requests beyond the counts: the lengths of long-context models' texts, the
latency of failed requests, and /tokenize's own work."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


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
