"""/adapt routes without a worker: validation, auth, names, limits, queue bound, cancel, listing, SSE."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from adapt_jobs.jobs import RUNNING, SUCCEEDED
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from service.adapt.api_router import build_adapt_router, last_event_id
from service.adapt.intake import INLINE_BYTES
from service.auth import ApiKeys

DOC = "Crops are cut from documents. Two sentences make one view. A third one helps."
KEY = "admin-secret"
ADMIN_KEYS = ApiKeys.of(["client-key"], ["other-key", KEY])


def _config(tmp_path: Path, **overrides) -> AdaptConfig:
    values = {
        "dir": tmp_path / "adapt",
        "supervise_worker": False,
        "max_pending_jobs": 2,
        "min_documents": 4,
        "max_documents": 50,
        "max_document_chars": 500,
        "max_upload_bytes": 20_000,
        "base_models": {"tiny": "/models/tiny"},
    }
    values.update(overrides)
    settings = AdaptSettings(**values)
    return AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path), ADMIN_KEYS))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _body(**overrides) -> dict:
    return {"base_model": "minilm-l6", "name": "acme", "texts": [DOC] * 6, **overrides}


def test_submit_returns_202_with_the_queued_job_and_stores_the_corpus(client: TestClient, tmp_path: Path) -> None:
    r = client.post("/adapt", json=_body(labels=["a", "b"] * 3, max_steps=5, seed=3))
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["object"] == "adapt.job" and job["state"] == "queued" and job["name"] == "acme"
    assert job["hyperparameters"]["max_steps"] == 5 and job["hyperparameters"]["seed"] == 3
    assert job["hyperparameters"]["objective"] == "crop-infonce"
    assert job["corpus"]["documents"] == 6 and job["corpus"]["has_labels"] is True
    stored = (tmp_path / "adapt" / "jobs" / job["id"] / "corpus.jsonl").read_text().splitlines()
    assert json.loads(stored[1]) == {"text": DOC, "label": "b"}
    assert client.get(f"/adapt/{job['id']}").json()["id"] == job["id"]


def test_defaults_fill_in_the_recipe(client: TestClient) -> None:
    hp = client.post("/adapt", json=_body()).json()["hyperparameters"]
    assert hp["max_steps"] == 60 and hp["time_budget_s"] == 180.0 and hp["train_last_layers"] == 2
    assert hp["anchor_weight"] == 3.0
    assert hp["lr"] == 2e-5 and hp["batch_size"] == 32 and hp["gate_margin"] == 2.0


def test_corpus_too_small_is_422_with_counts(client: TestClient) -> None:
    r = client.post("/adapt", json=_body(texts=[DOC, DOC, "one sentence only", "tiny"]))
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["code"] == "corpus_too_small"
    assert "found 2 usable documents out of 4" in error["message"] and "at least 4" in error["message"]
    assert error["details"] == {"documents": 4, "usable_documents": 2, "min_documents": 4}


def test_the_request_fields_are_answered_before_the_corpus(client: TestClient) -> None:
    """A name or base model that would be refused anyway is said first, not after the corpus has been fixed."""
    small = [DOC, "tiny"]
    assert "unknown base_model 'gpt-9'" in client.post("/adapt", json=_body(base_model="gpt-9", texts=small)).text
    assert client.post("/adapt", json=_body(name="Acme", texts=small)).json()["error"]["code"] == "invalid_name"
    assert client.post("/adapt", json=_body(texts=small)).json()["error"]["code"] == "corpus_too_small"


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        (_body(name="../etc"), 422, "invalid model name"),
        (_body(name="Acme"), 422, "invalid model name"),
        (_body(name="acme\n"), 422, "invalid model name"),  # "$" would let a trailing newline through
        (_body(name="\u0430cme"), 422, "invalid model name"),  # Cyrillic a
        (_body(name="\uff41\uff43\uff4d\uff45"), 422, "invalid model name"),  # fullwidth letters
        (_body(name="minilm-l6"), 422, "built-in base model"),
        (_body(name="tiny"), 422, "built-in base model"),
        (_body(base_model="gpt-9"), 404, "unknown base_model 'gpt-9'"),
        (_body(objective="mlm"), 422, "objective"),
        (_body(texts=None), 422, "no corpus"),
        (_body(labels=["a"]), 422, "got 1 labels for 6 texts"),
        (_body(max_steps=0), 422, "max_steps"),
        (_body(texts=[DOC * 10] * 6), 422, "longer than 500 characters"),
        (_body(texts=[DOC] * 51), 422, "51 documents; the limit is 50"),
        (_body(texts=["x" * 90_000]), 413, "limit"),  # over the upload limit plus the framing allowance
        (_body(surprise=1), 422, "surprise"),
    ],
)
def test_bad_requests_say_what_to_fix(client: TestClient, body: dict, status: int, match: str) -> None:
    r = client.post("/adapt", json=body)
    assert r.status_code == status, r.text
    assert match in r.json()["error"]["message"]


def test_name_of_a_model_not_made_by_adapt_is_refused(client: TestClient, tmp_path: Path) -> None:
    folder = tmp_path / "registry" / "exported" / "1"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "exported", "method": {"name": "distill"}}))
    r = client.post("/adapt", json=_body(name="exported"))
    assert r.status_code == 409 and "was not made by /adapt" in r.json()["error"]["message"]
    (folder / "manifest.json").write_text(json.dumps({"name": "exported", "method": {"name": "adapt"}}))
    assert client.post("/adapt", json=_body(name="exported")).status_code == 202  # a new version is fine


ROUTES = (
    ("post", "/adapt"), ("get", "/adapt"), ("get", "/adapt/x"), ("post", "/adapt/x/cancel"), ("get", "/adapt/x/events"),
)  # fmt: skip


def test_auth_is_required_when_an_admin_key_is_set(client: TestClient) -> None:
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        for method, path in ROUTES:
            r = client.request(method, path, headers=headers, json=_body())
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"]["type"] == "authentication_error"
            assert r.headers["www-authenticate"] == "Bearer"
    for method, path in ROUTES:  # a client key authenticates, but may not use /adapt
        r = client.request(method, path, headers={"Authorization": "Bearer client-key"}, json=_body())
        assert r.status_code == 403, (method, path)
        assert r.json()["error"] == {
            "message": "this API key may embed but not start or read /adapt jobs: use an admin key "
            "(EMBED_ADMIN_API_KEYS)",
            "type": "permission_error",
            "param": None,
            "code": "forbidden",
        }
    assert client.get("/adapt").status_code == 200
    assert client.get("/adapt", headers={"Authorization": "Bearer other-key"}).status_code == 200


@pytest.mark.parametrize("allow", [False, True], ids=["default", "adapt_allow_client_keys"])
def test_client_keys_use_adapt_only_when_allowed(tmp_path: Path, allow: bool) -> None:
    """Only client keys set: /adapt refuses them (403) unless the operator opts into the fallback."""
    app = FastAPI()
    keys = ApiKeys.of(["client-key"], admin_falls_back_to_client=allow)
    app.include_router(build_adapt_router(_config(tmp_path), keys))
    with TestClient(app) as c:
        assert c.post("/adapt", json=_body()).status_code == 401  # no key at all is still unauthenticated
        r = c.post("/adapt", json=_body(), headers={"Authorization": "Bearer client-key"})
        if allow:
            assert r.status_code == 202, r.text
        else:
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
            assert "the server has none set" in r.json()["error"]["message"]


def test_no_key_configured_means_open(tmp_path: Path) -> None:
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path), ApiKeys()))
    with TestClient(app) as c:
        assert c.post("/adapt", json=_body()).status_code == 202


@pytest.mark.parametrize("peer", ["192.0.2.7", "10.0.0.5", "2001:db8::1"])
def test_with_no_key_a_caller_from_another_machine_is_refused_whatever_the_settings_say(
    tmp_path: Path, peer: str
) -> None:
    """An app whose settings say loopback may still be served on every interface (create_app in another server):
    with no key set, /adapt answers only callers on this machine."""
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path), ApiKeys()))
    with TestClient(app, client=(peer, 50000)) as remote:
        for method, path in ROUTES:
            r = remote.request(method, path, json=_body())
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path, r.text)
            assert "EMBED_ADMIN_API_KEYS" in r.json()["error"]["message"]
    assert not any((tmp_path / "adapt").rglob("corpus.jsonl"))  # nothing was saved
    for local in ("127.8.0.1", "::1", "::ffff:127.0.0.1"):
        with TestClient(app, client=(local, 50000)) as c:
            assert c.get("/adapt").status_code == 200, local
    with TestClient(app, client=("127.0.0.1", 50000)) as c:
        assert c.post("/adapt", json=_body()).status_code == 202


def test_queue_bound_gives_429_with_retry_after(client: TestClient, tmp_path: Path) -> None:
    assert client.post("/adapt", json=_body()).status_code == 202
    assert client.post("/adapt", json=_body()).status_code == 202
    r = client.post("/adapt", json=_body())
    assert r.status_code == 429 and r.headers["retry-after"] == "60"
    assert "queue is full" in r.json()["error"]["message"]
    assert len(list((tmp_path / "adapt" / "jobs").iterdir())) == 2  # the refused corpus was not kept


def test_multipart_jsonl_upload(client: TestClient) -> None:
    lines = "\n".join(json.dumps({"text": DOC, "label": i % 2}) for i in range(5)).encode()
    r = client.post(
        "/adapt",
        data={"base_model": "tiny", "name": "up", "max_steps": "7", "promote": "never"},
        files={"file": ("corpus.jsonl", lines, "application/jsonl")},
    )
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["corpus"]["documents"] == 5 and job["corpus"]["has_labels"]
    assert job["hyperparameters"]["max_steps"] == 7 and job["base_model"] == "tiny"
    r = client.post("/adapt", data={"base_model": "tiny", "name": "up"})
    assert r.status_code == 422
    # a file too small to adapt on, read in the reader process: the refusal keeps its code and counts across it
    small = "\n".join(json.dumps(DOC) for _ in range(2)).encode()
    r = client.post("/adapt", data={"base_model": "tiny", "name": "up"}, files={"file": ("small.jsonl", small)})
    error = r.json()["error"]
    assert r.status_code == 422 and error["code"] == "corpus_too_small" and error["details"]["documents"] == 2


def test_cancel_list_and_404(client: TestClient, tmp_path: Path) -> None:
    ids = [client.post("/adapt", json=_body()).json()["id"] for _ in range(2)]
    r = client.post(f"/adapt/{ids[0]}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert not (tmp_path / "adapt" / "jobs" / ids[0]).exists()  # a cancelled queued job's corpus is deleted
    listing = client.get("/adapt", params={"limit": 1}).json()
    assert listing["object"] == "list" and listing["has_more"] is True
    assert [j["id"] for j in listing["data"]] == [ids[1]]
    rest = client.get("/adapt", params={"limit": 5, "after": ids[1]}).json()
    assert [j["id"] for j in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert client.get("/adapt/adaptjob-nope").status_code == 404
    assert client.post("/adapt/adaptjob-nope/cancel").status_code == 404
    assert client.get("/adapt/adaptjob-nope/events").status_code == 404


def test_events_stream_until_the_job_ends(client: TestClient, tmp_path: Path) -> None:
    job_id = client.post("/adapt", json=_body()).json()["id"]
    store = JobStore(_config(tmp_path).store_url)
    claimed = store.claim_next("w", max_running=1, lease_s=30)
    assert claimed.state == RUNNING
    store.update_progress(claimed.lease, {"stage": "training", "step": 1, "total": 2, "loss": 0.5})
    store.update_result(claimed.lease, {"model": {"name": "acme", "version": "1", "promoted": True}},
                        event_type="published")  # fmt: skip
    store.finish(claimed.lease, SUCCEEDED)
    with client.stream("GET", f"/adapt/{job_id}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    blocks = [b for b in text.split("\n\n") if b.strip()]
    names = [line.removeprefix("event: ") for b in blocks for line in b.splitlines() if line.startswith("event: ")]
    assert names == ["state", "audit", "state", "progress", "published", "state", "done"]
    assert [b.splitlines()[0] for b in blocks[:-1]] == [f"id: {n}" for n in range(1, 7)]  # the job's own sequence
    done = json.loads(blocks[-1].splitlines()[-1].removeprefix("data: "))
    assert done["state"] == "succeeded" and done["model"] == {"name": "acme", "version": "1", "promoted": True}
    assert [(a["attempt"], a["worker_id"], a["outcome"]) for a in done["attempts"]] == [(1, "w", "succeeded")]
    # Last-Event-ID resumes after the given event
    progress_id = int(blocks[3].splitlines()[0].removeprefix("id: "))
    with client.stream("GET", f"/adapt/{job_id}/events", headers={"Last-Event-ID": str(progress_id)}) as r:
        resumed = "".join(r.iter_text())
    assert resumed.count("event: ") == 3 and "event: progress" not in resumed


def test_the_api_side_imports_neither_torch_nor_training() -> None:
    """The routes use adapt's torch-free spec, store and corpus intake; never its worker stages."""
    import subprocess
    import sys

    code = (
        "import sys, service.adapt.api_router, service.adapt.supervisor;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'training', 'evaluation', 'export')"
        " or m in ('adapt_worker.pipeline', 'adapt_worker.worker'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_config_comes_from_the_service_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import ServiceSettings

    monkeypatch.setenv("EMBED_ADAPT_BASE_MODELS", json.dumps({"tiny": "/models/tiny"}))
    monkeypatch.setenv("EMBED_ADAPT_GENERAL_TASKS", "LeeDocSTS")
    settings = ServiceSettings.from_flat(
        registry_dir=tmp_path / "reg", adapt_min_documents=5, adapt_max_steps=9, adapt_lr=1e-3
    )
    adapt = settings.adapt  # flags and environment meet in one object
    assert adapt.base_models == {"tiny": "/models/tiny"}
    assert adapt.min_documents == 5 and adapt.max_steps == 9
    assert adapt.lr == 1e-3 and adapt.general_tasks == ["LeeDocSTS"]
    config = AdaptConfig(registry_dir=settings.registry_dir, cache_dir=settings.cache_dir, settings=adapt)
    assert config.data_dir == tmp_path / "adapt-jobs"
    assert config.store_url == f"sqlite:///{tmp_path / 'adapt-jobs' / 'jobs.sqlite3'}"
    assert AdaptConfig.read(config.write(tmp_path / "cfg")) == config  # what a supervised worker reads


def test_disabled_adapt_answers_503(tmp_path: Path) -> None:
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path, enabled=False, supervise_worker=True), ADMIN_KEYS))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        r = c.post("/adapt", json=_body())
        assert r.status_code == 503 and "disabled" in r.json()["error"]["message"]
        assert app.state.adapt.supervisor is None  # no worker is started either


def test_a_large_body_is_read_in_another_process_with_the_same_answers(tmp_path: Path) -> None:
    """Over `INLINE_BYTES` a body is parsed, checked and saved by the reader process: the same job, the same errors
    (their codes and details cross the process boundary)."""
    config = _config(tmp_path, max_upload_bytes=8 * 2**20, max_documents=10_000, max_document_chars=2000)
    app = FastAPI()
    app.include_router(build_adapt_router(config, ADMIN_KEYS))
    long_doc = (DOC + " ") * 5  # ~400 characters
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        body = _body(texts=[long_doc] * 6000)
        assert len(json.dumps(body)) > INLINE_BYTES
        r = c.post("/adapt", json=body)
        assert r.status_code == 202, r.text
        stored = (tmp_path / "adapt" / "jobs" / r.json()["id"] / "corpus.jsonl").read_text().splitlines()
        assert len(stored) == 6000 and json.loads(stored[0]) == {"text": long_doc.strip()}
        r = c.post("/adapt", json=_body(texts=["one sentence only " * 5] * 30_000))
        assert r.status_code == 422 and r.json()["error"]["code"] == "too_many_documents"
        assert r.json()["error"]["details"] == {"documents": 30_000, "max_documents": 10_000}
        r = c.post("/adapt", json=_body(name="Bad", texts=[long_doc] * 6000))
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_name"
        assert len(list((tmp_path / "adapt" / "jobs").iterdir())) == 1  # refused corpora are not kept


def test_a_form_with_two_files_or_too_many_fields_is_refused(client: TestClient) -> None:
    fields = {"base_model": "tiny", "name": "up"}
    lines = "\n".join(json.dumps(DOC) for _ in range(5)).encode()
    r = client.post("/adapt", data=fields, files=[("file", ("a.jsonl", lines)), ("file", ("b.jsonl", lines))])
    assert r.status_code == 422 and "exactly one 'file' part" in r.json()["error"]["message"]
    many = {**fields, **{f"x{i}": "1" for i in range(40)}}
    r = client.post("/adapt", data=many, files={"file": ("a.jsonl", lines)})
    assert r.status_code == 422 and "more than 32 fields" in r.json()["error"]["message"]


def test_a_json_body_that_is_not_utf8_is_an_invalid_request(client: TestClient) -> None:
    r = client.post("/adapt", content=b'{"name":"a","texts":["\xff"]}', headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "not UTF-8" in error["message"]


DEEP = b"[" * 15_000


@pytest.mark.parametrize("body", [DEEP, b'{"texts": ' + DEEP + b"}"], ids=["body", "texts"])
def test_json_nested_too_deeply_is_an_invalid_request(client: TestClient, body: bytes) -> None:
    r = client.post("/adapt", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "nested too deeply" in error["message"]


@pytest.mark.parametrize("filename", ["c.jsonl", "c.json"])
def test_an_uploaded_file_nested_too_deeply_is_an_invalid_corpus(client: TestClient, filename: str) -> None:
    r = client.post("/adapt", data={"base_model": "tiny", "name": "up"}, files={"file": (filename, DEEP)})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_corpus" and "nested too deeply" in error["message"]


def _finished_job(client: TestClient, tmp_path: Path) -> str:
    """A job that ran and succeeded: its event stream ends by itself."""
    job_id = client.post("/adapt", json=_body()).json()["id"]
    store = JobStore(_config(tmp_path).store_url)
    claimed = store.claim_next("w", max_running=1, lease_s=30)
    store.finish(claimed.lease, SUCCEEDED)
    return job_id


@pytest.mark.parametrize("header", [b"\xb2", b"9" * 25, b"9223372036854775808", b"-1", b"+2", b"2.0"])
def test_a_last_event_id_that_is_not_one_of_ours_replays_the_stream_from_the_start(
    client: TestClient, tmp_path: Path, header: bytes
) -> None:
    job_id = _finished_job(client, tmp_path)
    with client.stream("GET", f"/adapt/{job_id}/events") as r:
        whole = "".join(r.iter_text())
    with client.stream("GET", f"/adapt/{job_id}/events", headers={"Last-Event-ID": header}) as r:
        assert r.status_code == 200
        replayed = "".join(r.iter_text())
    strip = [line for line in whole.splitlines() if not line.startswith("data: ")]
    assert [line for line in replayed.splitlines() if not line.startswith("data: ")] == strip
    assert whole.count("event: ") == 5  # state, audit, state, state, done


def test_last_event_id_is_parsed_strictly() -> None:
    assert last_event_id("3") == 3 and last_event_id("007") == 7 and last_event_id(str(2**63 - 1)) == 2**63 - 1
    for value in (None, "", "\xb2", "\u0663", str(2**63), "9" * 25, "-1", "+2", " 2", "2.0", "0x10"):
        assert last_event_id(value) == 0, value


@pytest.mark.parametrize("filename", ["c.txt", "c.jsonl", "c.json"])
def test_an_upload_past_max_documents_is_refused_with_the_document_limit(client: TestClient, filename: str) -> None:
    docs = [f"Document {i} has two sentences. This is its second." for i in range(51)]  # max_documents is 50
    data = {"c.txt": "\n".join(docs), "c.jsonl": "\n".join(map(json.dumps, docs)), "c.json": json.dumps(docs)}
    r = client.post("/adapt", data={"base_model": "tiny", "name": "up"}, files={"file": (filename, data[filename])})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "too_many_documents" and error["details"] == {"documents": 51, "max_documents": 50}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Team_Model", "base model 'Team_Model': invalid model name 'Team_Model': use 1-64 characters from a-z"),
        ("../up", "base model '../up': invalid model name"),
        ("m" * 60, "base model 'mmmm" + "m" * 56 + "' is too long: the student /adapt builds from it is named"),
    ],
)
def test_a_base_model_map_with_a_name_no_model_can_have_stops_the_server_before_it_loads(
    name: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pydantic import ValidationError

    from service.cli import main

    with pytest.raises(ValidationError, match=re.escape(message)):
        AdaptSettings(base_models={"tiny": "/models/tiny", name: "/x"})
    monkeypatch.setenv("EMBED_ADAPT_BASE_MODELS", json.dumps({name: "/x"}))
    assert main(["--port", "0"]) == 2  # refused while the settings are read: no model was loaded
    err = capsys.readouterr().err
    assert err.startswith("embedder serve: invalid settings: base_models: ") and message in err


def test_the_schema_describes_the_request_as_json_and_as_a_form(client: TestClient) -> None:
    body = client.app.openapi()["paths"]["/adapt"]["post"]["requestBody"]["content"]
    request = body["application/json"]["schema"]
    assert request["title"] == "AdaptRequest" and {"base_model", "name", "texts"} <= set(request["properties"])
    steps = next(option for option in request["properties"]["max_steps"]["anyOf"] if option.get("type") == "integer")
    assert steps["maximum"] == 20_000
    form = body["multipart/form-data"]["schema"]
    assert form["properties"]["file"]["format"] == "binary" and "texts" not in form["properties"]
    assert set(form["required"]) == {"base_model", "name", "file"}


def test_every_adapt_route_declares_what_the_services_guard_answers_on_any_route(client: TestClient) -> None:
    """Inside the service every /adapt request meets its guard first (`service.guard`): a Host it does not answer to
    (400), a body too slow (408), too large (413) or compressed (415), an unexpected error (500) — statuses the schema
    must name for these routes too, as it does for the embedding routes (docs/API.md: it documents every status)."""
    guarded = {"400", "401", "403", "408", "413", "415", "500", "503"}
    for path, operations in client.app.openapi()["paths"].items():
        for method, operation in operations.items():
            assert guarded <= set(operation["responses"]), (method, path)
