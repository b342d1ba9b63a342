"""/adapt routes against each job store backend (SQLite file, real PostgreSQL): what a request leaves behind when the
store fails while queueing it or the queue has no room for it and its student's build, a listing's unknown cursor,
and repeated cancels."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from adapt_jobs.jobs import AUDIT_EVENT, JOB_KIND_STUDENT_BUILD, QUEUED, StoreUnavailable
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


def _unavailable(why: str) -> Callable[..., None]:
    """A store method that fails as an unreachable database does."""

    def fail(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable(f"the adapt job store is unavailable: {why}")

    return fail


def _folders(tmp_path: Path) -> set[str]:
    jobs = tmp_path / "adapt" / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


def test_a_queued_job_is_answered_without_reading_it_back(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the job is committed, a store that fails to answer a read does not turn the request into a 503."""
    monkeypatch.setattr(_store(client), "get", _unavailable("connection reset"))
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
    monkeypatch.setattr(_store(client), "create", _unavailable("connection refused"))
    r = client.post("/adapt", json=_body())
    assert r.status_code == 503 and "retry shortly" in r.json()["error"]["message"]
    assert _folders(tmp_path) == set() and _store(client).list_jobs() == []


def _student_body(name: str = "acme") -> dict:
    return _body(name=name, student="sct-tiny")


def test_a_student_job_refused_for_want_of_room_leaves_no_build_behind(tmp_path: Path, store_url: str) -> None:
    """A job whose base student is not built needs two places (the build and the job): with one, it is refused
    whole — no build queued for nobody — and the answer says that asking again cannot help."""
    with _client(tmp_path, store_url, max_pending_jobs=1) as client:
        for _ in range(2):
            r = client.post("/adapt", json=_student_body())
            assert r.status_code == 429, r.text
            message = r.json()["error"]["message"]
            assert "needs 2" in message and "EMBED_ADAPT_MAX_PENDING_JOBS" in message
            assert "retry-after" not in r.headers
        assert _store(client).list_jobs() == [] and _folders(tmp_path) == set()


def test_a_student_job_and_its_build_take_two_places_or_none(tmp_path: Path, store_url: str) -> None:
    with _client(tmp_path, store_url, max_pending_jobs=3) as client:
        store = _store(client)
        first = client.post("/adapt", json=_body(name="plain")).json()
        second = client.post("/adapt", json=_body(name="plain2")).json()
        r = client.post("/adapt", json=_student_body())  # room for one: the build and the job need two
        assert r.status_code == 429 and r.headers["retry-after"] == "60" and "needs 2" in r.json()["error"]["message"]
        assert len(store.list_jobs()) == 2 and len(_folders(tmp_path)) == 2
        client.post(f"/adapt/{first['id']}/cancel")
        r = client.post("/adapt", json=_student_body())
        assert r.status_code == 202, r.text
        job = r.json()
        build = store.get(store.get(job["id"]).after_job)
        assert build.kind == JOB_KIND_STUDENT_BUILD and build.state == QUEUED
        assert build.params["name"] == "minilm-l6--sct-tiny" and build.id in _folders(tmp_path)
        assert client.post("/adapt", json=_student_body("other")).status_code == 429  # full: 3 queued
        claimed = [store.claim_next(w, max_running=2, lease_s=30) for w in ("w1", "w2")]
        assert [j.id if j else None for j in claimed] == [second["id"], build.id]  # both run: places are free
        r = client.post("/adapt", json=_student_body("other"))  # the running build is reused: one place is enough
        assert r.status_code == 202, r.text
        assert store.get(r.json()["id"]).after_job == build.id
        assert [j.id for j in store.list_jobs() if j.kind == JOB_KIND_STUDENT_BUILD] == [build.id]
        assert len(_folders(tmp_path)) == 4  # plain2, the build, and the two student jobs


def test_a_listing_after_an_unknown_or_pruned_job_is_404_naming_the_cursor(client: TestClient) -> None:
    ids = [client.post("/adapt", json=_body(name=f"m{i}")).json()["id"] for i in range(3)]
    page = client.get("/adapt", params={"limit": 1, "after": ids[2]}).json()
    assert [j["id"] for j in page["data"]] == [ids[1]] and page["has_more"] is True
    store = _store(client)
    store.request_cancel(ids[1])
    pruned = store.prune(client.app.state.adapt.holder, older_than_s=-1, lease_s=30)
    assert [e.job_id for e in pruned] == [ids[1]]  # the cursor's job is gone
    for cursor in (ids[1], "adaptjob-nope"):
        r = client.get("/adapt", params={"after": cursor})
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "job_not_found" and error["details"] == {"after": cursor}
        assert cursor in error["message"] and "from the start" in error["message"]
    assert [j["id"] for j in client.get("/adapt").json()["data"]] == [ids[2], ids[0]]


def test_repeated_cancels_of_a_running_job_are_answered_and_recorded_once(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = client.post("/adapt", json=_body()).json()["id"]
    store = _store(client)
    assert store.claim_next("w", max_running=1, lease_s=30).id == job_id
    caplog.set_level(logging.INFO)
    answers = [client.post(f"/adapt/{job_id}/cancel") for _ in range(3)]
    assert [r.status_code for r in answers] == [200] * 3
    assert answers[0].json()["state"] == "running" and answers[0].json()["cancel_requested"] is True
    assert answers[1].json() == answers[2].json() == answers[0].json()  # unchanged by asking again
    assert [e.type for e in store.events(job_id)].count(AUDIT_EVENT) == 2  # created, cancelled once
    assert [e.type for e in store.events(job_id)].count("cancel_requested") == 1
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("adapt audit: ")]
    assert len(lines) == 1 and '"action": "cancelled"' in lines[0]
    assert client.post("/adapt/adaptjob-nope/cancel").status_code == 404
