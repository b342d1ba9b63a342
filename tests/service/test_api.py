"""HTTP shapes and the error table, against the deterministic fake backend (in-process TestClient)."""

from __future__ import annotations

import base64
import json
import logging

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def client(make_app):
    with TestClient(make_app(), raise_server_exceptions=False) as client:
        yield client


def _vector(client: TestClient, text: str, model: str = "fake-a") -> np.ndarray:
    response = client.post("/embed", json={"inputs": text, "model": model})
    assert response.status_code == 200, response.text
    return np.asarray(response.json()[0], dtype=np.float32)


def test_openai_shape_usage_and_timing_headers(client):
    response = client.post("/v1/embeddings", json={"input": ["hello there world", "hi"]})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list" and body["model"] == "fake-a"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 16 for d in body["data"])
    # fake tokens = words + [CLS] + [SEP]
    assert body["usage"] == {"prompt_tokens": 5 + 3, "total_tokens": 5 + 3}
    for header in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(response.headers[header]) >= 0.0
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-inference-time"])


def test_single_string_input_and_named_model(client):
    response = client.post("/v1/embeddings", json={"input": "one text", "model": "fake-b"})
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "fake-b" and len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 8


def test_base64_is_little_endian_float32_of_the_float_vector(client):
    floats = client.post("/v1/embeddings", json={"input": ["a b c"]}).json()["data"][0]["embedding"]
    encoded = client.post("/v1/embeddings", json={"input": ["a b c"], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, np.asarray(floats, dtype=np.float32), rtol=0, atol=1e-7)


def test_dimensions_truncate_and_renormalise(client):
    full = np.asarray(client.post("/v1/embeddings", json={"input": "x y"}).json()["data"][0]["embedding"])
    short = client.post("/v1/embeddings", json={"input": "x y", "dimensions": 4}).json()["data"][0]["embedding"]
    expected = full[:4] / np.linalg.norm(full[:4])
    np.testing.assert_allclose(short, expected, atol=1e-6)
    tei = client.post("/embed", json={"inputs": "x y", "dimensions": 4}).json()[0]
    np.testing.assert_allclose(tei, expected, atol=1e-6)


def test_model_cards_say_how_the_vectors_are_pooled_and_whether_they_are_normalised(tmp_path, make_app, publish_fake):
    """A client choosing a similarity (dot product or cosine) or comparing with another server's vectors needs the
    pooling and the normalisation the bundle manifest records."""
    root = tmp_path / "reg"
    bundle = publish_fake(root, "cls-model")
    manifest = json.loads((bundle / "manifest.json").read_text()) | {"pooling": "cls", "normalized": True}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    publish_fake(root, "raw", normalized=False)  # a manifest without pooling: exported before it was recorded
    with TestClient(make_app(registry_dir=root, default_model="cls-model")) as client:
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
        assert (cards["cls-model"]["pooling"], cards["cls-model"]["normalized"]) == ("cls", True)
        assert (cards["raw"]["pooling"], cards["raw"]["normalized"]) == (None, False)
        assert client.get("/v1/models/cls-model").json() == cards["cls-model"]
        info = client.get("/info").json()["models"]
        assert {m["id"]: m["pooling"] for m in info} == {"cls-model": "cls", "raw": None}
        schema = client.get("/openapi.json").json()["components"]["schemas"]["ModelCard"]
        assert {"pooling", "normalized"} <= set(schema["properties"])


def test_tei_embed_and_similarity(client):
    vectors = client.post("/embed", json={"inputs": ["red apple", "green pear"]}).json()
    assert len(vectors) == 2 and all(len(v) == 16 for v in vectors)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    scores = client.post(
        "/similarity", json={"inputs": {"source_sentence": "red apple", "sentences": ["red apple", "green pear"]}}
    ).json()
    a, b = np.asarray(vectors[0]), np.asarray(vectors[1])
    assert scores == pytest.approx([1.0, float(a @ b)], abs=1e-6)


def test_models_info_health_ready_and_docs(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert {(m["id"], m["dim"]) for m in models["data"]} == {("fake-a", 16), ("fake-b", 8)}
    card = client.get("/v1/models/fake-b").json()  # OpenAI's retrieve: one card, the same as in the list
    assert card == next(m for m in models["data"] if m["id"] == "fake-b")
    _error(client.get("/v1/models/nope"), 404, "model_not_found", "model 'nope' is not served here; served models")
    info = client.get("/info").json()
    assert info["default_model"] == "fake-a" and info["limits"]["max_batch_tokens"] == 256 and info["auth"] is False
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {"status": "ready", "models": ["fake-a", "fake-b"]}
    for probe in ("/health", "/ready"):  # load balancers' checks send HEAD: the status, no body
        head = client.head(probe)
        assert head.status_code == 200 and head.content == b""
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/embeddings", "/embed", "/", "/similarity", "/v1/models", "/info", "/metrics"} <= set(paths)
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]  # Prometheus, not JSON
    assert client.get("/metrics").headers["content-type"].startswith("text/plain")
    assert client.get("/docs").status_code == 200


def test_post_root_is_tei_embed(client):
    """TEI answers ``POST /`` for an embedding model (huggingface_hub's InferenceClient posts there)."""
    body = {"inputs": ["a b", "c"], "truncate": True, "normalize": True}
    root = client.post("/", json=body)
    assert root.status_code == 200 and root.json() == client.post("/embed", json=body).json()
    _error(client.post("/", json={"inputs": []}), 422, "invalid_request", "inputs is empty")
    _error(client.get("/"), 405, "method_not_allowed", "allowed: POST")


def _error(response, status: int, code: str, message_part: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}  # OpenAI's error object
    assert error["code"] == code
    assert message_part in error["message"], error["message"]
    return error


def test_error_table_rows(make_app):
    app = make_app(max_client_batch_size=3, max_input_chars=50, max_body_bytes=2048)
    with TestClient(app, raise_server_exceptions=False) as client:
        _error(client.post("/v1/embeddings", json={"input": []}), 422, "invalid_request", "input is empty")
        empty_string = client.post("/v1/embeddings", json={"input": ["ok", ""]})
        _error(empty_string, 422, "invalid_request", "input[1] is an empty")
        _error(client.post("/embed", json={"inputs": ""}), 422, "invalid_request", "inputs[0] is an empty")
        _error(
            client.post("/embed", json={"inputs": ["a", "b", "c", "d"]}), 422, "invalid_request",
            "4 texts, more than max_client_batch_size=3",
        )  # fmt: skip
        _error(
            client.post("/embed", json={"inputs": ["a", "x" * 51]}), 422, "invalid_request",
            "inputs[1] has 51 characters, more than max_input_chars=50",
        )  # fmt: skip
        long_text = " ".join(["w"] * 20)  # 22 fake tokens > max_seq_length 16
        _error(
            client.post("/embed", json={"inputs": ["short", long_text], "truncate": False}), 422, "input_too_long",
            "inputs[1] has 22 tokens, more than model 'fake-a' accepts (16)",
        )  # fmt: skip
        assert client.post("/embed", json={"inputs": long_text, "truncate": True}).status_code == 200
        assert client.post("/v1/embeddings", json={"input": long_text}).status_code == 200  # OpenAI route truncates
        _error(
            client.post("/v1/embeddings", json={"input": "a", "model": "nope"}), 404, "model_not_found",
            "model 'nope' is not served here; served models: fake-a, fake-b",
        )  # fmt: skip
        _error(
            client.post("/v1/embeddings", json={"input": "a", "dimensions": 17}), 422, "invalid_request",
            "dimensions=17 exceeds the model's 16",
        )  # fmt: skip
        _error(
            client.post("/v1/embeddings", json={"input": "a", "encoding_format": "int8"}), 422, "invalid_request",
            "encoding_format",
        )  # fmt: skip
        for ids in ([1, 2], [[101, 2023, 102]]):  # what a client that tokenises for OpenAI sends
            _error(client.post("/v1/embeddings", json={"input": ids}), 422, "invalid_request",
                   "input holds token ids; this server embeds text, so send strings")  # fmt: skip
        # JSON's \ud800 escape decodes to a lone surrogate, which no tokenizer takes: a 422 naming it, not a 500
        lone = {"/embed": {"inputs": ["fine", "caf\u00e9 \ud800"]}, "/v1/embeddings": {"input": ["fine", "x \ud800"]},
                "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["fine", "\udc00 z"]}}}  # fmt: skip
        for route, body in lone.items():
            field = "inputs.sentences" if route == "/similarity" else next(iter(body))
            sent = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
            _error(sent, 422, "invalid_request",
                   f"{field}[1] is not valid Unicode: a lone surrogate")  # fmt: skip
        _error(
            client.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}),
            422, "invalid_request", "JSON",
        )  # fmt: skip
        _error(
            client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}}), 422,
            "invalid_request", "inputs.sentences is empty",
        )  # fmt: skip
        # /similarity's texts come from two fields: an error names the field the text came from
        _error(
            client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": ["b", ""]}}), 422,
            "invalid_request", "inputs.sentences[1] is an empty string",
        )  # fmt: skip
        too_long = {"inputs": {"source_sentence": long_text, "sentences": ["b"]}, "truncate": False}
        _error(client.post("/similarity", json=too_long), 422, "input_too_long", "inputs.source_sentence has 22 tokens")
        padded = client.post("/embed", json={"inputs": "a", "pad": "y" * 3000})
        _error(padded, 413, "payload_too_large", "max_body_bytes=2048")
        _error(client.get("/nowhere"), 404, "not_found", "no route GET /nowhere; see /docs")
        # an OpenAI client whose base URL lacks /v1 is told where the route is; other paths are not
        _error(
            client.post("/embeddings", json={"input": "a"}), 404, "not_found",
            "POST /v1/embeddings exists (an OpenAI client's base URL ends in /v1)",
        )  # fmt: skip
        _error(client.get("/models"), 404, "not_found", "GET /v1/models exists")
        assert "/v1" not in client.get("/nowhere").json()["error"]["message"]
        not_allowed = _error(client.get("/v1/embeddings"), 405, "method_not_allowed", "GET is not allowed")
        assert client.get("/v1/embeddings").headers["allow"] == "POST" and "allowed: POST" in not_allowed["message"]
        # Broken JSON says so, and where, not pydantic's bare "0: JSON decode error"
        broken = client.post("/v1/embeddings", content=b'{"input": "a",}', headers={"content-type": "application/json"})
        _error(broken, 422, "invalid_request", "the body is not valid JSON (")
        assert "at character 14" in broken.json()["error"]["message"]
        # Bytes that are not UTF-8 cannot be decoded as JSON at all: the same 422 as broken JSON, not a bare 400.
        _error(
            client.post("/embed", content=b'{"inputs": "\xff\xfe"}', headers={"content-type": "application/json"}),
            422, "invalid_request", "send UTF-8 JSON",
        )  # fmt: skip


def test_the_schema_declares_what_the_text_checks_refuse(client):
    """Every text a route takes is declared non-empty and every list of them non-empty (the 422s above), so generated
    clients and schema validators refuse what the server refuses."""
    schema = client.get("/openapi.json").json()

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
        return node

    def leaves(node: dict) -> list[dict]:
        node = resolve(node)
        if "anyOf" in node:
            return [leaf for option in node["anyOf"] for leaf in leaves(option)]
        if node.get("type") == "object":
            return [leaf for field in node["properties"].values() for leaf in leaves(field)]
        if node.get("type") == "array":
            return [node, *leaves(node["items"])]
        return [node]

    fields = {"/v1/embeddings": "input", "/embed": "inputs", "/": "inputs", "/similarity": "inputs"}
    for path, field in fields.items():
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        found = leaves(resolve(body)["properties"][field])
        assert {leaf["type"] for leaf in found} == {"string", "array"}, (path, found)
        for leaf in found:
            assert leaf.get("minLength" if leaf["type"] == "string" else "minItems") == 1, (path, leaf)


def test_chunked_body_over_the_limit_is_413(make_app):
    app = make_app(max_body_bytes=1024)

    def chunks():
        yield b'{"inputs": ["'
        for _ in range(20):
            yield b"z" * 100
        yield b'"]}'

    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
        _error(response, 413, "payload_too_large", "max_body_bytes=1024")


def test_a_compressed_body_is_415_before_it_is_read(make_app):
    """Bounds hold for the bytes sent; a gzip body would grow past them once inflated, so none is taken."""
    import gzip

    with TestClient(make_app(), raise_server_exceptions=False) as client:
        body = gzip.compress(json.dumps({"inputs": "a"}).encode())
        for encoding in ("gzip", "br, gzip"):
            headers = {"content-type": "application/json", "content-encoding": encoding}
            _error(client.post("/embed", content=body, headers=headers), 415, "unsupported_content_encoding",
                   f"Content-Encoding '{encoding}' is not accepted")  # fmt: skip
        plain = {"content-type": "application/json", "content-encoding": "identity"}
        assert client.post("/embed", content=json.dumps({"inputs": "a"}), headers=plain).status_code == 200
        assert "415" in client.get("/openapi.json").json()["paths"]["/embed"]["post"]["responses"]


def test_adapt_uploads_have_their_own_body_cap(tmp_path, make_app):
    """A corpus is far larger than an embedding request: POST /adapt is capped by adapt_max_upload_bytes."""
    from service.adapt.intake import UPLOAD_FRAMING_BYTES

    app = make_app(
        include_adapt=True, max_body_bytes=1024, adapt_enabled=True, adapt_supervise_worker=False,
        adapt_dir=tmp_path / "adapt", adapt_max_upload_bytes=4096, adapt_min_documents=2,
    )  # fmt: skip
    doc = "A sentence of a customer's document that is long enough to count. " * 3
    with TestClient(app, raise_server_exceptions=False) as client:
        corpus = {"base_model": "minilm-l6", "name": "acme", "texts": [doc] * 12}
        assert len(json.dumps(corpus)) > 1024
        response = client.post("/adapt", json=corpus)
        assert response.status_code == 202, response.text
        _error(client.post("/embed", json={"inputs": [doc] * 12}), 413, "payload_too_large", "max_body_bytes=1024")
        # the JSON's escapes make a body larger than its corpus: the framing allowance takes them, as a form's
        accented = "Une phrase écrite à côté d'une autre, déjà lue. Une deuxième phrase suit ici. Et une troisième."
        escaped = {**corpus, "name": "accents", "texts": [accented] * 38}
        sent = json.dumps(escaped).encode()  # ASCII: each é is six bytes
        assert len(sent) > 4096 > sum(len(t.encode()) for t in escaped["texts"])
        response = client.post("/adapt", content=sent, headers={"content-type": "application/json"})
        assert response.status_code == 202, response.text
        huge = {**corpus, "texts": ["x" * 1000] * (UPLOAD_FRAMING_BYTES // 1000 + 10)}
        _error(client.post("/adapt", json=huge), 413, "payload_too_large", "adapt_max_upload_bytes=")


def test_adapt_errors_come_from_the_service_error_table_and_are_counted(tmp_path, make_app):
    """/adapt raises the service's error kinds: the same body shape and the same failure counter as /embed."""
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    doc = "A sentence of a customer's document that is long enough to count. Another one follows it."
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"base_model": "minilm-l6", "name": "minilm-l3", "texts": [doc] * 70}
        _error(client.post("/adapt", json=body), 422, "reserved_name", "is a built-in base model")
        small = client.post("/adapt", json={**body, "name": "acme", "texts": ["one"] * 3})
        assert small.status_code == 422 and small.json()["error"]["code"] == "corpus_too_small"
        assert small.json()["error"]["details"]["usable_documents"] == 0  # the facts travel with the message
        _error(client.get("/adapt/nope"), 404, "job_not_found", "nope")
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    counted = {
        (s.labels["route"], s.labels["error_type"]): s.value
        for s in families["embed_request_failures"].samples
        if s.name.endswith("_total") and s.value
    }
    assert counted == {
        ("/adapt", "reserved_name"): 1, ("/adapt", "corpus_too_small"): 1, ("/adapt/{job_id}", "job_not_found"): 1,
    }  # fmt: skip


@pytest.mark.parametrize("configured_dir", [False, True])
def test_a_server_with_adapt_disabled_opens_and_creates_nothing_of_the_job_store(
    tmp_path, make_app, publish_fake, configured_dir
):
    """/adapt off: no job store is opened (its migrations do not run) and no folder is made, neither the configured
    adapt_dir nor the default one beside the registry; every /adapt route answers 503 disabled."""
    root = tmp_path / "srv" / "registry"
    publish_fake(root, "fake-a")
    before = sorted(tmp_path.rglob("*"))
    overrides = {"adapt_dir": str(tmp_path / "srv" / "adapt")} if configured_dir else {}
    app = make_app(include_adapt=True, registry_dir=root, default_model="fake-a", adapt_enabled=False, **overrides)
    routes = [("GET", "/adapt"), ("POST", "/adapt"), ("GET", "/adapt/j1"), ("GET", "/adapt/j1/events"),
              ("POST", "/adapt/j1/cancel")]  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/embed", json={"inputs": "a"}).status_code == 200
        for method, path in routes:
            _error(client.request(method, path, json={}), 503, "disabled", "/adapt is disabled on this server")
    assert sorted(tmp_path.rglob("*")) == before
    assert app.state.adapt.store is None and app.state.adapt.supervisor is None


def test_internal_error_is_generic_for_clients(tmp_path, make_app, publish_fake, caplog):
    root = tmp_path / "reg"
    publish_fake(root, "fake-a", fail_word="explode")
    app = make_app(registry_dir=root)
    with TestClient(app, raise_server_exceptions=False) as client, caplog.at_level(logging.ERROR):
        response = client.post("/v1/embeddings", json={"input": ["fine", "please explode now"]})
        assert response.status_code == 500
        expected = {"message": "internal error", "type": "server_error", "param": None, "code": "internal_error"}
        assert response.json() == {"error": expected}
        assert "secret detail" not in response.text
        assert "secret detail" in caplog.text  # the traceback is in the log
        assert client.post("/v1/embeddings", json={"input": "fine"}).status_code == 200  # the model still serves


def test_api_keys(make_app, caplog):
    app = make_app(api_keys="key-one,key-two")
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"input": "a"}
        _error(client.post("/v1/embeddings", json=body), 401, "invalid_api_key", "Authorization: Bearer")
        wrong = client.post("/v1/embeddings", json=body, headers={"Authorization": "Bearer key-three"})
        _error(wrong, 401, "invalid_api_key", "invalid API key")
        assert wrong.headers["www-authenticate"] == "Bearer"
        basic = client.post("/embed", json={"inputs": "a"}, headers={"Authorization": "Basic key-one"})
        _error(basic, 401, "invalid_api_key", "API key")
        for key in ("key-one", "key-two"):
            ok = client.post("/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        for path in ("/v1/models", "/v1/models/fake-a", "/v1/models/nope"):  # a stranger learns no model's name
            _error(client.get(path), 401, "invalid_api_key", "API key")
            assert client.get(path, headers={"Authorization": "Bearer key-two"}).status_code in (200, 404)
        # probes and scrapes stay open
        assert client.get("/health").status_code == 200 and client.get("/ready").status_code == 200
        assert client.get("/metrics").status_code == 200
    assert "key-one" not in caplog.text and "key-two" not in caplog.text


def test_405_allows_every_method_of_the_path(make_app, tmp_path):
    app = make_app(include_adapt=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    with TestClient(app, raise_server_exceptions=False) as client:
        response = client.delete("/adapt")  # two routes share the path: GET lists jobs, POST submits one
        _error(response, 405, "method_not_allowed", "DELETE is not allowed on /adapt; allowed: GET, POST")
        assert response.headers["allow"] == "GET, POST"


def test_an_admin_key_works_on_the_client_routes_and_a_client_key_not_on_adapt(make_app, tmp_path):
    app = make_app(
        include_adapt=True, api_keys="client-key", admin_api_keys="admin-key", adapt_enabled=True,
        adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt",
    )  # fmt: skip
    admin, client_key = ({"Authorization": f"Bearer {key}"} for key in ("admin-key", "client-key"))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.post("/v1/embeddings", json={"input": "a"}, headers=admin).status_code == 200
        assert client.post("/embed", json={"inputs": "a"}, headers=admin).status_code == 200
        assert client.post("/", json={"inputs": "a"}, headers=admin).status_code == 200
        assert client.get("/v1/models", headers=admin).status_code == 200
        assert client.get("/info", headers=admin).json()["auth"] is True
        assert client.get("/adapt", headers=admin).status_code == 200
        _error(client.get("/adapt", headers=client_key), 403, "forbidden", "use an admin key")
        _error(client.get("/adapt"), 401, "invalid_api_key", "admin API key")


@pytest.mark.parametrize("allow", [False, True])
def test_without_admin_keys_adapt_refuses_client_keys_unless_allowed(make_app, tmp_path, allow):
    app = make_app(
        include_adapt=True, api_keys="client-key", adapt_allow_client_keys=allow, adapt_enabled=True,
        adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt",
    )  # fmt: skip
    with TestClient(app, raise_server_exceptions=False) as client:
        listed = client.get("/adapt", headers={"Authorization": "Bearer client-key"})
        if allow:
            assert listed.status_code == 200 and listed.json()["object"] == "list"
        else:
            _error(listed, 403, "forbidden", "the server has none set")


def test_open_server_warns_at_start(make_app, caplog):
    with caplog.at_level(logging.WARNING, logger="service"), TestClient(make_app()):
        pass
    assert "no API keys configured" in caplog.text


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_exist_before_traffic_and_count_requests_and_failures(client):
    before = _samples(client.get("/metrics").text)
    key_ok = ("embed_requests_total", (("model", "fake-a"), ("route", "/v1/embeddings")))
    key_fail = (
        "embed_request_failures_total",
        (("error_type", "invalid_request"), ("model", "fake-a"), ("route", "/v1/embeddings")),
    )
    assert before[key_ok] == 0 and before[key_fail] == 0
    for name in (
        "embed_request_duration_seconds_count", "embed_queue_seconds_count", "embed_tokenization_seconds_count",
        "embed_inference_seconds_count", "embed_batch_size_count", "embed_batch_tokens_count",
        "embed_input_length_tokens_count", "embed_queue_depth", "embed_tokens_total", "embed_embeddings_total",
    ):  # fmt: skip
        assert any(key[0] == name and ("model", "fake-b") in key[1] for key in before), name
    assert before[("embed_models_loaded", ())] == 2

    client.post("/v1/embeddings", json={"input": ["a b", "c"]})
    client.post("/v1/embeddings", json={"input": ["ok", ""]})
    after = _samples(client.get("/metrics").text)
    assert after[key_ok] == 2  # one success, one failure: both are requests
    assert after[key_fail] == 1
    assert after[("embed_embeddings_total", (("model", "fake-a"),))] == 2
    assert after[("embed_tokens_total", (("model", "fake-a"),))] == 4 + 3
    assert after[("embed_input_length_tokens_count", (("model", "fake-a"),))] == 2
    assert after[("embed_request_duration_seconds_count", (("model", "fake-a"), ("route", "/v1/embeddings")))] == 1


def test_embedding_routes_answer_alike_with_and_without_fastapis_routing(make_app, monkeypatch):
    """`service.api.direct` serves a body that validates without FastAPI's routing; every answer — successes,
    the engine's errors, bodies FastAPI rejects, other content types — is the same either way."""
    import service.guard
    from service.guard import GuardMiddleware

    served_directly = []
    serve = service.guard.serve_directly

    async def counting(route, *args):
        served_directly.append(route)
        await serve(route, *args)

    monkeypatch.setattr(service.guard, "serve_directly", counting)
    json_type = {"content-type": "application/json"}
    requests = [
        ("/v1/embeddings", {"input": "hello there"}, json_type),
        ("/v1/embeddings", {"input": ["a b", "c"], "encoding_format": "base64", "dimensions": 8}, json_type),
        ("/embed", {"inputs": ["one two", "three"], "normalize": False}, json_type),
        ("/", {"inputs": "root text"}, {"content-type": "application/json; charset=utf-8"}),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["a", "b c"]}}, json_type),
        ("/v1/embeddings", {"input": "x", "model": "nope"}, json_type),  # 404 from the engine
        ("/v1/embeddings", {"input": "x", "dimensions": 99}, json_type),  # 422 from the route
        ("/v1/embeddings", {"input": []}, json_type),  # 422 from the engine's checks
        ("/v1/embeddings", {"input": 5}, json_type),  # FastAPI's 422
        ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, json_type),
        ("/v1/embeddings", b"{not json", json_type),
        ("/v1/embeddings", b"", json_type),
        ("/v1/embeddings", {"input": "x"}, {"content-type": "text/plain"}),
    ]
    answers = {}
    with TestClient(make_app(), raise_server_exceptions=False) as client:
        guard = client.app.middleware_stack
        while not isinstance(guard, GuardMiddleware):
            guard = guard.app
        for direct in (True, False):
            guard.direct = direct
            for path, body, headers in requests:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                response = client.post(path, content=content, headers=headers)
                answers.setdefault((path, content, headers["content-type"]), []).append(
                    (response.status_code, response.content, response.headers["content-type"])
                )
    json_bodies = [r for r in requests if r[2]["content-type"].startswith("application/json")]
    assert len(served_directly) == len(json_bodies)  # handed to the direct path (the rejected ones handed back)
    for request, (direct, framework) in answers.items():
        assert direct == framework, request
    statuses = [answers[k][0][0] for k in answers]
    assert statuses == [200, 200, 200, 200, 200, 404, 422, 422, 422, 422, 422, 422, 415]


def test_a_request_that_cannot_be_answered_is_refused_before_its_texts_are_embedded(make_app, fake_backends) -> None:
    """``dimensions`` wider than the model is a 422 before any forward pass, whatever the request carries."""
    with TestClient(make_app()) as client:
        backend = fake_backends(client.app)["fake-a"]
        before = len(backend.batches)
        for route, body in (("/v1/embeddings", {"input": ["a b"] * 40, "dimensions": 99}),
                            ("/embed", {"inputs": ["a b"] * 40, "dimensions": 17})):  # fmt: skip
            _error(client.post(route, json=body), 422, "invalid_request", "exceeds the model's 16")
        assert len(backend.batches) == before


def test_similarity_counts_its_sentences_against_the_batch_bound(make_app) -> None:
    """The bound is the client's: ``max_client_batch_size`` sentences are accepted beside the source sentence."""
    with TestClient(make_app(max_client_batch_size=4)) as client:
        body = {"inputs": {"source_sentence": "a", "sentences": ["b", "c", "d", "e"]}}
        ok = client.post("/similarity", json=body)
        assert ok.status_code == 200 and len(ok.json()) == 4
        body["inputs"]["sentences"].append("f")
        _error(client.post("/similarity", json=body), 422, "invalid_request",
               "inputs.sentences has 5 texts, more than max_client_batch_size=4")  # fmt: skip


def test_a_key_with_non_ascii_characters_is_recognised(make_app, serve) -> None:
    """A header carries bytes; a key set as ``clé-secrète`` arrives as its UTF-8 bytes and must match."""
    import httpx

    key = "clé-secrète"
    with serve(make_app(api_keys=key)) as (url, _):
        body = {"inputs": "hi"}
        sent = httpx.post(f"{url}/embed", json=body, headers={"Authorization": f"Bearer {key}".encode()})
        wrong = httpx.post(f"{url}/embed", json=body, headers={"Authorization": b"Bearer cl\xe9-secr\xe8te"})
    assert sent.status_code == 200, sent.text
    assert wrong.status_code == 401  # the same text in latin-1 is other bytes: another key


def test_every_failure_of_tokenize_is_counted_like_the_embedding_routes(make_app) -> None:
    with TestClient(make_app(api_keys="k")) as client:
        keyed = {"Authorization": "Bearer k"}
        assert client.post("/tokenize", json={"inputs": "a"}).status_code == 401  # refused by the guard
        assert client.post("/tokenize", json={"inputs": 5}, headers=keyed).status_code == 422  # by FastAPI
        assert client.post("/tokenize", json={"inputs": ""}, headers=keyed).status_code == 422  # by the engine
        metrics = client.get("/metrics").text
    assert 'embed_request_failures_total{error_type="invalid_api_key",model="-",route="/tokenize"} 1.0' in metrics
    assert 'embed_request_failures_total{error_type="invalid_request",model="-",route="/tokenize"} 1.0' in metrics
    counted = [line for line in metrics.splitlines()
               if line.startswith("embed_request_failures_total{") and 'route="/tokenize"' in line]  # fmt: skip
    assert sum(float(line.rsplit(" ", 1)[1]) for line in counted) == 3, counted


def test_a_validation_error_names_the_field_at_fault_as_openai_does(make_app) -> None:
    with TestClient(make_app()) as client:
        cases = [({"input": 5}, "input"), ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
                 ({"input": "x", "dimensions": "8"}, "dimensions")]  # fmt: skip
        for body, param in cases:
            assert _error(client.post("/v1/embeddings", json=body), 422, "invalid_request", param)["param"] == param
        broken = client.post("/v1/embeddings", content=b"{nope", headers={"content-type": "application/json"})
        assert _error(broken, 422, "invalid_request", "JSON")["param"] is None  # the body as a whole
