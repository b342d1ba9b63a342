"""What of a client's request reaches the log and comes back in an error: a line of the log is one record whatever
the path asked for (no forged lines, no terminal escapes), and an error quotes what was sent only in part."""

from __future__ import annotations

import logging
import socket

from fastapi.testclient import TestClient

from service.errors import MAX_MESSAGE_CHARS
from service.observability import TEXT_FORMAT
from tests.service.conftest import service_log

FORGED = "2026-01-01 00:00:00,000 INFO service: forged"


def _raw(url: str, request: bytes) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096).decode()


def test_a_path_with_newlines_and_escapes_stays_on_its_own_access_log_line(make_app, serve):
    app = make_app(models=["fake-a"], access_log=True)
    with service_log(logging.Formatter(TEXT_FORMAT)) as stream, serve(app) as (url, _):
        # uvicorn decodes the path: %0a is a newline, %1b the escape that starts a terminal's colour code
        head = _raw(url, b"GET /x%0d%0a" + FORGED.replace(" ", "%20").encode() + b"%1b[31m HTTP/1.1\r\n"
                         b"host: localhost\r\n\r\n")  # fmt: skip
    assert head.startswith("HTTP/1.1 404")
    lines = stream.getvalue().splitlines()
    access = [line for line in lines if " GET /x" in line]
    assert len(access) == 1 and access[0].endswith(" ms") and " 404 " in access[0]
    assert not any(line.startswith(FORGED) for line in lines)
    assert "\x1b" not in stream.getvalue() and "\r" not in stream.getvalue()
    assert "/x%0D%0A2026-01-01%2000" in access[0]  # percent-encoded as it was sent


def test_an_error_quotes_a_huge_value_only_in_part(make_app):
    huge = "m" * 3_000_000
    with TestClient(make_app(), raise_server_exceptions=False) as client:
        model = client.post("/v1/embeddings", json={"input": "x", "model": huge})
        prompt = client.post("/embed", json={"inputs": "x", "prompt_name": huge})
    assert model.status_code == 404 and model.json()["error"]["code"] == "model_not_found"
    assert prompt.status_code == 422
    for response in (model, prompt):
        message = response.json()["error"]["message"]
        assert len(response.content) < 2 * MAX_MESSAGE_CHARS and len(message) <= MAX_MESSAGE_CHARS
        assert "characters left out" in message
    message = model.json()["error"]["message"]
    assert message.startswith("model 'mmm") and message.endswith("served models: fake-a, fake-b")


def test_an_adapt_error_quotes_a_huge_field_name_or_cursor_only_in_part(tmp_path, make_app):
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    huge = "k" * 3_000_000
    with TestClient(app, raise_server_exceptions=False) as client:
        extra = client.post("/adapt", json={"base_model": "minilm-l6", "name": "acme", "texts": ["a"], huge: 1})
        cursor = client.get("/adapt", params={"after": "c" * 20_000})
    assert extra.status_code == 422 and len(extra.content) < 2 * MAX_MESSAGE_CHARS
    assert cursor.status_code == 404 and len(cursor.content) < 3 * MAX_MESSAGE_CHARS
    assert cursor.json()["error"]["details"]["after"].startswith("ccc")
