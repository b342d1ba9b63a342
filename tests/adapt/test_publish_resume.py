"""A worker SIGKILLed after it promoted its job's model and before it recorded the end of the job, for real: worker
processes on a real PostgreSQL store and one registry folder. The job is taken back when the lease lapses and
retried; the retry must end the job with the version the registry already serves from it — recorded, audited, one
version — rather than train again and publish a second one, whose gate may decide otherwise while the first stays
served with no record of it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapt_jobs.jobs import SUCCEEDED
from adapt_jobs.store import JobStore
from core import registry
from tests.adapt.cluster import ROOT, wait_for

pytestmark = pytest.mark.slow  # worker processes that import the torch stack

LEASE_S = 2.0
NAME = "acme"


def _staged(base: Path, folder: str) -> Path:
    staging = base / folder
    staging.mkdir(parents=True)
    (staging / "model.onnx").write_bytes(os.urandom(4096))
    (staging / registry.MANIFEST).write_text(json.dumps({"name": NAME}))
    return staging


def _attempt(url: str, root: str, worker_id: str, *, die_after_promoting: bool) -> None:
    """One worker process running one attempt of the job through the worker's loop and `run_job`. Its training
    stands in as one stage that publishes a freshly trained bundle through the real publish stage, with the gate
    passing on the first attempt and failing on the second (a retrained model the gate judges otherwise). With
    ``die_after_promoting`` the process waits to be killed just after it promoted."""
    import threading
    from types import SimpleNamespace

    from adapt_jobs.jobs import JOB_KIND_ADAPT
    from adapt_jobs.results import Evaluation, GateDecision
    from adapt_jobs.settings import AdaptConfig, AdaptSettings
    from adapt_worker import pipeline
    from adapt_worker.attempt import Exported, Verdict
    from adapt_worker.release import publish
    from adapt_worker.worker import process_job

    base = Path(root)
    if die_after_promoting:
        promote = registry.promote

        def promote_then_wait(*args: object) -> bool:
            promoted = promote(*args)
            (base / "promoted").touch()
            time.sleep(600)
            return promoted

        registry.promote = promote_then_wait

    def opens(job, ctx, config):
        return SimpleNamespace(job=job, ctx=ctx, config=config, promote=True, spec=SimpleNamespace(name=NAME),
                               kind=JOB_KIND_ADAPT)  # fmt: skip

    def train_and_publish(attempt):
        gate = GateDecision(passed=attempt.job.attempt == 1, reasons=[] if attempt.job.attempt == 1 else ["worse"])
        staging = _staged(base / "scratch", f"attempt-{attempt.job.attempt}")
        return publish(attempt, Exported(staging), Verdict(Evaluation(in_domain={"base": 1.0, "adapted": 2.0}), gate))

    pipeline.PIPELINES[JOB_KIND_ADAPT] = pipeline.Pipeline(opens, (train_and_publish,))
    settings = AdaptSettings(dir=base / "adapt", lease_seconds=LEASE_S, store_url=url)
    config = AdaptConfig(registry_dir=base / "registry", cache_dir=base / "cache", settings=settings)
    store = JobStore(url)
    job = wait_for(lambda: store.claim_next(worker_id, max_running=1, lease_s=LEASE_S), 60, 0.1, "a job to claim")
    print(json.dumps(process_job(store, job, config, threading.Event(), pipeline.run_job)), flush=True)


def _worker(url: str, root: Path, worker_id: str, *, die_after_promoting: bool) -> subprocess.Popen[str]:
    code = (
        "from tests.adapt.test_publish_resume import _attempt; "
        f"_attempt({url!r}, {str(root)!r}, {worker_id!r}, die_after_promoting={die_after_promoting})"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def test_a_retry_ends_the_job_with_the_version_its_killed_attempt_promoted(tmp_path: Path, postgres) -> None:
    url = postgres.new_database()
    root = tmp_path / "registry"
    root.mkdir()
    store = JobStore(url)
    job = store.create({"base_model": "b", "name": NAME}, corpus_dir=tmp_path / "adapt" / "jobs" / "j",
                       n_documents=1, max_pending=5, max_attempts=2)  # fmt: skip
    first = _worker(url, tmp_path, "w1", die_after_promoting=True)
    try:
        wait_for(lambda: (tmp_path / "promoted").exists() or first.poll() is not None, 180, 0.02, "the promotion")
        assert first.poll() is None, "the first worker ended before it promoted"
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    assert registry.current_version(root, NAME) == "1"  # served: the killed attempt's model
    time.sleep(LEASE_S + 0.5)
    assert [e.job_id for e in store.rescue_expired()] == [job.id]
    second = _worker(url, tmp_path, "w2", die_after_promoting=False)
    out, _ = second.communicate(timeout=180)
    assert json.loads(out.strip().splitlines()[-1]) == SUCCEEDED
    done = store.get(job.id)
    assert done.state == SUCCEEDED and [a["outcome"] for a in done.attempts] == ["interrupted", SUCCEEDED]
    assert done.result["model"] == {"name": NAME, "version": "1", "promoted": True}
    assert done.result["gate"]["passed"] and done.result["evaluation"]["in_domain"] == {"base": 1.0, "adapted": 2.0}
    assert registry.list_versions(root, NAME) == ["1"] and registry.current_version(root, NAME) == "1"
    audits = [e.data for e in store.events(job.id) if e.type == "audit" and e.data["action"] == "promoted"]
    assert [(a["actor"], a["version"]) for a in audits] == [("w2", "1")]  # the served version has its record
