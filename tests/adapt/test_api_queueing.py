"""/adapt routes against each job store backend (SQLite file, real PostgreSQL): what a request leaves behind when the
store fails while queueing it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from adapt_jobs.jobs import QUEUED, StoreUnavailable
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from adapt_jobs.store_core import CommitUnknown
from service.adapt.api_router import build_adapt_router
from service.auth import ApiKeys

DOC = "Crops are cut from documents. Two sentences make one view. A third one helps."
KEY = "admin-secret"


def _client(tmp_path: Path, store_url: str, **overrides) -> TestClient:
    settings = AdaptSettings(**{
        "dir": tmp_path / "adapt", "store_url": store_url, "supervise_worker": False, "max_pending_jobs": 4,
        "min_documents": 4, "max_documents": 50, "max_document_chars": 500, "max_upload_bytes": 20_000, **overrides,
    })  # fmt: skip
    config = AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)
    app = FastAPI()
    app.include_router(build_adapt_router(config, ApiKeys.of([], [KEY])))
    return TestClient(app, headers={"Authorization": f"Bearer {KEY}"})


@pytest.fixture
def client(tmp_path: Path, store_url: str) -> Iterator[TestClient]:
    with _client(tmp_path, store_url) as c:
        yield c


def _body(**overrides) -> dict:
    return {"base_model": "minilm-l6", "name": "acme", "texts": [DOC] * 6, **overrides}


def _store(client: TestClient) -> JobStore:
    return client.app.state.adapt.store


def _folders(tmp_path: Path) -> set[str]:
    jobs = tmp_path / "adapt" / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


def test_a_queued_job_is_answered_without_reading_it_back(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the job is committed, a store that fails to answer a read does not turn the request into a 503."""

    def unavailable(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the adapt job store is unavailable: connection reset")

    monkeypatch.setattr(_store(client), "get", unavailable)
    r = client.post("/adapt", json=_body())
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == QUEUED and job["id"] in _folders(tmp_path)


def test_a_store_lost_as_the_job_commits_keeps_its_corpus_and_names_the_job(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection lost as the job's transaction commits: the job may be queued, so its corpus stays (a folder no
    job names is swept past the retention), and the answer names the job to look up before asking again."""
    store = _store(client)
    create = store.create

    def committed_then_lost(*args: object, **kwargs: object) -> None:
        create(*args, **kwargs)
        raise CommitUnknown("the adapt job store connection was lost: server closed the connection")

    monkeypatch.setattr(store, "create", committed_then_lost)
    r = client.post("/adapt", json=_body())
    assert r.status_code == 503 and r.headers["retry-after"] == "5"
    error = r.json()["error"]
    (job,) = store.list_jobs()
    assert error["details"]["job_id"] == job.id and f"GET /adapt/{job.id}" in error["message"]
    assert job.state == QUEUED and _folders(tmp_path) == {job.id}


def test_a_store_lost_before_the_commit_frees_the_corpus(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("the adapt job store is unavailable: connection refused")

    monkeypatch.setattr(_store(client), "create", unavailable)
    r = client.post("/adapt", json=_body())
    assert r.status_code == 503 and "retry shortly" in r.json()["error"]["message"]
    assert _folders(tmp_path) == set() and _store(client).list_jobs() == []
