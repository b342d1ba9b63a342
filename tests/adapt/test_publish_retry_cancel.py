"""A cancel that reaches a job once an attempt of it began publishing — the point of no return — is refused, whichever
attempt runs now: a job whose attempt published (and maybe promoted) its model and was then interrupted is retried,
and the retry ends the job with that version. A cancel acknowledged between the retry's claim and its publish check
would end the job ``cancelled`` while the earlier attempt's version stays published, maybe served: the job's record
would lie about what the registry holds from it."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapt_jobs.jobs import JOB_KIND_ADAPT, QUEUED, RUNNING, SUCCEEDED
from adapt_jobs.results import Evaluation, GateDecision
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from core import registry

pytestmark = pytest.mark.slow  # the worker's pipeline imports the torch stack

NAME = "acme"


def _published_then_interrupted(store: JobStore, config: AdaptConfig, tmp_path: Path) -> str:
    """A job whose first attempt published and promoted its model through the real publish stage, then died before
    it ended the job: taken back and queued again. Returns the job's id."""
    from adapt_worker.attempt import Exported, Verdict
    from adapt_worker.context import JobContext
    from adapt_worker.release import publish

    store.create({"base_model": "b", "name": NAME}, corpus_dir=tmp_path / "adapt" / "jobs" / "j", n_documents=1,
                 max_pending=5, max_attempts=3)  # fmt: skip
    job = store.claim_next("w1", max_running=1, lease_s=30.0)
    assert job is not None and job.attempt == 1
    ctx = JobContext(store, job, threading.Event(), lease_s=30.0)
    staging = tmp_path / "scratch" / "bundle"
    staging.mkdir(parents=True)
    (staging / registry.MANIFEST).write_text(json.dumps({"name": NAME}))
    attempt = SimpleNamespace(job=job, ctx=ctx, config=config, promote=True)
    verdict = Verdict(Evaluation(in_domain={"base": 1.0, "adapted": 2.0}), GateDecision(passed=True))
    publish(attempt, Exported(staging), verdict)
    assert registry.current_version(config.registry_dir, NAME) == "1"  # served
    store.release_worker("w1", "its process died before it ended the job")  # as the replica that saw it exit does
    assert store.get(job.id).state == QUEUED
    return job.id


def _refused(store: JobStore, job_id: str, state: str) -> None:
    """A cancel answered as past the point of no return: not acknowledged, nothing recorded, the job going on."""
    answered, asked = store.cancel(job_id, actor="key-1")
    assert not asked and not answered.cancel_requested and answered.state == state
    types = [(e.type, e.data.get("action")) for e in store.events(job_id)]
    assert ("audit", "cancelled") not in types and ("cancel_requested", None) not in types


@pytest.fixture
def config(tmp_path: Path, store_url: str) -> AdaptConfig:
    (tmp_path / "registry").mkdir()
    settings = AdaptSettings(dir=tmp_path / "adapt", store_url=store_url)
    return AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)


def test_a_retry_cancelled_before_its_publish_check_still_ends_with_the_published_version(
    config: AdaptConfig, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adapt_worker import pipeline
    from adapt_worker.worker import process_job

    store = JobStore(store_url)
    job_id = _published_then_interrupted(store, config, tmp_path)
    _refused(store, job_id, QUEUED)  # waiting for its retry
    retry = store.claim_next("w2", max_running=1, lease_s=30.0)
    assert retry is not None and retry.attempt == 2

    def opens(job, ctx, config):  # the retry's attempt opened; its publish check is still to come
        _refused(store, job.id, RUNNING)
        return SimpleNamespace(job=job, ctx=ctx, config=config, promote=True, spec=SimpleNamespace(name=NAME),
                               kind=JOB_KIND_ADAPT)  # fmt: skip

    def train(attempt):
        raise AssertionError("the retry of a job whose model was published trains nothing")

    monkeypatch.setitem(pipeline.PIPELINES, JOB_KIND_ADAPT, pipeline.Pipeline(opens, (train,)))
    assert process_job(store, retry, config, threading.Event(), pipeline.run_job) == SUCCEEDED
    done = store.get(job_id)
    assert done.state == SUCCEEDED and not done.cancel_requested
    assert done.result["model"] == {"name": NAME, "version": "1", "promoted": True}
    assert registry.list_versions(config.registry_dir, NAME) == ["1"]
    assert registry.current_version(config.registry_dir, NAME) == "1"
    _refused(store, job_id, SUCCEEDED)


def test_a_retry_whose_earlier_attempt_left_nothing_in_the_registry_can_be_cancelled_again(
    config: AdaptConfig, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt that began publishing and died before its copy reached the registry published nothing: once the
    retry has looked and found no version of the job, the job is not past its point of no return, and a cancel stops
    the retry's training as any other."""
    from adapt_worker import pipeline
    from adapt_worker.context import JobContext
    from adapt_worker.worker import process_job

    store = JobStore(store_url)
    job = store.create({"base_model": "b", "name": NAME}, corpus_dir=tmp_path / "adapt" / "jobs" / "j", n_documents=1,
                       max_pending=5, max_attempts=3)  # fmt: skip
    first = store.claim_next("w1", max_running=1, lease_s=30.0)
    JobContext(store, first, threading.Event(), lease_s=30.0).begin_publish()  # and died in the copy
    store.release_worker("w1", "its process died while it copied the bundle")
    _refused(store, job.id, QUEUED)  # nobody knows yet whether the copy got there
    retry = store.claim_next("w2", max_running=1, lease_s=30.0)
    stages: list[str] = []

    def opens(job, ctx, config):
        _refused(store, job.id, RUNNING)
        return SimpleNamespace(job=job, ctx=ctx, config=config, promote=True, spec=SimpleNamespace(name=NAME),
                               kind=JOB_KIND_ADAPT)  # fmt: skip

    def train(attempt):  # nothing of the job in the registry: it trains again, and may be cancelled meanwhile
        stages.append("train")
        assert store.cancel(attempt.job.id, actor="key-1")[1]
        attempt.ctx.check()

    monkeypatch.setitem(pipeline.PIPELINES, JOB_KIND_ADAPT, pipeline.Pipeline(opens, (train,)))
    assert process_job(store, retry, config, threading.Event(), pipeline.run_job) == "cancelled"
    assert stages == ["train"] and registry.list_versions(config.registry_dir, NAME) == []
    audits = [e.data["action"] for e in store.events(job.id) if e.type == "audit"]
    assert audits.count("cancelled") == 1
