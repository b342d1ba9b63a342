"""/adapt end to end: the service supervises a real `embedder adapt-worker` process that fine-tunes a tiny
BERT, exports, evaluates, publishes and promotes — then the service serves the new model.

One service (and its worker process) serves the tests in order: happy path, gate failure, cancel,
then the worker is killed. The corpus is 80 Lee background news documents; the gate's general side is
LeeDocSTS only, to fit the test budget. The lr is high (5e-3, every layer) so random tiny weights gain
in-domain within 15 steps — deterministic, as training is seeded and evaluation exact. The gate
failure trains for zero steps (a time budget that is spent before the first step), so the adapted
model equals the base and cannot improve.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from adapt.store import FAILED, INTERRUPTED, JobStore
from core import registry
from core.corpora import lee_background
from service.app import create_app
from service.settings import ServiceSettings

pytestmark = pytest.mark.slow

ADMIN = "admin-key"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def base_registry(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """A registry serving one tiny bundle, so the service starts without exporting minilm-l6."""
    from export.api import export_bundle

    root = tmp_path_factory.mktemp("base-registry")
    export_bundle(tiny_bert_path, root, "tiny-base", promote=True)
    return root


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return list(lee_background()[:80])


def _settings(tmp_path: Path, base_registry: Path, tiny_bert_path: Path, **overrides: Any) -> ServiceSettings:
    registry_dir = tmp_path / "registry"
    if not registry_dir.exists():
        shutil.copytree(base_registry, registry_dir, symlinks=True)
    values: dict[str, Any] = {
        "registry_dir": registry_dir,
        "default_model": "tiny-base",
        "registry_poll_seconds": 0.3,
        "warmup": False,
        "admin_api_keys": [ADMIN],
        "adapt_dir": tmp_path / "adapt",
        "adapt_base_models": {"tiny": str(tiny_bert_path)},
        "adapt_min_documents": 16,
        "adapt_batch_size": 8,
        "adapt_max_steps": 12,
        "adapt_worker_threads": 1,
        "adapt_general_tasks": ["LeeDocSTS"],
    }
    values.update(overrides)
    return ServiceSettings(**values)


@contextmanager
def _service(settings: ServiceSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, base_registry: Path, tiny_bert_path: Path
) -> Iterator[tuple[TestClient, ServiceSettings]]:
    settings = _settings(
        tmp_path_factory.mktemp("adapt-service"),
        base_registry,
        tiny_bert_path,
        adapt_lr=5e-3,
        adapt_train_last_layers=0,
        adapt_gate_margin=100.0,
        adapt_max_pending_jobs=4,
    )
    with _service(settings) as client:
        yield client, settings


def _finished(client: TestClient, job_id: str, timeout_s: float = 150.0) -> dict[str, Any]:
    active = ("queued", "running", "evaluating")
    return _wait(lambda: (j := _job(client, job_id))["state"] not in active and j, timeout_s=timeout_s)


def _wait(predicate: Callable[[], Any], timeout_s: float = 120.0, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _job(client: TestClient, job_id: str) -> dict[str, Any]:
    r = client.get(f"/adapt/{job_id}", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def _submit(client: TestClient, corpus: list[str], **fields: Any) -> dict[str, Any]:
    body = {"base_model": "tiny", "name": "news", "texts": corpus, **fields}
    r = client.post("/adapt", json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    return r.json()


def test_happy_path_submit_events_succeed_and_serve(
    service: tuple[TestClient, ServiceSettings], corpus: list[str]
) -> None:
    client, settings = service
    job = _submit(client, corpus, max_steps=15, seed=1)
    events: list[tuple[str | None, dict[str, Any]]] = []
    with client.stream("GET", f"/adapt/{job['id']}/events", headers=AUTH) as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((kind, json.loads(line.removeprefix("data: "))))
    states = [data["state"] for kind, data in events if kind == "state"]
    assert states == ["queued", "running", "evaluating", "succeeded"]
    steps = [data["step"] for kind, data in events if kind == "progress" and data.get("step")]
    assert steps and steps[-1] == 15 and steps == sorted(steps)
    assert [kind for kind, _ in events][-1] == "done"

    done = _job(client, job["id"])
    assert done["state"] == "succeeded", done
    assert done["model"] == {"name": "news", "version": "1", "promoted": True}
    evaluation = done["evaluation"]
    assert evaluation["in_domain"]["adapted"] > evaluation["in_domain"]["base"], evaluation
    assert done["gate"]["passed"] and done["corpus"]["held_out_documents"] == 16
    assert done["corpus"]["crop_yield"] > 0.9 and done["progress"]["stage"] == "done"

    manifest = registry.read_manifest(registry.current_bundle(settings.registry_dir, "news"))
    assert manifest["method"]["name"] == "adapt" and manifest["base_model"] == "tiny"
    assert manifest["validation"]["gate"]["passed"] and manifest["max_seq_length"] == 128
    # the tiny base declares no corpora; the adapted model adds the customer's, which no suite task draws from
    assert manifest["trained_on"] == ["adapt:news"] and evaluation["general_in_domain"] == []

    # the service picks the new model up without a restart
    _wait(lambda: "news" in [m["id"] for m in client.get("/v1/models").json()["data"]], timeout_s=30)
    reply = client.post("/v1/embeddings", json={"model": "news", "input": ["a tuned embedding"]})
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["data"][0]["embedding"]) == 32
    assert not (settings.adapt_dir / "jobs" / job["id"]).exists()  # upload and scratch deleted
    assert 'embed_adapt_jobs{state="succeeded"} 1.0' in client.get("/metrics").text


def test_gate_failure_publishes_but_does_not_promote(
    service: tuple[TestClient, ServiceSettings], corpus: list[str]
) -> None:
    client, settings = service
    job = _submit(client, corpus, name="news-gate", time_budget_s=0.001)
    done = _finished(client, job["id"])
    assert done["state"] == "succeeded", done
    assert done["model"] == {"name": "news-gate", "version": "1", "promoted": False}
    assert not done["gate"]["passed"]
    assert any("CropPairRetrieval-heldout: must improve" in r for r in done["gate"]["reasons"])
    assert registry.list_versions(settings.registry_dir, "news-gate") == ["1"]
    assert registry.current_version(settings.registry_dir, "news-gate") is None


def test_cancel_while_running(service: tuple[TestClient, ServiceSettings], corpus: list[str]) -> None:
    client, settings = service
    job = _submit(client, corpus, name="news-cancel", max_steps=20_000, time_budget_s=600)
    _wait(lambda: (_job(client, job["id"])["progress"].get("step") or 0) >= 1)
    r = client.post(f"/adapt/{job['id']}/cancel", headers=AUTH)
    assert r.status_code == 200 and r.json()["cancel_requested"]
    done = _finished(client, job["id"], timeout_s=30)
    assert done["state"] == "cancelled" and done["model"] is None
    assert registry.list_versions(settings.registry_dir, "news-cancel") == []


def test_worker_killed_mid_job(service: tuple[TestClient, ServiceSettings], corpus: list[str]) -> None:
    """kill -9 the worker mid-training: the job fails "interrupted", the registry is unchanged, the
    service keeps serving, and the supervisor starts a new worker."""
    client, settings = service
    before = registry.served_models(settings.registry_dir)
    job = _submit(client, corpus, name="news-kill", max_steps=20_000, time_budget_s=600)
    running = _wait(lambda: (j := _job(client, job["id"]))["progress"].get("step") and j)
    supervisor = client.app.state.adapt.supervisor
    pid = next(w["pid"] for w in supervisor.status()["workers"])
    # the worker runs niced (adapt_worker_nice, default 10): /embed gets the cores first
    assert os.getpriority(os.PRIO_PROCESS, pid) == min(
        19, os.getpriority(os.PRIO_PROCESS, 0) + settings.adapt_worker_nice
    )
    os.kill(pid, signal.SIGKILL)
    failed = _wait(lambda: (j := _job(client, job["id"]))["state"] == FAILED and j, timeout_s=30)
    assert running["state"] == "running"
    assert failed["error"]["reason"] == INTERRUPTED and "exited with code -9" in failed["error"]["message"]
    assert registry.served_models(settings.registry_dir) == before
    assert registry.list_versions(settings.registry_dir, "news-kill") == []
    assert client.post("/embed", json={"inputs": "still serving"}).status_code == 200
    _wait(lambda: any(w["alive"] and w["pid"] != pid for w in supervisor.status()["workers"]), timeout_s=30)
    assert supervisor.restarts == 1


def test_restart_recovery_from_sqlite(
    tmp_path: Path, base_registry: Path, tiny_bert_path: Path, corpus: list[str]
) -> None:
    settings = _settings(tmp_path, base_registry, tiny_bert_path, adapt_supervise_worker=False)
    with _service(settings) as client:  # no worker: jobs stay queued
        finished = _submit(client, corpus)["id"]
        interrupted = _submit(client, corpus)["id"]
        queued = _submit(client, corpus)["id"]
    # what a previous run left behind: one job done, one mid-run when the process died
    store = JobStore(settings.adapt_dir / "jobs.sqlite3")
    store.claim_next("old-worker", max_running=5)
    store.update_result(finished, {"model": {"name": "news", "version": "7", "promoted": False}})
    store.finish(finished, "succeeded")
    store.claim_next("old-worker", max_running=5)
    store.update_progress(interrupted, {"stage": "training", "step": 3, "total": 12})

    with _service(_settings(tmp_path, base_registry, tiny_bert_path)) as client:
        assert _job(client, finished)["model"]["version"] == "7"
        lost = _job(client, interrupted)
        assert lost["state"] == "failed" and lost["error"]["reason"] == "interrupted"
        assert lost["progress"]["step"] == 3
        # the queued job is taken by the new worker
        assert _wait(lambda: _job(client, queued)["state"] == "running", timeout_s=60)
        listing = client.get("/adapt", headers=AUTH).json()["data"]
        assert [j["id"] for j in listing] == [queued, interrupted, finished]
    # shutting the service down stops the worker; its job ends interrupted, never half-published
    after = JobStore(settings.adapt_dir / "jobs.sqlite3").get(queued)
    assert after.state == "failed" and after.error["reason"] == "interrupted"
    assert registry.list_versions(settings.registry_dir, "news") == []
