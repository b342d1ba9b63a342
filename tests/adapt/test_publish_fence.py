"""The publish stage of an /adapt job against other processes sharing the registry and the job store, for real: a
worker process runs the real `adapt_worker.release.publish` stage on a real PostgreSQL store, its copy into the
registry held until the test lets it go, while the test does what another replica or worker would meanwhile.

- A worker paused past its lease (SIGSTOP: a frozen node, a throttled container) whose job was taken back and
  claimed by another worker must not promote what it was copying when it wakes up.
- A job whose version was overtaken by a newer one of the same name, promoted by another job meanwhile, must say
  that its own version was not promoted (and leave the newer one served)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapt_jobs.jobs import RUNNING, SUCCEEDED
from adapt_jobs.store import JobStore
from core import registry
from tests.adapt.cluster import ROOT, wait_for

pytestmark = pytest.mark.slow  # worker processes that import the torch stack

LEASE_S = 2.0
NAME = "acme"


def _run_publish(url: str, root: str, name: str) -> None:
    """The worker process: claim the job, run the publish stage under the worker's loop (`process_job`: heartbeat,
    lease, how it ends), with the copy into the registry held until ``<root>/go`` exists; print how it ended."""
    import shutil
    import threading
    from types import SimpleNamespace

    from adapt_jobs.results import Evaluation, GateDecision
    from adapt_jobs.settings import AdaptConfig, AdaptSettings
    from adapt_worker.attempt import Exported, Verdict
    from adapt_worker.context import scratch_dir
    from adapt_worker.release import publish
    from adapt_worker.worker import process_job

    base = Path(root)
    copy = shutil.copytree

    def held_copy(src: object, dst: object, **kwargs: object) -> object:
        (base / "copying").touch()
        while not (base / "go").exists():
            time.sleep(0.01)
        return copy(src, dst, **kwargs)

    shutil.copytree = held_copy
    settings = AdaptSettings(dir=base / "adapt", lease_seconds=LEASE_S, store_url=url)
    config = AdaptConfig(registry_dir=base / "registry", cache_dir=base / "cache", settings=settings)
    store = JobStore(url)
    job = store.claim_next("w1", max_running=1, lease_s=LEASE_S)
    assert job is not None
    staging = scratch_dir(job) / "bundle"
    staging.mkdir(parents=True)
    (staging / "model.onnx").write_bytes(b"w" * 4096)
    (staging / registry.MANIFEST).write_text(json.dumps({"name": name}))

    def pipeline(job: object, ctx: object, config: AdaptConfig) -> None:
        attempt = SimpleNamespace(job=job, ctx=ctx, config=config, promote=True)
        publish(attempt, Exported(staging), Verdict(Evaluation(), GateDecision(passed=True)))

    print(json.dumps(process_job(store, job, config, threading.Event(), pipeline)), flush=True)


@pytest.fixture
def publishing(tmp_path: Path, postgres):
    """A queued job and a worker process running its publish stage, held in the copy into the registry."""
    url = postgres.new_database()
    (tmp_path / "registry").mkdir()
    (tmp_path / "adapt" / "jobs").mkdir(parents=True)
    store = JobStore(url)
    job = store.create({"base_model": "b", "name": NAME}, corpus_dir=tmp_path / "adapt" / "jobs" / "j",
                       n_documents=1, max_pending=5, max_attempts=3)  # fmt: skip
    code = f"from tests.adapt.test_publish_fence import _run_publish as run; run({url!r}, {str(tmp_path)!r}, {NAME!r})"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    worker = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "copying").exists() or worker.poll() is not None, 180, 0.02, "the copy begun")
        assert worker.poll() is None, "the worker process ended before it copied"
        yield store, job, worker
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
            worker.wait()


def _stop_outside_a_transaction(worker: subprocess.Popen[str], store: JobStore) -> None:
    """SIGSTOP ``worker`` at a moment none of its store connections is inside a transaction. Frozen inside its
    heartbeat's renewal, it would hold the job's row lock, which a rescuer skips as it skips every job another process
    is writing: the job could not be taken back while the worker stays frozen, whatever its lease (another fault than
    the one this test makes, and one the heartbeat's few milliseconds in every 0.7 s make rare, not impossible)."""
    import sqlalchemy as sa

    others_busy = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend' AND state <> 'idle'"
    )
    for _ in range(100):
        os.kill(worker.pid, signal.SIGSTOP)
        with store.engine.connect() as conn:  # this test's other connections are idle in its pool
            busy = conn.execute(others_busy).scalar_one()
        if not busy:
            return
        os.kill(worker.pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("the worker was inside a store transaction every time it was stopped")


def _outcome(worker: subprocess.Popen[str]) -> str:
    out, _ = worker.communicate(timeout=120)
    return json.loads(out.strip().splitlines()[-1])


def test_a_worker_paused_past_its_lease_does_not_promote_when_it_wakes(publishing, tmp_path: Path) -> None:
    store, job, worker = publishing
    _stop_outside_a_transaction(worker, store)  # its heartbeat stops with it
    time.sleep(LEASE_S + 1.0)
    assert [e.job_id for e in store.rescue_expired()] == [job.id]  # any replica's rescuer
    retry = store.claim_next("w2", max_running=1, lease_s=30.0)  # and another worker runs it again
    assert retry is not None and retry.attempt == 2
    (tmp_path / "go").touch()
    os.kill(worker.pid, signal.SIGCONT)
    assert _outcome(worker) == "abandoned"
    assert registry.current_version(tmp_path / "registry", NAME) is None  # nothing served from the lost attempt
    now = store.get(job.id)
    assert now.state == RUNNING and now.worker_id == "w2" and "model" not in now.result


def test_a_version_overtaken_by_a_newer_promotion_says_it_was_not_promoted(publishing, tmp_path: Path) -> None:
    store, job, worker = publishing
    root = tmp_path / "registry"
    newer = registry.reserve_version(root, NAME)  # another job of the same name publishes meanwhile
    (root / NAME / ".other").mkdir()
    (root / NAME / ".other" / registry.MANIFEST).write_text(json.dumps({"name": NAME}))
    registry.publish(root / NAME / ".other", root, NAME, newer)
    assert registry.promote(root, NAME, newer)
    (tmp_path / "go").touch()
    assert _outcome(worker) == SUCCEEDED
    done = store.get(job.id)
    assert done.result["model"] == {"name": NAME, "version": "1", "promoted": False}
    assert registry.current_version(root, NAME) == newer == "2"
    logs = [e.data["message"] for e in store.events(job.id) if e.type == "log"]
    assert any("version 2" in m and "newer" in m for m in logs), logs
    assert not [e for e in store.events(job.id) if e.type == "audit" and e.data["action"] == "promoted"]


def test_a_cancel_once_the_copy_began_is_refused_and_the_job_ends_with_its_model(publishing, tmp_path: Path) -> None:
    """Past the point of no return a cancel is not acknowledged (the answer says so: no ``cancel_requested``, no audit
    record) rather than acknowledged and then ignored by a job that goes on to promote its model."""
    store, job, worker = publishing
    answered, asked = store.cancel(job.id, actor="key-1")
    assert not asked and not answered.cancel_requested and answered.state == RUNNING
    assert answered.progress["stage"] == "publishing"
    (tmp_path / "go").touch()
    assert _outcome(worker) == SUCCEEDED
    assert registry.current_version(tmp_path / "registry", NAME) == "1"
    types = [(e.type, e.data.get("action")) for e in store.events(job.id)]
    assert ("audit", "cancelled") not in types and ("cancel_requested", None) not in types


def test_a_cancel_acknowledged_before_the_publish_publishes_nothing(tmp_path: Path, store_url: str) -> None:
    """A cancel that lands after the job's last stop check and before its publish (the end of its evaluation) stops it
    at the publish: nothing reaches the registry, and the job ends cancelled."""
    import threading
    from types import SimpleNamespace

    from adapt_jobs.results import Evaluation, GateDecision
    from adapt_jobs.settings import AdaptConfig, AdaptSettings
    from adapt_worker.attempt import Exported, Verdict
    from adapt_worker.context import scratch_dir
    from adapt_worker.release import publish
    from adapt_worker.worker import process_job

    settings = AdaptSettings(dir=tmp_path / "adapt", store_url=store_url)
    config = AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)
    store = JobStore(store_url)
    store.create({"base_model": "b", "name": NAME}, corpus_dir=tmp_path / "adapt" / "jobs" / "j", n_documents=1,
                 max_pending=5, max_attempts=3)  # fmt: skip
    job = store.claim_next("w1", max_running=1, lease_s=30.0)
    staging = scratch_dir(job) / "bundle"
    staging.mkdir(parents=True)
    (staging / registry.MANIFEST).write_text(json.dumps({"name": NAME}))

    def pipeline(job: object, ctx: object, config: AdaptConfig) -> None:
        ctx.check()  # the last stop check before the publish passes
        assert store.cancel(job.id, actor="key-1")[1]  # acknowledged
        attempt = SimpleNamespace(job=job, ctx=ctx, config=config, promote=True)
        publish(attempt, Exported(staging), Verdict(Evaluation(), GateDecision(passed=True)))

    assert process_job(store, job, config, threading.Event(), pipeline) == "cancelled"
    assert registry.list_versions(tmp_path / "registry", NAME) == []
    assert "model" not in store.get(job.id).result
