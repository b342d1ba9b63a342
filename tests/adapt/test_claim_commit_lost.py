"""A worker's connection to PostgreSQL lost while its claim commits, for real: the worker process reaches a real
PostgreSQL through a TCP relay that passes every byte both ways, except that the first COMMIT of a transaction that
changed a job is delivered to the server and its answer never comes back — the connection breaks there, as it does
when a network path or a proxy fails at that moment. The server committed the claim; the worker cannot know it.

The job must still run on this attempt (the worker finds what it holds), not sit claimed by an idle worker until its
lease lapses, costing an attempt — or, with one attempt allowed or a ``--once`` worker that exits, failing
``interrupted`` without ever having run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from adapt_jobs.jobs import SUCCEEDED
from adapt_jobs.store import JobStore
from tests.adapt.cluster import ROOT

pytestmark = pytest.mark.slow  # worker processes that import the torch stack

LEASE_S = 30.0  # longer than the test: only the worker's own recovery can run the job


class CommitCutter:
    """A TCP relay to PostgreSQL that breaks the client's connection once, right after it forwarded the COMMIT of a
    transaction that updated ``adapt_jobs`` (the server gets the COMMIT; its answer is dropped)."""

    def __init__(self, port: int) -> None:
        self.upstream = ("127.0.0.1", port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        changed = False
        try:
            while data := src.recv(65536):
                if from_client and b"UPDATE adapt_jobs" in data:
                    changed = True
                if from_client and b"COMMIT\x00" in data:
                    if changed and not self.cut.is_set():
                        dst.sendall(data)  # the server commits ...
                        self.cut.set()
                        src.shutdown(socket.SHUT_RDWR)  # ... and the client never hears it
                        return
                    changed = False
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.server.close()


def _run_worker(url: str, root: str) -> None:
    """`embedder adapt-worker --once` with a pipeline that only records that the job ran."""
    import threading

    from adapt_jobs.settings import AdaptConfig, AdaptSettings
    from adapt_worker.worker import Worker

    base = Path(root)
    settings = AdaptSettings(dir=base / "adapt", lease_seconds=LEASE_S, poll_seconds=0.1, store_url=url)
    config = AdaptConfig(registry_dir=base / "registry", cache_dir=base / "cache", settings=settings)
    ran = []
    Worker(config, "w1", threading.Event(), pipeline=lambda job, ctx, config: ran.append(job.id)).run(once=True)
    print(json.dumps(ran), flush=True)


def test_a_claim_whose_commit_answer_was_lost_runs_on_that_attempt(tmp_path: Path, postgres) -> None:
    url = postgres.new_database()
    store = JobStore(url)
    job = store.create({"base_model": "b", "name": "acme"}, corpus_dir=tmp_path / "adapt" / "jobs" / "j",
                       n_documents=1, max_pending=5, max_attempts=1)  # fmt: skip
    cutter = CommitCutter(postgres.port)
    relayed = url.replace(f":{postgres.port}/", f":{cutter.port}/")
    code = f"from tests.adapt.test_claim_commit_lost import _run_worker as run; run({relayed!r}, {str(tmp_path)!r})"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    finally:
        cutter.close()
    assert cutter.cut.is_set(), "the relay never cut a commit"
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [job.id], done.stderr[-3000:]
    ended = store.get(job.id)
    assert ended.state == SUCCEEDED and [a["outcome"] for a in ended.attempts] == [SUCCEEDED]
