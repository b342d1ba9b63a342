"""What a web page the user merely visits can make a keyless server on loopback do: nothing.

A browser sends a cross-site form post, or a fetch with a plain-text or multipart body, without asking first, and
a page whose own name was made to resolve to 127.0.0.1 (DNS rebinding) calls the server as its own origin. The
guard answers the first 403 (an Origin neither the server's own nor in ``cors_allow_origins``) and the second 400
(a Host that is not one of this machine's names); clients outside a browser send no Origin and call the server by
the name they connect to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

DOC = "Crops are cut from documents. Two sentences make one view. A third one helps."
EVIL = "https://evil.example"


def _adapt_app(make_app, tmp_path: Path, **overrides):
    return make_app(
        include_adapt=True, adapt_enabled=True, adapt_dir=str(tmp_path / "adapt"), adapt_supervise_worker=False,
        adapt_min_documents=4, adapt_base_models={"tiny": "/models/tiny"}, **overrides,
    )  # fmt: skip


def _jobs(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "adapt" / "jobs"
    return list(folder.iterdir()) if folder.exists() else []


def test_a_page_of_another_origin_cannot_start_an_adapt_job(make_app, tmp_path: Path) -> None:
    body = json.dumps({"base_model": "tiny", "name": "acme", "texts": [DOC] * 6})
    with TestClient(_adapt_app(make_app, tmp_path, allowed_hosts=[])) as client:
        # what a cross-site fetch sends without a preflight: a text/plain body, the page's Origin
        sent = client.post("/adapt", content=body, headers={"Origin": EVIL, "Content-Type": "text/plain",
                                                            "Host": "127.0.0.1:8080"})  # fmt: skip
        assert sent.status_code == 403 and sent.json()["error"]["code"] == "cross_origin"
        assert "cors_allow_origins" in sent.json()["error"]["message"]
        form = client.post("/adapt", data={"base_model": "tiny", "name": "acme"}, files={"file": ("c.txt", DOC)},
                           headers={"Origin": "null", "Host": "localhost:8080"})  # fmt: skip
        assert form.status_code == 403  # a sandboxed page or a file:// one
        assert _jobs(tmp_path) == []
        # the server's own origin (a page it served), and a client with no Origin at all, are let through
        own = client.post("/adapt", content=body, headers={"Origin": "http://127.0.0.1:8080",
                                                           "Content-Type": "application/json",
                                                           "Host": "127.0.0.1:8080"})  # fmt: skip
        assert own.status_code == 202, own.text
        assert client.post("/adapt", content=body.replace("acme", "beta"), headers={
            "Content-Type": "application/json", "Host": "localhost"}).status_code == 202  # fmt: skip
        assert len(_jobs(tmp_path)) == 2


def test_an_origin_the_settings_allow_may_post(make_app) -> None:
    app = make_app(models=["fake-a"], cors_allow_origins=EVIL.replace("evil", "app"))
    with TestClient(app) as client:
        ok = client.post("/v1/embeddings", json={"input": "hi"}, headers={"Origin": "https://app.example"})
        assert ok.status_code == 200
        refused = client.post("/v1/embeddings", json={"input": "hi"}, headers={"Origin": EVIL})
        assert refused.status_code == 403
    with TestClient(make_app(models=["fake-a"], cors_allow_origins="*")) as client:
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers={"Origin": EVIL}).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost", "LOCALHOST:9", "[::1]:8080", "app.localhost:8080",
                                  "127.0.0.1"])  # fmt: skip
def test_a_loopback_server_answers_to_this_machines_names(make_app, host: str) -> None:
    with TestClient(make_app(models=["fake-a"], allowed_hosts=[])) as client:
        assert client.post("/v1/embeddings", json={"input": "hi"}, headers={"Host": host}).status_code == 200


def test_a_loopback_server_refuses_other_host_names(make_app) -> None:
    """DNS rebinding: the page's own name, now resolving to 127.0.0.1, arrives as the Host header."""
    with TestClient(make_app(models=["fake-a"], allowed_hosts=[])) as client:
        for path, method in (("/v1/embeddings", "POST"), ("/v1/models", "GET")):
            sent = client.request(method, path, json={"input": "hi"}, headers={"Host": "evil.example:8080"})
            assert sent.status_code == 400, path
            error = sent.json()["error"]
            assert error["code"] == "host_not_allowed" and "'evil.example'" in error["message"]
            assert "allowed_hosts" in error["message"] and sent.headers["x-request-id"]
        assert client.get("/health", headers={"Host": "10.0.0.7:8080"}).status_code == 200  # probes: any name
        metrics = client.get("/metrics").text
    assert 'embed_request_failures_total{error_type="host_not_allowed",model="-",route="/v1/embeddings"} 1.0' in metrics


def test_listed_host_names_and_servers_bound_beyond_loopback(make_app) -> None:
    with TestClient(make_app(models=["fake-a"], allowed_hosts="api.example.com")) as client:
        assert client.get("/v1/models", headers={"Host": "api.example.com"}).status_code == 200
        assert client.get("/v1/models", headers={"Host": "localhost"}).status_code == 200
        assert client.get("/v1/models", headers={"Host": "other.example.com"}).status_code == 400
    with TestClient(make_app(models=["fake-a"], host="0.0.0.0", allowed_hosts=[])) as client:
        assert client.get("/v1/models", headers={"Host": "10.0.0.7:8080"}).status_code == 200
    with TestClient(make_app(models=["fake-a"], allowed_hosts="*")) as client:
        assert client.get("/v1/models", headers={"Host": "anything.example"}).status_code == 200


def test_an_embedding_body_not_declared_json_is_415(make_app) -> None:
    with TestClient(make_app(models=["fake-a"])) as client:
        body = json.dumps({"input": "hi"})
        for content_type in ("application/x-www-form-urlencoded", "text/plain", None):
            headers = {"Content-Type": content_type} if content_type else {}
            sent = client.post("/v1/embeddings", content=body, headers=headers)
            assert sent.status_code == 415, content_type
            error = sent.json()["error"]
            assert error["code"] == "unsupported_media_type" and "application/json" in error["message"]
            assert (content_type or "no Content-Type") in error["message"]
        for content_type in ("application/json; charset=utf-8", "application/vnd.api+json", "Application/JSON"):
            sent = client.post("/v1/embeddings", content=body, headers={"Content-Type": content_type})
            assert sent.status_code == 200, content_type
        tokenize = client.post("/tokenize", content=json.dumps({"inputs": "hi"}), headers={"Content-Type": "text/csv"})
        assert tokenize.status_code == 415
