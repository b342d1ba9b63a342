"""Every failure is counted, under a bounded set of labels, and an unexpected one is answered and logged inside its
request's context: what an operator alerting on /metrics and reading the log by request id relies on."""

from __future__ import annotations

import json
import logging
import socket
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.observability import JsonFormatter
from tests.service.conftest import FakeBackend, service_log


def _failures(text: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["route"], s.labels["model"], s.labels["error_type"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "embed_request_failures_total"
    }


def _series(text: str) -> set[str]:
    """Every series of an exposition, by name and labels (values left out)."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_a_failure_on_any_route_is_counted_under_the_route_as_declared(make_app, tmp_path):
    app = make_app(include_adapt=True, api_keys="k", admin_api_keys="admin", adapt_enabled=True,
                   adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")  # fmt: skip
    key, admin = ({"Authorization": f"Bearer {k}"} for k in ("k", "admin"))
    with TestClient(app, raise_server_exceptions=False) as client:
        before = _failures(client.get("/metrics").text)
        answers = [
            client.get("/nowhere/123", headers=key),
            client.post("/embeddings", json={"input": "a"}, headers=key),  # an OpenAI client without /v1
            client.delete("/embed", headers=key),
            client.get("/v1/models/nope", headers=key),
            client.delete("/v1/models/fake-a", headers=key),
            client.get("/v1/models"),
            client.get("/info"),
            client.post("/health"),
            client.get("/adapt", params={"limit": 0}, headers=admin),
            client.post("/adapt", content=b"x", headers={**admin, "content-encoding": "gzip"}),
            client.get("/adapt/job-x", headers=admin),
            client.get("/adapt/job-x", headers=key),
        ]
        after = _failures(client.get("/metrics").text)
    assert [a.status_code for a in answers] == [404, 404, 405, 404, 405, 401, 401, 405, 422, 415, 404, 403]
    expected = {
        ("unmatched", "-", "not_found"): 2,
        ("/embed", "-", "method_not_allowed"): 1,
        ("/v1/models/{model}", "-", "model_not_found"): 1,
        ("/v1/models/{model}", "-", "method_not_allowed"): 1,
        ("/v1/models", "-", "invalid_api_key"): 1,
        ("/info", "-", "invalid_api_key"): 1,
        ("/health", "-", "method_not_allowed"): 1,
        ("/adapt", "-", "invalid_request"): 1,
        ("/adapt", "-", "unsupported_content_encoding"): 1,
        ("/adapt/{job_id}", "-", "job_not_found"): 1,
        ("/adapt/{job_id}", "-", "forbidden"): 1,
    }
    assert {labels: after[labels] - before.get(labels, 0) for labels in after if after[labels] != before.get(labels)} \
        == expected  # fmt: skip
    assert set(expected) <= set(before)  # each series was there, at zero, before the first request


def test_made_up_paths_model_names_prompts_and_keys_add_no_series(make_app, tmp_path):
    """A client that sends thousands of distinct bogus values creates no series: no label takes a value it sent."""
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "a")
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/embed", json={"inputs": "warm"}).status_code == 200
        client.post("/embed", json={"inputs": "x", "model": "warm"})  # every kind of answer once before counting
        before = _series(client.get("/metrics").text)
        for i in range(300):
            bogus = f"bogus-{i}"
            auth = {"Authorization": f"Bearer {bogus}"}
            assert client.post("/v1/embeddings", json={"input": "x", "model": bogus}, headers=auth).status_code == 404
            assert client.post("/tokenize", json={"inputs": "x", "model": bogus}).status_code == 404
            assert client.post("/embed", json={"inputs": "x", "prompt_name": bogus}).status_code == 422
            assert client.get(f"/v1/models/{bogus}").status_code == 404
            assert client.get(f"/{bogus}/{i}").status_code == 404
            assert client.post(f"/{bogus}", json={}).status_code == 404
            assert client.get(f"/adapt/{bogus}").status_code == 404
        after = _series(client.get("/metrics").text)
    assert after == before


class _BrokenTokenizer(FakeBackend):
    def tokens(self, texts, add_special_tokens=True):  # type: ignore[no-untyped-def]
        raise RuntimeError("tokenizer state dump (secret detail that must not reach clients)")


def test_an_unexpected_error_off_the_direct_path_is_answered_and_logged_with_its_request_id(make_settings):
    """/tokenize, /info and an embedding body declared with another JSON type run through FastAPI's routing: an
    exception there is answered inside the request's context, so the 500 carries x-request-id and the traceback's
    log record the same id; it is answered, not re-raised to the server (which would log it a second time)."""
    app = create_app(make_settings(models=["fake-a"]), backend_factory=_BrokenTokenizer, include_adapt=False)
    with service_log(JsonFormatter()) as stream, TestClient(app) as client:  # raises what the app lets out
        before = _failures(client.get("/metrics").text)
        tokenize = client.post("/tokenize", json={"inputs": "a"}, headers={"x-request-id": "rid-tok"})
        app.state.engine.models.models = lambda: 1 / 0
        info = client.get("/info", headers={"x-request-id": "rid-info"})
        after = _failures(client.get("/metrics").text)
    for response, rid in ((tokenize, "rid-tok"), (info, "rid-info")):
        assert response.status_code == 500 and response.headers["x-request-id"] == rid
        assert response.json()["error"] == {"message": "internal error", "type": "server_error", "param": None,
                                            "code": "internal_error"}  # fmt: skip
        assert "secret" not in response.text and "Traceback" not in response.text
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    errors = {r["request_id"]: r for r in records if r["level"] == "error"}
    assert set(errors) == {"rid-tok", "rid-info"}
    assert "secret detail" in errors["rid-tok"]["exception"]
    assert after[("/tokenize", "fake-a", "internal_error")] - before[("/tokenize", "fake-a", "internal_error")] == 1
    assert after[("/info", "-", "internal_error")] - before[("/info", "-", "internal_error")] == 1


def _send_part_and_leave(url: str, path: str, content_type: str) -> None:
    """Headers promising 1,000 bytes, a few of them, then the connection closed."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: 1000\r\n"
                     '\r\n{"inputs": ["a'.encode())  # fmt: skip
        time.sleep(0.2)


def test_a_client_that_leaves_while_sending_its_body_is_counted_as_gone(make_app, serve, tmp_path: Path):
    """Not a malformed request (422) nor, on /adapt, an internal error (500) with a traceback in the log: a client
    gone, in the failure counter and in the access log (499)."""
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "a",
                   access_log=True)  # fmt: skip
    sent = [("/embed", "application/json"), ("/tokenize", "application/json"),
            ("/embed", "application/vnd.api+json"), ("/adapt", "application/json")]  # fmt: skip
    with service_log(logging.Formatter("%(levelname)s %(message)s")) as stream, serve(app) as (url, _):
        for path, content_type in sent:
            _send_part_and_leave(url, path, content_type)
        deadline = time.monotonic() + 10
        while stream.getvalue().count(" 499 ") < len(sent) and time.monotonic() < deadline:
            time.sleep(0.05)
        failures = _failures(httpx.get(f"{url}/metrics").text)
    counted = {labels: value for labels, value in failures.items() if value}
    assert counted == {("/embed", "-", "client_closed"): 2, ("/tokenize", "-", "client_closed"): 1,
                       ("/adapt", "-", "client_closed"): 1}  # fmt: skip
    log = stream.getvalue()
    assert log.count(" 499 ") == len(sent) and "ERROR" not in log, log


def test_a_body_refused_as_it_streams_in_is_counted_once_under_its_own_kind(make_app):
    """/tokenize reads its body through the framework, which turns the guard's refusal into its own 400: that 400 is
    never sent (the guard answers 413), so it must not be counted beside the 413."""
    app = make_app(max_body_bytes=1024)

    def body():  # no Content-Length: the bound is found only as the body streams in
        yield b'{"input": "'
        for _ in range(40):
            yield b"x" * 100
        yield b'"}'

    with TestClient(app) as client:
        before = _failures(client.get("/metrics").text)
        answer = client.post("/tokenize", content=body(), headers={"content-type": "application/json"})
        after = _failures(client.get("/metrics").text)
    assert answer.status_code == 413
    added = {labels: after[labels] - before.get(labels, 0) for labels in after if after[labels] != before.get(labels)}
    assert added == {("/tokenize", "-", "payload_too_large"): 1}
