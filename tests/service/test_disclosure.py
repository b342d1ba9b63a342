"""What of a client's request reaches the log: a line of the log is one record whatever the path asked for (no forged
lines, no terminal escapes)."""

from __future__ import annotations

import io
import logging
import socket

from service.observability import TEXT_FORMAT, RequestContextFilter

FORGED = "2026-01-01 00:00:00,000 INFO service: forged"


def _raw(url: str, request: bytes) -> str:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096).decode()


def test_a_path_with_newlines_and_escapes_stays_on_its_own_access_log_line(make_app, serve):
    app = make_app(models=["fake-a"], access_log=True)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestContextFilter())
    handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    service_log = logging.getLogger("service")
    service_log.addHandler(handler)
    previous = service_log.level
    service_log.setLevel(logging.INFO)
    try:
        with serve(app) as (url, _):
            # uvicorn decodes the path: %0a is a newline, %1b the escape that starts a terminal's colour code
            head = _raw(url, b"GET /x%0d%0a" + FORGED.replace(" ", "%20").encode() + b"%1b[31m HTTP/1.1\r\n"
                             b"host: localhost\r\n\r\n")  # fmt: skip
    finally:
        service_log.removeHandler(handler)
        service_log.setLevel(previous)
    assert head.startswith("HTTP/1.1 404")
    lines = stream.getvalue().splitlines()
    access = [line for line in lines if " GET /x" in line]
    assert len(access) == 1 and access[0].endswith(" ms") and " 404 " in access[0]
    assert not any(line.startswith(FORGED) for line in lines)
    assert "\x1b" not in stream.getvalue() and "\r" not in stream.getvalue()
    assert "/x%0D%0A2026-01-01%2000" in access[0]  # percent-encoded as it was sent
