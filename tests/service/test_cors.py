"""Browsers: CORS headers only for the origins the settings allow; keys are checked all the same."""

from __future__ import annotations

from fastapi.testclient import TestClient

KEY = "client-key-1"
APP_ORIGIN = "https://app.example.com"
PREFLIGHT = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}


def test_no_cors_headers_by_default(make_app) -> None:
    with TestClient(make_app(models=["fake-a"])) as client:
        preflight = client.options("/v1/embeddings", headers={"Origin": APP_ORIGIN, **PREFLIGHT})
        assert "access-control-allow-origin" not in preflight.headers
        # a page of another origin may not post (a plain form post needs no preflight), and cannot read why
        refused = client.post("/v1/embeddings", json={"input": "hi"}, headers={"Origin": APP_ORIGIN})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_origin"
        assert "access-control-allow-origin" not in refused.headers
        assert client.get("/v1/models", headers={"Origin": APP_ORIGIN}).status_code == 200  # reads are not refused
        own = client.post("/v1/embeddings", json={"input": "hi"}, headers={"Origin": "http://testserver"})
        assert own.status_code == 200  # the server's own origin


def test_an_allowed_origin_gets_preflight_and_readable_answers_and_errors(make_app) -> None:
    app = make_app(models=["fake-a"], api_keys=KEY, cors_allow_origins=f"{APP_ORIGIN}, https://other.example.com")
    with TestClient(app) as client:
        preflight = client.options("/v1/embeddings", headers={"Origin": APP_ORIGIN, **PREFLIGHT})
        assert preflight.status_code == 200  # no key on a preflight: answered before the guard
        assert preflight.headers["access-control-allow-origin"] == APP_ORIGIN
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()

        ok = client.post(
            "/embed", json={"inputs": "hi"}, headers={"Origin": APP_ORIGIN, "Authorization": f"Bearer {KEY}"}
        )
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP_ORIGIN
        exposed = ok.headers["access-control-expose-headers"].lower()
        assert "x-request-id" in exposed and "x-total-time" in exposed and "retry-after" in exposed

        refused = client.post("/embed", json={"inputs": "hi"}, headers={"Origin": APP_ORIGIN})
        assert refused.status_code == 401  # the key is still required; the page can read why
        assert refused.headers["access-control-allow-origin"] == APP_ORIGIN

        stranger = client.options("/embed", headers={"Origin": "https://evil.example.com", **PREFLIGHT})
        assert stranger.status_code == 400 and "access-control-allow-origin" not in stranger.headers
        keyed_stranger = {"Origin": "https://evil.example.com", "Authorization": f"Bearer {KEY}"}
        other = client.post("/embed", json={"inputs": "hi"}, headers=keyed_stranger)
        assert "access-control-allow-origin" not in other.headers


def test_any_origin(make_app) -> None:
    with TestClient(make_app(models=["fake-a"], cors_allow_origins="*")) as client:
        answered = client.post("/embed", json={"inputs": "hi"}, headers={"Origin": "https://anywhere.example"})
        assert answered.headers["access-control-allow-origin"] == "*"
