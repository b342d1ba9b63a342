"""Hot reload of newly promoted bundles under traffic, and graceful shutdown."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from core import registry


def test_new_version_is_served_without_a_restart_and_no_request_fails(
    fake_registry, make_app, serve, publish_fake, fake_backend_cls
):
    app = make_app(registry_poll_seconds=0.05)
    results: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def client_loop(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                r = client.post("/embed", json={"inputs": ["steady traffic", "more words here"]})
                results.append((r.status_code, r.headers.get("x-model-version")))

    with serve(app) as (url, _):
        models = app.state.engine.models
        old = models.get("fake-a")
        old.backend.delay_s = 0.01
        threads = [threading.Thread(target=client_loop, args=(url,)) for _ in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while len(results) < 3 and time.monotonic() < deadline:  # the old version answers the traffic
            time.sleep(0.02)
        # slow warm-up: the old version must keep answering meanwhile
        new_bundle = publish_fake(fake_registry, "fake-a", dim=16, seed=42, warmup_s=0.4, delay_s=0.01)
        deadline = time.monotonic() + 10
        while models.get("fake-a") is old and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline = time.monotonic() + 30
        while "2" not in [version for _, version in results] and time.monotonic() < deadline:  # the traffic reaches it
            time.sleep(0.02)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert models.get("fake-a") is not old and models.get("fake-a").info.path == new_bundle
        response = httpx.post(f"{url}/embed", json={"inputs": "which version"})
    statuses = [status for status, _ in results]
    versions = [version for _, version in results]
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests, statuses {set(statuses)}"
    assert "1" in versions and "2" in versions
    first_new = versions.index("2")
    assert set(versions[first_new:]) <= {"1", "2"} and versions[:first_new].count("1") >= 3
    expected = fake_backend_cls(new_bundle)
    np.testing.assert_allclose(response.json()[0], expected.embed(expected.tokenize(["which version"]))[0], atol=1e-6)
    assert old.backend.closed  # the old version was drained and released


def test_a_request_tokenised_while_a_new_version_is_promoted_is_served_by_it(
    fake_registry, make_app, publish_fake, fake_backend_cls
):
    """The old version's queue closes the moment the new one is installed; a request that resolved the old version
    and was still being tokenised then is embedded by the new one instead of failing."""
    with TestClient(make_app()) as client:
        models = client.app.state.engine.models
        old = models.get("fake-a")
        entered, release = threading.Event(), threading.Event()
        tokenize = old.backend.tokenize

        def held(texts, direction="right"):
            entered.set()
            release.wait(10)
            return tokenize(texts, direction)

        old.backend.tokenize = held
        text = "word " * 1000  # over the inline bound: tokenised in a thread while the event loop runs on
        answer = {}
        body = {"inputs": text, "truncate": True}
        sender = threading.Thread(target=lambda: answer.update(r=client.post("/embed", json=body)))
        sender.start()
        assert entered.wait(10)
        new_bundle = publish_fake(fake_registry, "fake-a", dim=16, seed=42)
        assert client.portal.call(models.refresh) == ["fake-a"]
        deadline = time.monotonic() + 10
        while not old.batcher.closing and time.monotonic() < deadline:  # its close runs as a task of the loop
            time.sleep(0.01)
        assert old.batcher.closing
        release.set()
        sender.join(10)
    response = answer["r"]
    assert response.status_code == 200, response.text
    assert response.headers["x-model-version"] == "2"
    expected = fake_backend_cls(new_bundle)
    np.testing.assert_allclose(response.json()[0], expected.embed(expected.tokenize([text]))[0], atol=1e-6)


def test_new_model_name_appears_and_broken_bundle_keeps_old_one(fake_registry, make_app, publish_fake):
    with TestClient(make_app(), raise_server_exceptions=False) as client:
        models = client.app.state.engine.models
        publish_fake(fake_registry, "fake-c", dim=4)
        # a bundle whose manifest cannot be read must not take the served version down
        broken = publish_fake(fake_registry, "fake-b", dim=8)
        (broken / "manifest.json").write_text("{")
        changed = client.portal.call(models.refresh)
        assert changed == ["fake-c"]
        assert client.post("/embed", json={"inputs": "a", "model": "fake-c"}).status_code == 200
        assert client.post("/embed", json={"inputs": "a", "model": "fake-b"}).headers["x-model-version"] == "1"


def _start(app) -> None:
    with TestClient(app):
        pass


def test_missing_models_fail_at_start_with_what_to_do(make_app, tmp_path):
    with pytest.raises(RuntimeError, match=r"no promoted bundle for \['ghost'\].*promoted: \['fake-a', 'fake-b'\]"):
        _start(make_app(models="fake-a,ghost"))
    with pytest.raises(RuntimeError, match="default model 'fake-z' is not among the served models"):
        _start(make_app(default_model="fake-z"))
    with pytest.raises(RuntimeError, match="promoted: none"):
        _start(make_app(registry_dir=tmp_path / "empty"))


def test_a_model_longer_than_the_token_budget_is_refused_at_start_and_at_reload(fake_registry, make_app, publish_fake):
    """One text of max_seq_length tokens alone would be a batch over max_batch_tokens: the server does not start with
    such a model, and a version promoted later with such a length is not loaded (the previous one stays served)."""
    publish_fake(fake_registry, "long", max_seq_length=64)
    with pytest.raises(RuntimeError, match=r"'long'.*max_seq_length 64, more than max_batch_tokens \(16\).*"
                       r"set EMBED_MAX_BATCH_TOKENS to at least 64"):  # fmt: skip
        _start(make_app(models="fake-a,long", max_batch_tokens=16))
    with TestClient(make_app(models="fake-a,fake-b", max_batch_tokens=16), raise_server_exceptions=False) as client:
        models = client.app.state.engine.models
        publish_fake(fake_registry, "fake-b", dim=8, max_seq_length=17)
        assert client.portal.call(models.refresh) == []
        assert client.post("/embed", json={"inputs": "a", "model": "fake-b"}).headers["x-model-version"] == "1"


def test_graceful_shutdown_finishes_in_flight_and_refuses_new(make_app, serve):
    app = make_app()
    with serve(app, grace_seconds=10) as (url, server):
        backend = app.state.engine.models.get("fake-a").backend
        embed, release = backend.embed, threading.Event()

        def held(batch):  # the request in flight lasts until the late ones have been answered
            release.wait(30)
            return embed(batch)

        backend.embed = held
        slow: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: slow.append(httpx.post(f"{url}/embed", json={"inputs": "slow"})))
        thread.start()
        deadline = time.monotonic() + 10
        while app.state.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.handle_exit(signal.SIGTERM, None)
        try:
            refused = httpx.post(f"{url}/embed", json={"inputs": "late"})
            ready = httpx.get(f"{url}/ready")
        finally:
            release.set()
        thread.join(timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "shutting_down"
        assert slow and slow[0].status_code == 200 and len(slow[0].json()[0]) == 16
        deadline = time.monotonic() + 15
        while server.started and not server.should_exit and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.should_exit


def test_versions_listed_in_registry_match_what_is_served(fake_registry, make_app):
    with TestClient(make_app()) as client:
        cards = {m["id"]: m["version"] for m in client.get("/v1/models").json()["data"]}
    assert cards == {name: registry.current_version(fake_registry, name) for name in ("fake-a", "fake-b")}


def test_a_second_signal_stops_waiting_for_requests_in_flight(make_app, serve):
    app = make_app()
    with serve(app, grace_seconds=30) as (url, server):
        app.state.engine.models.get("fake-a").backend.delay_s = 3.0
        thread = threading.Thread(target=lambda: httpx.post(f"{url}/embed", json={"inputs": "slow"}, timeout=30))
        thread.start()
        deadline = time.monotonic() + 10
        while app.state.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.handle_exit(signal.SIGTERM, None)
        assert app.state.draining and not server.should_exit  # the first: drain, up to the grace
        server.handle_exit(signal.SIGTERM, None)
        assert server.should_exit and server.force_exit  # the second: leave without waiting
        thread.join(timeout=30)


def test_an_engine_choice_that_raises_falls_back_to_the_baseline_engine_and_says_why(
    make_app, fake_backend_cls, caplog
):
    """An exception of one engine while the choice runs (an OpenVINO error at its first inference, say) must not
    keep the model from being served: it is loaded on onnxruntime int8 (fp32 where int8 misses the bars), and its
    card and the log say why."""
    settings_seen = []

    def factory(bundle, settings):
        settings_seen.append(settings.engine)
        if settings.engine == "auto":
            raise RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp: boom")
        backend = fake_backend_cls(bundle, settings)
        choice = {"engine": "onnxruntime-int8", "precision": "int8", "setting": settings.engine, "reason": "pinned",
                  "trials": [], "routes": []}  # fmt: skip
        backend.info = replace(backend.info, engine=choice)
        return backend

    app = make_app(models="fake-a")
    app.state.engine.models.backend_factory = factory
    with TestClient(app) as client:
        assert client.post("/embed", json={"inputs": "served"}).status_code == 200
        card = client.get("/v1/models/fake-a").json()
    assert settings_seen == ["auto", "onnxruntime-int8"]
    assert card["engine"] == "onnxruntime-int8" and card["quantization"] == "int8"
    reason = card["engine_choice"]["reason"]
    assert "the engine choice failed (RuntimeError: Exception from src/inference" in reason
    assert reason.endswith("pinned")
    assert "boom" in caplog.text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_models_load_stops_the_server_at_once(tmp_path, sig):
    """Loading runs in a thread uvicorn waits for however often it is signalled: Ctrl-C during a minute's load did
    nothing until the load ended. Nothing is served or in flight yet, so the first signal stops it."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.ports import free_port
    from tests.service.conftest import make_fake_bundle

    root = Path(__file__).resolve().parents[2]
    make_fake_bundle(tmp_path / "reg", "slow", warmup_s=120)
    code = f"""
from service.app import create_app
from service.cli import run_server
from service.settings import ServiceSettings
from tests.service.conftest import FakeBackend
settings = ServiceSettings.from_flat(registry_dir={str(tmp_path / "reg")!r}, default_model="slow", port={free_port()},
                                     registry_poll_seconds=0, adapt_enabled=False)
run_server(create_app(settings, backend_factory=FakeBackend, include_adapt=False), settings)
"""
    server = subprocess.Popen(
        [sys.executable, "-c", code], cwd=root, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
    )  # fmt: skip
    try:
        lines = []
        for line in server.stderr:  # the lifespan has begun loading
            lines.append(line)
            if "Waiting for application startup" in line:
                break
        time.sleep(0.5)
        server.send_signal(sig)
        _, rest = server.communicate(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 128 + sig, "".join(lines) + rest
    assert f"embedder serve: stopped by {signal.Signals(sig).name} while starting, before anything was served" in rest
    assert "Traceback" not in rest
