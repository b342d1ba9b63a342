"""A job's corpus is on disk before the job is queued: the store that queues it outlives a power loss, and a worker
that then found an empty or cut-short corpus.jsonl would fail the job, or train and judge it on part of the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapt_jobs.corpus import CORPUS_FILE, Corpus, read_job_corpus
from tests.disk_events import position, record_disk_events


def test_a_saved_corpus_is_whole_on_disk_when_save_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = tmp_path / "jobs"
    folder = jobs / "job-1"
    texts = [f"Document {i}. It has two sentences." for i in range(50)]
    events = record_disk_events(monkeypatch)

    path = Corpus(texts=texts, labels=None, usable=len(texts)).save(folder)

    assert path == folder / CORPUS_FILE
    written = position(events, ("rename", str(path)))  # written aside, renamed in whole
    assert events[written - 1][0] == "fsync" and events[written - 1][1].startswith(str(folder / f".{CORPUS_FILE}."))
    assert ("fsync", str(folder)) in events[written:]
    assert ("fsync", str(jobs)) in events[written:]
    assert read_job_corpus(folder) == (texts, None)
