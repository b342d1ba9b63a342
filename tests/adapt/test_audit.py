"""Audit records: who created, cancelled or promoted an /adapt job — an ``audit`` event in the job store (kept as long
as the job) and an ``adapt audit:`` log line — naming the caller's API key id, never the key."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from adapt_jobs.jobs import AUDIT_EVENT
from adapt_jobs.store import JobStore
from adapt_worker.context import JobContext
from service.adapt.api_router import build_adapt_router
from service.auth import ApiKeys, key_id
from tests.adapt.test_api import DOC, _config

KEY = "admin-secret"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path), ApiKeys.of(["client-key"], ["other-key", KEY])))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _body(name: str = "acme") -> dict:
    return {"base_model": "minilm-l6", "name": name, "texts": [DOC] * 6}


def _audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict]:
    prefix = "adapt audit: "
    lines = [r.getMessage() for r in caplog.records]
    return [json.loads(line.removeprefix(prefix)) for line in lines if line.startswith(prefix)]


def test_creating_a_job_records_the_callers_key_id(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    job = client.post("/adapt", json=_body()).json()
    assert job["created_by"] == key_id(KEY) and KEY not in json.dumps(job)
    store: JobStore = client.app.state.adapt.store
    (record,) = [e.data for e in store.events(job["id"]) if e.type == AUDIT_EVENT]
    assert record == {"action": "created", "actor": key_id(KEY), "name": "acme"}
    assert _audit_lines(caplog) == [{"job_id": job["id"], **record}]


def test_cancelling_a_job_records_who_cancelled_it(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    job_id = client.post("/adapt", json=_body()).json()["id"]
    caplog.set_level(logging.INFO)
    other = {"Authorization": "Bearer other-key"}
    assert client.post(f"/adapt/{job_id}/cancel", headers=other).json()["state"] == "cancelled"
    assert client.post(f"/adapt/{job_id}/cancel").status_code == 200  # already ended: nothing to record
    store: JobStore = client.app.state.adapt.store
    records = [e.data for e in store.events(job_id) if e.type == AUDIT_EVENT]
    assert records == [
        {"action": "created", "actor": key_id(KEY), "name": "acme"},
        {"action": "cancelled", "actor": key_id("other-key"), "name": "acme"},
    ]
    assert _audit_lines(caplog) == [{"job_id": job_id, **records[1]}]


def test_an_open_server_records_no_key(tmp_path: Path) -> None:
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path), ApiKeys()))
    with TestClient(app) as c:
        job = c.post("/adapt", json=_body(), headers={"Authorization": "Bearer anything"}).json()
        assert job["created_by"] is None
        events = c.app.state.adapt.store.events(job["id"])
    assert [e.data for e in events if e.type == AUDIT_EVENT] == [{"action": "created", "actor": None, "name": "acme"}]


def test_a_workers_promotion_names_the_worker_and_the_creator(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = client.post("/adapt", json=_body()).json()["id"]
    store: JobStore = client.app.state.adapt.store
    claimed = store.claim_next("worker-7", max_running=1, lease_s=30)
    caplog.set_level(logging.INFO)
    JobContext(store, claimed, threading.Event(), lease_s=30).audit("promoted", version="3")
    (record,) = [e.data for e in store.events(job_id) if e.type == AUDIT_EVENT and e.data["action"] == "promoted"]
    assert record == {
        "action": "promoted", "actor": "worker-7", "on_behalf_of": key_id(KEY), "name": "acme", "version": "3",
    }  # fmt: skip
    assert _audit_lines(caplog) == [{"job_id": job_id, **record}]
