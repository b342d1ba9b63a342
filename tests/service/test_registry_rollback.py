"""A running server and the registry commands: `embedder registry promote NAME <older version>` (a rollback) is served
without a restart, and `embedder registry prune` of the versions it does not serve, under traffic, fails no request."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from core import registry

ROOT = Path(__file__).resolve().parents[2]


def embedder_registry(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_")}
    return subprocess.run([sys.executable, "-m", "embedder.cli", "registry", *args, "--registry", str(root)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip


def test_a_rollback_is_served_without_a_restart_and_pruning_under_traffic_fails_nothing(
    fake_registry, make_app, serve, publish_fake
):
    for seed in (2, 3):  # fake-a versions 2 and 3, each its own vectors; 3 served
        publish_fake(fake_registry, "fake-a", dim=16, seed=seed)
    app = make_app(registry_poll_seconds=0.05)
    answers: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def traffic(url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not stop.is_set():
                r = client.post("/embed", json={"inputs": ["steady traffic"]})
                answers.append((r.status_code, r.headers.get("x-model-version")))

    def served_version(url: str, wanted: str) -> str | None:
        deadline, version = time.monotonic() + 10, None
        while time.monotonic() < deadline and version != wanted:
            version = httpx.post(f"{url}/embed", json={"inputs": "which"}).headers.get("x-model-version")
            time.sleep(0.02)
        return version

    with serve(app) as (url, _):
        assert served_version(url, "3") == "3"
        thread = threading.Thread(target=traffic, args=(url,))
        thread.start()
        try:
            rolled = embedder_registry("promote", "fake-a", "1", root=fake_registry)
            assert "rolled back from version 3" in rolled.stdout
            assert served_version(url, "1") == "1"
            # versions 2 and 3 are not served now (only the newest is kept by the count, plus the current one):
            pruned = embedder_registry("prune", "fake-a", "--keep", "1", "--min-age", "0", root=fake_registry)
            assert pruned.stdout.startswith("fake-a: removed version 2 ")
            time.sleep(0.3)  # a few registry polls and requests after the prune
            assert registry.list_versions(fake_registry, "fake-a") == ["1", "3"]
            embedder_registry("promote", "fake-a", "3", root=fake_registry)  # forward again, to the kept newest
            assert served_version(url, "3") == "3"
        finally:
            stop.set()
            thread.join(timeout=30)
        cards = {m["id"]: m["version"] for m in httpx.get(f"{url}/v1/models").json()["data"]}
    statuses = {status for status, _ in answers}
    versions = [version for _, version in answers]
    assert statuses == {200}, f"{len(answers)} requests, statuses {statuses}"
    assert "1" in versions and versions[-1] == "3"
    assert cards["fake-a"] == "3"
