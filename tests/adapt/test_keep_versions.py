"""``adapt_keep_versions``: after a job publishes, its worker removes the name's versions older than the newest N
(never the served one), each named in a ``log`` event of the job; by default (0) every version stays."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from adapt_jobs.jobs import SUCCEEDED
from adapt_jobs.results import Evaluation, GateDecision
from adapt_jobs.settings import AdaptConfig
from adapt_worker.attempt import Exported, Verdict
from adapt_worker.context import JobContext
from adapt_worker.release import publish
from adapt_worker.worker import process_job
from core import registry
from tests.adapt.test_worker import _claimed
from tests.core.test_registry_manage import publish as publish_version


@pytest.mark.parametrize("keep", [0, 2])
def test_a_publish_keeps_the_newest_versions_of_its_name(tmp_path: Path, keep: int) -> None:
    store, job, config = _claimed(tmp_path, keep_versions=keep)
    root = config.registry_dir
    root.mkdir()
    for _ in range(3):  # versions 1-3, published an hour ago; version 1 served (rolled back to)
        publish_version(root, "n", age_s=3600)
    registry.make_current(root, "n", "1")
    staging = tmp_path / "bundle"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(b"w" * 4096)
    (staging / registry.MANIFEST).write_text(json.dumps({"name": "n"}))

    def pipeline(job: object, ctx: JobContext, config: AdaptConfig) -> None:
        attempt = SimpleNamespace(job=job, ctx=ctx, config=config, promote=False)
        publish(attempt, Exported(staging), Verdict(Evaluation(), GateDecision(passed=True)))

    assert process_job(store, job, config, threading.Event(), pipeline) == SUCCEEDED
    logs = [e.data["message"] for e in store.events(job.id) if e.type == "log"]
    if keep == 0:
        assert registry.list_versions(root, "n") == ["1", "2", "3", "4"] and logs == []
    else:
        assert registry.list_versions(root, "n") == ["1", "3", "4"]  # the served one, and the newest two
        assert logs == ["removed version 2 of n: keep_versions keeps the newest 2 and the served one"]
    assert registry.current_version(root, "n") == "1"
