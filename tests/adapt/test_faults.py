"""Faults at every stage of an /adapt job, made for real: a worker SIGKILLed during export and during publish, the
scratch volume full during export, a read-only registry, the database restarting mid-job. Each must leave no
half-written bundle visible to a replica, a job record that says what happened (retried, or failed with its reason),
and serving uninterrupted.

One `embedder serve` replica supervising its worker, on the real PostgreSQL store (so a full scratch volume does not
also take the job store with it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import registry
from tests.adapt.cluster import (
    ACTIVE,
    ROOT,
    Replica,
    can_mount,
    cluster_env,
    pid_of_worker,
    read_only_dir,
    size_limited_dir,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def deployment(tmp_path: Path, base_registry: Path, tiny_bert_path: Path, postgres):
    """Start one replica on demand (after the test prepared its volumes); stop it and show its log on failure."""
    started: list[Replica] = []

    def start(**settings: object) -> Replica:
        if not (tmp_path / "registry").exists():
            shutil.copytree(base_registry, tmp_path / "registry", symlinks=True)
        env = cluster_env(tmp_path, postgres.new_database(), tiny_bert_path, **settings)
        replica = Replica("replica", env, tmp_path / "logs")
        started.append(replica)
        replica.wait_ready()
        return replica

    yield start
    for replica in started:
        replica.stop(timeout_s=30)
        print(f"---- {replica.name} (shown when the test fails) ----\n{replica.log()[-6000:]}")


def _ended(replica: Replica, job_id: str, timeout_s: float = 240.0) -> dict:
    return wait_for(lambda: (j := replica.job(job_id))["state"] not in ACTIVE and j, timeout_s, every_s=0.3)


def _serving(replica: Replica) -> bool:
    return replica.client.post("/embed", json={"inputs": "still serving"}).status_code == 200


def _visible(root: Path, name: str) -> list[str]:
    """What a replica would see of ``name``: published versions and the promoted one (hidden staging excluded)."""
    return [*registry.list_versions(root, name), *([c] if (c := registry.current_version(root, name)) else [])]


def test_sigkill_during_export_is_retried_and_publishes_once(deployment, tmp_path: Path, corpus) -> None:
    replica = deployment()
    job = replica.submit(corpus, name="killed-in-export", max_steps=40)
    half_written = tmp_path / "adapt" / "jobs" / job["id"] / "attempt-1" / "bundle" / "model.onnx"
    wait_for(half_written.exists, timeout_s=180, every_s=0.005, what="the export writing model.onnx")
    worker = replica.job(job["id"])["attempts"][0]["worker_id"]
    os.kill(pid_of_worker(worker), signal.SIGKILL)
    assert _visible(tmp_path / "registry", "killed-in-export") == []  # the half export is in scratch only
    assert _serving(replica)
    done = _ended(replica, job["id"])
    assert done["state"] == "succeeded", done
    assert [a["outcome"] for a in done["attempts"]] == ["interrupted", "succeeded"]
    assert _visible(tmp_path / "registry", "killed-in-export") == ["1", "1"]  # one version, from the retry
    folder = tmp_path / "adapt" / "jobs" / job["id"]
    wait_for(lambda: not folder.exists(), timeout_s=10, what="both attempts' scratch deleted")  # just after the end


def test_sigkill_during_publish_leaves_no_version_visible(tmp_path: Path, base_registry: Path) -> None:
    """A process is SIGKILLed in the middle of `publish_bundle`, after it reserved a version and copied one file of
    the bundle into the registry: no replica sees that version, and the next publish of the name works."""
    target = tmp_path / "registry"
    shutil.copytree(base_registry, target, symlinks=True)
    staging = tmp_path / "staging"
    shutil.copytree(registry.current_bundle(base_registry, "tiny-base"), staging)
    code = f"""
import os, shutil, signal
from pathlib import Path
from core import registry
from export import bundle as exporter

def copy_one_file_then_die(src, dst, **kwargs):
    os.makedirs(dst)
    first = sorted(os.listdir(src))[0]
    shutil.copy2(os.path.join(src, first), os.path.join(dst, first))
    os.kill(os.getpid(), signal.SIGKILL)

exporter.shutil.copytree = copy_one_file_then_die
manifest = registry.read_manifest(Path({str(staging)!r})) | {{"name": "published"}}
exporter.publish_bundle(Path({str(staging)!r}), Path({str(target)!r}), manifest, promote=True)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert any(p.name.startswith(".") for p in (target / "published").iterdir())  # it did die mid-publish
    assert _visible(target, "published") == [] and "published" not in registry.served_models(target)
    from export.bundle import publish_bundle

    manifest = registry.read_manifest(staging) | {"name": "published"}
    again = publish_bundle(staging, target, manifest, promote=True)
    assert registry.served_models(target)["published"] == again  # the name works; the dead reservation is skipped


@pytest.mark.skipif(not can_mount() and os.environ.get("CI") != "true", reason="mounting a tmpfs needs root")
def test_full_scratch_volume_during_export_fails_the_job_with_its_reason(deployment, tmp_path: Path, corpus) -> None:
    # The tiny model's training writes ~22 MB (checkpoint with optimizer state, final, best); its export ~5 MB more:
    # 24 MB lets training finish and fills up during export. If training fails instead, these sizes changed.
    with size_limited_dir(tmp_path / "adapt", "24m"):
        replica = deployment()
        job = replica.submit(corpus, name="full-disk", max_steps=40)
        done = _ended(replica, job["id"])
        assert done["state"] == "failed", done
        assert done["error"] == {
            "reason": "export",
            "message": "export failed: no space left on the adapt scratch volume (EMBED_ADAPT_DIR)",
        }
        assert [a["outcome"] for a in done["attempts"]] == ["failed"]  # not retried: a full disk needs an operator
        assert _visible(tmp_path / "registry", "full-disk") == []
        folder = tmp_path / "adapt" / "jobs" / job["id"]
        wait_for(lambda: not folder.exists(), timeout_s=10, what="the failed job's files freed")
        assert _serving(replica)
        replica.stop(timeout_s=30)


@pytest.mark.skipif(not can_mount() and os.environ.get("CI") != "true", reason="a read-only bind mount needs root")
def test_read_only_registry_fails_publishing_and_keeps_serving(deployment, tmp_path: Path, corpus) -> None:
    replica = deployment()
    with read_only_dir(tmp_path / "registry"):
        job = replica.submit(corpus, name="read-only", max_steps=40)
        done = _ended(replica, job["id"])
        assert done["state"] == "failed", done
        message = "publish failed: the model registry volume is read-only"
        assert done["error"] == {"reason": "publish", "message": message}
        assert done["evaluation"] is not None and done["model"] is None  # it got as far as publishing
        assert _serving(replica)
    assert _visible(tmp_path / "registry", "read-only") == []


def test_database_restart_mid_job_is_survived(deployment, tmp_path: Path, corpus, postgres) -> None:
    replica = deployment(adapt_lease_seconds=20.0)  # a lease longer than the outage: the worker keeps its job
    job = replica.submit(corpus, name="db-restart", max_steps=20_000, time_budget_s=8)
    wait_for(lambda: (replica.job(job["id"])["progress"].get("step") or 0) >= 1, what="training")
    postgres.stop()  # immediate: every connection breaks mid-transaction
    try:
        time.sleep(1.0)
        assert _serving(replica)  # /embed never touches the job store
        down = replica.client.get(f"/adapt/{job['id']}")
        assert down.status_code == 503 and down.headers["retry-after"] == "5", down.text
        assert down.json()["error"]["message"] == "the adapt job store is unavailable; retry shortly"
        time.sleep(2.0)
    finally:
        postgres.start()
    done = _ended(replica, job["id"])
    assert done["state"] == "succeeded", done
    assert [a["outcome"] for a in done["attempts"]] == ["succeeded"]  # one attempt: the outage cost no retry
    assert _visible(tmp_path / "registry", "db-restart") == ["1", "1"]
