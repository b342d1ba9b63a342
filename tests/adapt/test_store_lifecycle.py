"""The store owns a job's life, on both backends (SQLite file, real PostgreSQL): every transition that ends a job —
whoever makes it — frees its folder (unless ``keep_uploads``), including the jobs failed because the job they waited
for did not succeed; a job back in the queue keeps its corpus; a pruned job's folder goes whatever ``keep_uploads``
says."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from adapt_jobs.corpus import CORPUS_FILE
from adapt_jobs.jobs import CANCELLED, CORPUS_REMOVED_EVENT, FAILED, JOB_KIND_STUDENT_BUILD, QUEUED, SUCCEEDED, Job
from adapt_jobs.store import JobStore

LEASE = 30.0


class Jobs:
    """Jobs with a corpus on disk, like POST /adapt queues them."""

    def __init__(self, store: JobStore, root: Path) -> None:
        self.store, self.root = store, root

    def queue(self, name: str, *, max_attempts: int = 2, **kwargs: object) -> Job:
        folder = self.root / name
        folder.mkdir(parents=True)
        (folder / CORPUS_FILE).write_text('{"text": "a document"}\n')
        return self.store.create({"base_model": "b", "name": name}, corpus_dir=folder, n_documents=1,
                                 max_pending=100, max_attempts=max_attempts, **kwargs)  # fmt: skip

    def claim(self, job: Job, *, lease_s: float = LEASE) -> Job:
        claimed = self.store.claim_next(f"w-{job.id}", max_running=100, lease_s=lease_s)
        assert claimed is not None and claimed.id == job.id
        return claimed


def _kept(job: Job) -> bool:
    return (Path(job.corpus_dir) / CORPUS_FILE).is_file()


@pytest.mark.parametrize("keep_uploads", [False, True])
def test_every_end_frees_the_corpus_and_a_return_to_the_queue_keeps_it(
    store_url: str, tmp_path: Path, keep_uploads: bool
) -> None:
    store = JobStore(store_url, keep_uploads=keep_uploads)
    jobs = Jobs(store, tmp_path / "jobs")
    ended: list[Job] = []
    for state in (SUCCEEDED, FAILED, CANCELLED):  # by its worker
        job = jobs.queue(f"finished-{state}")
        store.finish(jobs.claim(job).lease, state, reason="training" if state == FAILED else None)
        ended.append(job)
    job = jobs.queue("cancelled-queued")  # by the API
    assert store.request_cancel(job.id).state == CANCELLED
    ended.append(job)
    job = jobs.queue("cancelled-then-handed-back")  # by a worker that stops
    claimed = jobs.claim(job)
    store.request_cancel(job.id)
    assert store.hand_back(claimed.lease, "draining") == CANCELLED
    ended.append(job)
    job = jobs.queue("spent-by-a-dead-worker", max_attempts=1)  # by its supervisor
    store.release_worker(jobs.claim(job).worker_id, "its worker exited with code 9")
    ended.append(job)
    build = jobs.queue("base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)  # by the API, with the job waiting for it
    waiting = jobs.queue("waiting", after_job=build.id)
    store.request_cancel(build.id)
    ended += [build, waiting]
    lapsed = jobs.queue("lapsed", max_attempts=1)  # by a rescuer
    jobs.claim(lapsed, lease_s=0.05)
    retried = jobs.queue("retried")  # back to the queue: the next attempt reads the corpus
    jobs.claim(retried, lease_s=0.05)
    handed_back = jobs.queue("handed-back")
    assert store.hand_back(jobs.claim(handed_back).lease, "draining") == QUEUED
    time.sleep(0.2)
    assert {(e.job_id, e.state) for e in store.rescue_expired()} == {(lapsed.id, FAILED), (retried.id, QUEUED)}
    ended.append(lapsed)

    for job in ended:
        assert store.get(job.id).terminal
        assert _kept(job) == keep_uploads, f"{job.params['name']} ended {store.get(job.id).state}"
    for job in (retried, handed_back):
        assert store.get(job.id).state == QUEUED and _kept(job)
    dependant = store.get(waiting.id)
    assert dependant.state == FAILED and dependant.error["reason"] == "dependency"
    removed = [e for e in store.events(waiting.id) if e.type == CORPUS_REMOVED_EVENT]
    assert len(removed) == (0 if keep_uploads else 1)

    pruned = store.prune("replica", older_than_s=-60, lease_s=LEASE)  # every ended job is past a retention < 0
    assert pruned is not None and {p.job_id for p in pruned} == {job.id for job in ended}
    assert not any(Path(job.corpus_dir).exists() for job in ended)  # pruned: gone, kept uploads too
    assert _kept(retried) and _kept(handed_back)


def test_a_cancelled_build_fails_the_jobs_waiting_for_it_in_the_same_transition(store_url: str, tmp_path: Path) -> None:
    store = JobStore(store_url)
    jobs = Jobs(store, tmp_path / "jobs")
    build = jobs.queue("base--sct-tiny", kind=JOB_KIND_STUDENT_BUILD)
    waiting = [jobs.queue(f"waiting-{i}", after_job=build.id) for i in range(2)]
    other = jobs.queue("other")
    claimed = jobs.claim(build)
    store.request_cancel(build.id)
    store.finish(claimed.lease, CANCELLED)  # the worker saw the request

    for job in waiting:
        failed = store.get(job.id)
        assert failed.state == FAILED and not _kept(job)
        assert failed.error["message"].startswith(f"job {build.id}, which this job waited for, ended cancelled")
    assert store.get(other.id).state == QUEUED and _kept(other)
    assert store.fail_dependants() == []
