"""The /adapt event stream as a client builds on it: every event once and in order, however often it reconnects, and
an end for every way a job ends — including a reconnect after the job's last event, and the events a job's end
commits after its ``state`` (a dependant's ``corpus_removed``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from adapt_jobs.jobs import CORPUS_REMOVED_EVENT, FAILED, SUCCEEDED
from adapt_jobs.store import JobStore
from service.adapt.api_router import build_adapt_router
from tests.adapt.test_api import ADMIN_KEYS, KEY, _body, _config


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr("service.adapt.api_state.KEEPALIVE_S", 0.2)  # a stream that does not end says so soon
    app = FastAPI()
    app.include_router(build_adapt_router(_config(tmp_path, max_pending_jobs=8), ADMIN_KEYS))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def _read(client: TestClient, job_id: str, last_id: int | None = None) -> list[tuple[int | None, str, dict]]:
    """The stream's events (id, type, data) until it ends; fails if it has not ended within a few seconds."""
    headers = {"Last-Event-ID": str(last_id)} if last_id is not None else {}
    deadline = time.monotonic() + 5
    text = ""
    with client.stream("GET", f"/adapt/{job_id}/events", headers=headers) as r:
        assert r.status_code == 200
        for chunk in r.iter_text():
            text += chunk
            assert time.monotonic() < deadline, f"the stream did not end: {text!r}"
    out = []
    for block in (b for b in text.split("\n\n") if b.strip() and not b.startswith(":")):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((int(fields["id"]) if "id" in fields else None, fields["event"], json.loads(fields["data"])))
    return out


def _finished(client: TestClient, tmp_path: Path) -> tuple[str, JobStore]:
    job_id = client.post("/adapt", json=_body()).json()["id"]
    store = JobStore(_config(tmp_path).store_url)
    claimed = store.claim_next("w", max_running=1, lease_s=30)
    store.update_progress(claimed.lease, {"stage": "training", "step": 1, "total": 2})
    store.finish(claimed.lease, SUCCEEDED)
    return job_id, store


def test_a_reconnect_after_every_event_gets_the_rest_once_and_then_the_end(client: TestClient, tmp_path: Path) -> None:
    job_id, _ = _finished(client, tmp_path)
    whole = _read(client, job_id)
    assert whole[-1][1] == "done" and [e[0] for e in whole[:-1]] == list(range(1, len(whole)))
    for last in range(1, len(whole)):  # dropped after event `last`, the terminal state's included
        resumed = _read(client, job_id, last)
        assert [e[0] for e in resumed[:-1]] == list(range(last + 1, len(whole)))
        assert resumed[-1][1] == "done" and resumed[-1][2]["state"] == "succeeded"


def test_a_dependant_of_a_failed_build_streams_its_corpus_removed_then_ends(client: TestClient, tmp_path: Path) -> None:
    waiting = client.post("/adapt", json=_body(student="sct-tiny")).json()
    store = JobStore(_config(tmp_path).store_url)
    held = store.claim_next("x", max_running=1, lease_s=30)
    assert held.id == waiting["after_job"]
    store.finish(held.lease, FAILED, reason="student", message="the build failed")
    events = _read(client, waiting["id"])
    assert [e[1] for e in events] == ["state", "audit", "state", CORPUS_REMOVED_EVENT, "done"]
    assert events[-1][2]["state"] == FAILED and events[-1][2]["error"]["reason"] == "dependency"
    assert [e[1] for e in _read(client, waiting["id"], events[2][0])] == [CORPUS_REMOVED_EVENT, "done"]


def test_an_idle_stream_does_not_read_the_store_at_every_poll(tmp_path: Path, store_url: str) -> None:
    """Streams of idle jobs share one poll of the store's event counters per process (SQLite; PostgreSQL's wake-ups
    are its notifications), rather than each reading its job's events at every poll: an event another process
    commits still reaches the stream within a poll or so."""
    app = FastAPI()
    config = _config(tmp_path, max_pending_jobs=8, poll_seconds=0.05, store_url=store_url)
    app.include_router(build_adapt_router(config, ADMIN_KEYS))
    with TestClient(app, headers={"Authorization": f"Bearer {KEY}"}) as client:
        job_id = client.post("/adapt", json=_body()).json()["id"]
        served = app.state.adapt.store
        reads = []
        events = served.events
        served.events = lambda *a, **k: reads.append(time.monotonic()) or events(*a, **k)
        worker = JobStore(config.store_url)  # another process's
        claimed = worker.claim_next("w", max_running=1, lease_s=30)
        seen: list[tuple[str, float]] = []

        def run() -> None:
            time.sleep(1.5)
            worker.update_progress(claimed.lease, {"stage": "training", "step": 1})
            seen.append(("committed", time.monotonic()))
            time.sleep(0.5)
            worker.finish(claimed.lease, SUCCEEDED)

        import threading

        thread = threading.Thread(target=run)
        with client.stream("GET", f"/adapt/{job_id}/events") as r:
            thread.start()
            for line in r.iter_lines():
                if line == "event: progress":
                    seen.append(("streamed", time.monotonic()))
        thread.join()
    (_, committed), (_, streamed) = seen
    assert streamed - committed < 1.0
    assert len(reads) <= 10, f"{len(reads)} reads of the job's events in 2 s of an idle stream polling every 0.05 s"
