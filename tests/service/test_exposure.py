"""What a started `embedder serve` exposes, with real processes: it refuses to start with /adapt open on an interface
other hosts reach, starts keyless on loopback, and serves /metrics on a port of its own when asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.ports import free_port
from tests.service.conftest import wait_ready

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    """This environment without any key or other EMBED_ setting a developer may have exported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_")}
    return env | {"HF_HUB_OFFLINE": "1", "EMBED_CACHE_DIR": os.environ.get("EMBED_CACHE_DIR", "/tmp")} | extra


def _command(tiny_registry: Path, tmp_path: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(tiny_registry), "--default-model", "tiny",
        "--adapt-dir", str(tmp_path / "adapt"), "--no-adapt-supervise-worker", "--intra-op-threads", "1", *flags,
    ]  # fmt: skip


@pytest.mark.parametrize("keys", [{}, {"EMBED_API_KEYS": "client-only"}], ids=["no-keys", "client-keys-only"])
def test_serve_on_every_interface_with_adapt_and_no_admin_key_exits_with_what_to_set(tiny_registry, tmp_path, keys):
    port = free_port()
    command = _command(tiny_registry, tmp_path, "--host", "0.0.0.0", "--port", str(port))
    result = subprocess.run(command, cwd=ROOT, env=_env(**keys), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "refusing to serve /adapt on 0.0.0.0" in result.stderr
    assert "Set EMBED_ADMIN_API_KEYS" in result.stderr and "EMBED_ADAPT_ENABLED=false" in result.stderr
    assert not (tmp_path / "adapt").exists()  # refused before anything was created


def test_serve_on_loopback_starts_keyless_and_serves_metrics_on_their_own_port(tiny_registry, tmp_path):
    port, metrics_port = free_port(), free_port()
    command = _command(tiny_registry, tmp_path, "--host", "127.0.0.1", "--port", str(port),
                       "--metrics-port", str(metrics_port))  # fmt: skip
    proc = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url, metrics_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_ready(proc, url)
        assert httpx.post(f"{url}/embed", json={"inputs": "hello"}).status_code == 200
        assert httpx.get(f"{url}/adapt").status_code == 200  # keyless /adapt is this machine's user's own
        assert httpx.get(f"{url}/metrics").status_code == 404
        scraped = httpx.get(metrics_url, timeout=10)
        assert scraped.status_code == 200
        families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
        served = [s for s in families["embed_requests"].samples if s.labels == {"route": "/embed", "model": "tiny"}]
        assert served[0].value == 1  # the app's own registry, not an empty one
        assert "embed_adapt_jobs" in families  # collectors registered by the /adapt routes are served there too
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert f"metrics: /metrics on 127.0.0.1:{metrics_port}" in output
    with pytest.raises(httpx.TransportError):
        httpx.get(metrics_url, timeout=2)
