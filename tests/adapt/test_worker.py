"""The worker around a pipeline: terminal states, cancel, drain (hand back), a lost lease, the heartbeat, a store
outage, cleanup, and what a job record says about an unexpected failure; the split and gate rules."""

from __future__ import annotations

import errno
import threading
import time
from pathlib import Path

import pytest

from adapt_jobs.corpus import Corpus
from adapt_jobs.jobs import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, LeaseLost
from adapt_jobs.results import JobResult, Published
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from adapt_jobs.store import JobStore
from adapt_worker.attempt import split_corpus
from adapt_worker.context import JobContext, JobFailed, scratch_dir
from adapt_worker.scoring import general_tasks
from adapt_worker.stages import stage_failure
from adapt_worker.worker import ABANDONED, process_job

DOC = "First sentence here. Second sentence there."


def _config(tmp_path: Path, **settings: object) -> AdaptConfig:
    values = {"dir": tmp_path / "adapt", "lease_seconds": 30.0, **settings}
    settings = AdaptSettings(**values)
    return AdaptConfig(registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache", settings=settings)


def _claimed(tmp_path: Path, **settings: object) -> tuple[JobStore, Job, AdaptConfig]:
    config = _config(tmp_path, **settings)
    store = JobStore(config.store_url, keep_uploads=config.settings.keep_uploads)
    folder = config.jobs_dir / "j"
    Corpus([DOC] * 4, None, 4).save(folder)
    store.create({"base_model": "b", "name": "n"}, corpus_dir=folder, n_documents=4, max_pending=5, max_attempts=2)
    job = store.claim_next("w", max_running=1, lease_s=config.settings.lease_seconds)
    assert job is not None
    scratch_dir(job).mkdir()
    return store, job, config


def test_success_records_progress_and_deletes_the_upload(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path)

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        ctx.stage("training", step=0, total=2)
        ctx.progress({"step": 1, "loss": 2.0}, force=True)
        ctx.progress({"step": 2, "loss": 1.0})  # throttled: within PROGRESS_EVERY_S of the last
        ctx.result(JobResult(model=Published(name="n", version="1", promoted=True)), event="published")

    assert process_job(store, job, config, threading.Event(), pipeline) == SUCCEEDED
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.progress["step"] == 1 and done.progress["stage"] == "training"
    assert not Path(job.corpus_dir).exists()


def test_keep_uploads_keeps_the_corpus_but_not_the_scratch(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path, keep_uploads=True)
    process_job(store, job, config, threading.Event(), lambda *a: None)
    assert (Path(job.corpus_dir) / "corpus.jsonl").is_file() and not scratch_dir(job).exists()


def test_failure_reason_and_unexpected_errors_say_what_happened_not_the_internals(tmp_path: Path, caplog) -> None:
    store, job, config = _claimed(tmp_path)

    def bad_corpus(*_: object) -> None:
        raise JobFailed("corpus", "only 3 documents yield two crops")

    assert process_job(store, job, config, threading.Event(), bad_corpus) == FAILED
    assert store.get(job.id).error == {"reason": "corpus", "message": "only 3 documents yield two crops"}

    store2, job2, config2 = _claimed(tmp_path / "b")

    def crash(*_: object) -> None:
        raise KeyError("secret_internal_key")

    process_job(store2, job2, config2, threading.Event(), crash)
    error = store2.get(job2.id).error
    assert error["reason"] == "internal" and job2.id in error["message"] and "log" in error["message"]
    assert "KeyError" not in error["message"] and "secret_internal_key" not in error["message"]
    assert "secret_internal_key" in caplog.text  # the traceback is in the log, for the operator


def test_stage_failures_name_a_full_or_read_only_volume_and_hide_other_internals() -> None:
    full = stage_failure("export", OSError(errno.ENOSPC, "No space left on device"), "the scratch volume")
    assert (full.reason, str(full)) == ("export", "export failed: no space left on the scratch volume")
    read_only = stage_failure("publish", OSError(errno.EROFS, "Read-only file system"), "the registry volume")
    assert str(read_only) == "publish failed: the registry volume is read-only"
    other = stage_failure("evaluation", ValueError("tensor shape (3, 4) mismatch"), "the cache volume")
    assert "shape" not in str(other) and "ValueError" not in str(other) and "log" in str(other)


def test_cancel_request_is_seen_by_should_stop_and_ends_cancelled(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path)
    seen = []

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        seen.append(ctx.should_stop())
        store.request_cancel(job.id)
        ctx.check()  # stage boundary: re-reads the flag at once

    assert process_job(store, job, config, threading.Event(), pipeline) == CANCELLED
    assert seen == [False] and store.get(job.id).state == CANCELLED


def test_a_stopping_worker_hands_its_job_back_with_its_corpus(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path)
    stop = threading.Event()

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        stop.set()  # SIGTERM arrived
        assert ctx.should_stop()
        ctx.check()

    assert process_job(store, job, config, stop, pipeline) == QUEUED
    back = store.get(job.id)
    assert back.state == QUEUED and back.error is None and back.attempts[-1]["outcome"] == "handed_back"
    assert (Path(job.corpus_dir) / "corpus.jsonl").is_file()  # the next attempt needs it
    assert not scratch_dir(job).exists()


def test_a_worker_that_lost_its_lease_writes_nothing_and_keeps_the_corpus(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path, lease_seconds=2.0)

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        store.hand_back(ctx.lease, "taken by a test")  # stands for: the lease lapsed and a rescuer took the job
        store.claim_next("w2", max_running=1, lease_s=30)
        ctx.result(JobResult(model=Published(name="n", version="9", promoted=True)))

    assert process_job(store, job, config, threading.Event(), pipeline) == ABANDONED
    now = store.get(job.id)
    assert now.state == RUNNING and now.worker_id == "w2" and "model" not in now.result
    assert (Path(job.corpus_dir) / "corpus.jsonl").is_file()  # the new holder's


def test_the_heartbeat_renews_the_lease_while_a_stage_reports_nothing(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path, lease_seconds=2.0)

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        first = store.get(job.id).lease_expires_at
        time.sleep(2.5)  # longer than the lease, silent like an export
        assert store.rescue_expired() == []
        assert store.get(job.id).lease_expires_at > first + 1.0

    assert process_job(store, job, config, threading.Event(), pipeline) == SUCCEEDED


def test_lost_lease_stops_the_job_at_its_next_check(tmp_path: Path) -> None:
    store, job, config = _claimed(tmp_path, lease_seconds=2.0)

    def pipeline(job: Job, ctx: JobContext, config: AdaptConfig) -> None:
        store.hand_back(ctx.lease, "taken")
        deadline = time.monotonic() + 5
        while not ctx.should_stop() and time.monotonic() < deadline:  # the heartbeat notices
            time.sleep(0.05)
        with pytest.raises(LeaseLost):
            ctx.check()
        raise LeaseLost("stopping")

    assert process_job(store, job, config, threading.Event(), pipeline) == ABANDONED


def test_split_is_seeded_disjoint_and_holds_out_only_croppable_documents() -> None:
    texts = [f"Doc {i} first part. Doc {i} second part." if i % 3 else f"single {i}" for i in range(60)]
    a = split_corpus(texts, seed=1, fraction=0.25, min_held_out=4, max_held_out=100)
    b = split_corpus(texts, seed=1, fraction=0.25, min_held_out=4, max_held_out=100)
    c = split_corpus(texts, seed=2, fraction=0.25, min_held_out=4, max_held_out=100)
    assert a == b and a.held_out != c.held_out
    assert len(a.held_out) == 10  # 25 % of the 40 croppable documents
    assert all("second part" in t for t in a.held_out)
    assert not set(a.held_out) & set(a.train) and len(a.train) + len(a.held_out) == 60
    assert len(split_corpus(texts, seed=0, fraction=0.9, max_held_out=7).held_out) == 7
    with pytest.raises(JobFailed, match="only 3 documents yield two crops: need at least 16"):
        split_corpus(texts[:5], seed=0, min_held_out=8)


def test_a_document_the_corpus_repeats_is_never_both_trained_on_and_evaluated() -> None:
    """Customers' corpora repeat documents (boilerplate pages, FAQ entries): a held-out copy of a trained text would
    be scored as unseen, and the gate would reward memorising it."""
    texts = [f"Doc {i} first part. Doc {i} second part." for i in range(60)]
    plain = split_corpus(texts, seed=1, fraction=0.25, min_held_out=4, max_held_out=100)
    repeated = [*texts, plain.held_out[0], plain.held_out[1]]  # two held documents, repeated at the end
    split = split_corpus(repeated, seed=1, fraction=0.25, min_held_out=4, max_held_out=100)
    assert not set(split.held_out) & set(split.train)
    assert len(set(split.held_out)) == len(split.held_out) and len(split.held_out) >= 4
    with pytest.raises(JobFailed, match=r"only [0-3] documents could be held out for evaluation, 4 needed"):
        split_corpus([texts[0]] * 60 + texts[1:4], seed=1, fraction=0.25, min_held_out=4, max_held_out=100)


def test_general_tasks_leave_out_those_the_base_model_was_trained_on() -> None:
    tasks = ("LeeDocSTS", "BBCNewsKNN", "PyDocSummaryRetrieval")
    assert general_tasks(tasks, []) == {"out_of_domain": list(tasks), "in_domain": []}
    # a base trained on Lee background news is in-domain on Lee's tasks, not on BBC's (another collection)
    assert general_tasks(tasks, ["lee_background", "adapt:earlier"]) == {
        "out_of_domain": ["BBCNewsKNN", "PyDocSummaryRetrieval"],
        "in_domain": ["LeeDocSTS"],
    }


def _environ_once_exec_done(pid: int, timeout: float = 10.0) -> bytes:
    """``/proc/<pid>/environ`` of a process just started: ``Popen`` returns as the kernel closes the exec pipe, which
    can be before the new program's memory is in place, and the file reads empty until it is."""
    deadline = time.monotonic() + timeout
    while not (raw := Path(f"/proc/{pid}/environ").read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return raw


def test_a_supervised_worker_gets_no_api_key_nor_any_other_secret(tmp_path: Path, monkeypatch) -> None:
    """A real worker started by the service's supervisor: its environment (/proc/<pid>/environ, what the kernel gave
    the process) holds the allow-listed variables and none of the service's keys."""
    import asyncio

    from service.adapt.supervisor import WorkerSupervisor

    secrets = {
        "EMBED_API_KEYS": "client-key-1",
        "EMBED_ADMIN_API_KEYS": "admin-key-1",
        "EMBED_ADAPT_STORE_URL": "postgresql://u:store-password@db/e",
        "CLOUD_TOKEN": "cloud-token-1",
    }
    config = _config(tmp_path)  # before the variables: the service's settings were read when it started
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    supervisor = WorkerSupervisor(config, JobStore(config.store_url))
    worker = supervisor.spawn(0)
    try:
        raw = _environ_once_exec_done(worker.process.pid)
        assert worker.process.poll() is None, "the worker must be running, not have failed at start"
    finally:
        asyncio.run(supervisor.stop(grace_s=30))
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if item)
    for value in secrets.values():
        assert value.encode() not in raw, f"{value} reached the worker's environment"
    assert env[b"EMBED_CACHE_DIR"] == str(config.cache_dir).encode()
    assert env[b"HF_HUB_OFFLINE"] == b"1" and env[b"OMP_NUM_THREADS"] == b"1" and b"PATH" in env
    tool_settings = {b"EMBED_CACHE_DIR", b"EMBED_REGISTRY_DIR", b"EMBED_DEVICE", b"EMBED_NUM_THREADS"}
    assert {name for name in env if name.startswith(b"EMBED_")} <= tool_settings


def test_the_worker_starts_polling_before_the_torch_stack_is_imported() -> None:
    """The job pipeline imports torch, transformers and mteb (seconds on 2 cores): the worker loads it while idle,
    so it claims at once and ``embedder adapt-worker --help`` answers without it."""
    import subprocess
    import sys

    code = """
import sys
import adapt_worker.worker
heavy = sorted(m for m in ("torch", "transformers", "mteb", "adapt_worker.pipeline") if m in sys.modules)
print("HEAVY", heavy)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in result.stdout, result.stdout + result.stderr


def test_a_job_claimed_while_the_stack_preloads_waits_for_it_instead_of_importing_beside_it() -> None:
    """A job claimed while the idle preload is importing mteb once failed as an internal error: two threads importing
    the same modules at once each met one the other had half initialised. The job's import waits for the preload."""
    import subprocess
    import sys

    code = """
import logging, sys, threading, time
import adapt_worker.worker as worker
logging.basicConfig(level=logging.ERROR)
preload = threading.Thread(target=worker._preload, daemon=True)
preload.start()
while "mteb" not in sys.modules and preload.is_alive():  # the preload is half-way through mteb
    time.sleep(0.001)
run_job = worker._run_job()
preload.join()
print("PIPELINE", run_job.__module__)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "PIPELINE adapt_worker.pipeline" in result.stdout, result.stdout + result.stderr
    assert "could not preload" not in result.stderr, result.stderr
