"""The worker loop around a pipeline: terminal states, cancel/stop handling, cleanup; split and gate rules."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from adapt.context import JobCancelled, JobContext, JobFailed
from adapt.corpus import Corpus
from adapt.pipeline import WorkerOptions, general_tasks, split_corpus
from adapt.store import CANCELLED, FAILED, INTERRUPTED, SUCCEEDED, Job, JobStore
from adapt.worker import process_job

DOC = "First sentence here. Second sentence there."


def _claimed(tmp_path: Path) -> tuple[JobStore, Job]:
    store = JobStore(tmp_path / "jobs.sqlite3")
    folder = tmp_path / "jobs" / "j"
    Corpus([DOC] * 4, None, 4).save(folder)
    (folder / "work").mkdir()
    store.create({"base_model": "b", "name": "n"}, corpus_dir=folder, n_documents=4, max_pending=5)
    job = store.claim_next("w", max_running=1)
    assert job is not None
    return store, job


def _options(tmp_path: Path, **kw) -> WorkerOptions:
    return WorkerOptions(registry_dir=tmp_path / "registry", **kw)


def test_success_records_progress_and_deletes_the_upload(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)

    def pipeline(job: Job, ctx: JobContext, options: WorkerOptions) -> None:
        ctx.stage("training", step=0, total=2)
        ctx.progress({"step": 1, "loss": 2.0}, force=True)
        ctx.progress({"step": 2, "loss": 1.0})  # throttled: within PROGRESS_EVERY_S of the last
        ctx.result({"model": {"name": "n", "version": "1", "promoted": True}}, event="published")

    assert process_job(store, job, _options(tmp_path), threading.Event(), pipeline) == SUCCEEDED
    done = store.get(job.id)
    assert done.state == SUCCEEDED and done.progress["step"] == 1 and done.progress["stage"] == "training"
    assert not Path(job.corpus_dir).exists()


def test_keep_uploads_keeps_the_corpus_but_not_the_scratch(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)
    process_job(store, job, _options(tmp_path, keep_uploads=True), threading.Event(), lambda *a: None)
    assert (Path(job.corpus_dir) / "corpus.jsonl").is_file() and not (Path(job.corpus_dir) / "work").exists()


def test_failure_reason_and_unexpected_errors(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)

    def bad_corpus(*_: object) -> None:
        raise JobFailed("corpus", "only 3 documents yield two crops")

    assert process_job(store, job, _options(tmp_path), threading.Event(), bad_corpus) == FAILED
    assert store.get(job.id).error == {"reason": "corpus", "message": "only 3 documents yield two crops"}

    store2, job2 = _claimed(tmp_path / "b")

    def crash(*_: object) -> None:
        raise KeyError("oops")

    process_job(store2, job2, _options(tmp_path), threading.Event(), crash)
    error = store2.get(job2.id).error
    assert error["reason"] == "internal" and "KeyError" in error["message"]


def test_cancel_request_is_seen_by_should_stop_and_ends_cancelled(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)
    seen = []

    def pipeline(job: Job, ctx: JobContext, options: WorkerOptions) -> None:
        seen.append(ctx.should_stop())
        store.request_cancel(job.id)
        ctx.check()  # stage boundary: re-reads the flag at once

    assert process_job(store, job, _options(tmp_path), threading.Event(), pipeline) == CANCELLED
    assert seen == [False] and store.get(job.id).state == CANCELLED


def test_worker_stop_ends_the_job_interrupted(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)
    stop = threading.Event()

    def pipeline(job: Job, ctx: JobContext, options: WorkerOptions) -> None:
        stop.set()  # SIGTERM arrived
        if ctx.should_stop():
            raise JobCancelled("stopped")

    assert process_job(store, job, _options(tmp_path), stop, pipeline) == FAILED
    assert store.get(job.id).error["reason"] == INTERRUPTED


def test_a_job_already_failed_by_the_supervisor_keeps_that_verdict(tmp_path: Path) -> None:
    store, job = _claimed(tmp_path)

    def pipeline(job: Job, ctx: JobContext, options: WorkerOptions) -> None:
        store.fail_active(worker_id="w", message="worker considered dead")

    process_job(store, job, _options(tmp_path), threading.Event(), pipeline)
    assert store.get(job.id).error == {"reason": INTERRUPTED, "message": "worker considered dead"}


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


def test_general_tasks_leave_out_those_the_base_model_was_trained_on() -> None:
    tasks = ("LeeDocSTS", "BBCNewsKNN", "PyDocSummaryRetrieval")
    assert general_tasks(tasks, []) == {"out_of_domain": list(tasks), "in_domain": []}
    # a base trained on Lee background news is in-domain on Lee's tasks, not on BBC's (another collection)
    assert general_tasks(tasks, ["lee_background", "adapt:earlier"]) == {
        "out_of_domain": ["BBCNewsKNN", "PyDocSummaryRetrieval"],
        "in_domain": ["LeeDocSTS"],
    }
