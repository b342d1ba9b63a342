"""The probes and the scrape (/health, /ready, /metrics) pass the guard untouched — no Host, key, body or admission
check — so a load balancer's check or a scraper is answered whatever it sends; their schema declares none of the
guard's statuses, which they never answer."""

from __future__ import annotations

from fastapi.testclient import TestClient


def test_probes_are_answered_whatever_their_headers_and_declare_no_guard_status(make_app):
    app = make_app(allowed_hosts=["api.example"])
    odd = [
        {"content-length": "999999999999"},  # over max_body_bytes
        {"content-encoding": "gzip"},
        {"content-type": "text/plain"},
        {"host": "elsewhere.example"},
    ]
    with TestClient(app) as client:
        for path in ("/health", "/ready", "/metrics"):
            for headers in odd:
                assert client.get(path, headers=headers).status_code == 200, (path, headers)
        paths = app.openapi()["paths"]
    for path in ("/health", "/ready", "/metrics"):
        declared = set(paths[path]["get"]["responses"])
        assert not declared & {"400", "401", "403", "408", "413", "415", "429"}, (path, declared)
