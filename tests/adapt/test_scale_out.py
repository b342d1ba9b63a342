"""What the chart runs, on one machine: two `embedder serve` replicas and adapt workers sharing one registry, one
adapt folder and one job store; four jobs submitted across both replicas; one worker SIGKILLed mid-training and one
replica restarted mid-job. Every job must end ``succeeded`` (the killed one on a second attempt), none stuck, none
failed by another process starting or stopping, both replicas answering the same for every job and serving every
published model.

* **PostgreSQL** (scaled out): the replicas do not train (``adapt_supervise_worker=false``); two `embedder
  adapt-worker` processes are the worker workload, and the killed one is replaced, as Kubernetes replaces a pod.
* **SQLite** (the default, one machine): each replica supervises its own workers, as the chart's default does.

Each run prints its figures (attempts, the time from the SIGKILL until the job's retry started, the whole run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.adapt.cluster import ACTIVE, Replica, Worker, cluster_env, pid_of_worker, wait_for

pytestmark = pytest.mark.slow


def run_scenario(root: Path, base_registry: Path, base_model: Path, corpus: list[str], store_url: str | None,
                 supervise: bool) -> dict:  # fmt: skip
    shutil.copytree(base_registry, root / "registry", symlinks=True)
    env = cluster_env(root, store_url, base_model, adapt_supervise_worker=supervise, adapt_max_concurrent_jobs=2)
    logs = root / "logs"
    started = time.monotonic()
    a, b = Replica("replica-a", env, logs), Replica("replica-b", env, logs)
    workers = [] if supervise else [Worker(f"worker-{n}", env, logs) for n in (1, 2)]
    processes = [a, b, *workers]
    try:
        a.wait_ready()
        b.wait_ready()
        ids = [r.submit(corpus, name=f"tenant-{n}", max_steps=40, seed=n % 2)["id"]
               for n, r in enumerate((a, b, a, b))]  # fmt: skip

        def training() -> dict | None:
            jobs = [a.job(i) for i in ids]
            return next((j for j in jobs if j["state"] == "running" and (j["progress"].get("step") or 0) >= 1), None)

        victim_job = wait_for(training, what="a job training")
        victim_worker = victim_job["attempts"][-1]["worker_id"]
        pid = pid_of_worker(victim_worker)
        assert pid is not None, f"no process for worker {victim_worker}"
        os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        if not supervise:  # Kubernetes starts a new pod for the dead one
            workers.append(Worker("worker-3", env, logs))
            processes.append(workers[-1])

        # a replica restarts mid-job (a rolling update): graceful stop, new process
        assert any(a.job(i)["state"] in ("running", "evaluating") for i in ids)
        b.restart()

        def all_done() -> list[dict] | None:
            jobs = [b.job(i) for i in ids]
            return jobs if all(j["state"] not in ACTIVE for j in jobs) else None

        finals = wait_for(all_done, timeout_s=420, every_s=0.5, what="every job ended")
        for job in finals:
            assert job["state"] == "succeeded", json.dumps(job, indent=1)
            assert a.job(job["id"]) == job  # every replica answers the same: one store
        victim = next(j for j in finals if j["id"] == victim_job["id"])
        outcomes = [attempt["outcome"] for attempt in victim["attempts"]]
        assert outcomes[0] == "interrupted" and outcomes[-1] == "succeeded", outcomes
        retry = next(x for x in victim["attempts"] if x["attempt"] > victim_job["attempt"])
        names = [j["name"] for j in finals]
        wait_for(lambda: all(a.serves(n) and b.serves(n) for n in names), timeout_s=15, what="both replicas serve all")
        for process in processes:
            assert process.proc.poll() is None or process.name in (victim_worker, "worker-1", "worker-2"), process.name
        figures = {
            "store": "postgresql" if store_url else "sqlite",
            "jobs": {j["name"]: [x["outcome"] for x in j["attempts"]] for j in finals},
            "retry_started_after_kill_s": round(retry["started_at"] - killed_at, 1),
            "whole_run_s": round(time.monotonic() - started, 1),
        }
        print("\nscale-out figures:", json.dumps(figures))
        return figures
    except BaseException:
        for process in processes:
            print(f"---- {process.name} ----\n{process.log()[-4000:]}")
        raise
    finally:
        for process in processes:
            if process.proc is not None and process.proc.poll() is None:
                process.stop(timeout_s=30)


def test_postgresql_two_replicas_two_workers(tmp_path, base_registry, tiny_bert_path, corpus, postgres) -> None:
    figures = run_scenario(tmp_path, base_registry, tiny_bert_path, corpus, postgres.new_database(), supervise=False)
    # the dead worker's lease (3 s) lapses, a rescuer takes the job back, an idle worker starts the retry
    assert figures["retry_started_after_kill_s"] < 30


def test_sqlite_two_replicas_supervising_their_workers(tmp_path, base_registry, tiny_bert_path, corpus) -> None:
    figures = run_scenario(tmp_path, base_registry, tiny_bert_path, corpus, None, supervise=True)
    # the dead worker's own supervisor takes its job back at once
    assert figures["retry_started_after_kill_s"] < 30
