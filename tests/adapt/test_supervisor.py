"""The service's worker supervisor (`service.adapt.supervisor`), with stand-in processes and a stand-in store."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

from adapt_jobs.jobs import Ended
from adapt_jobs.settings import AdaptConfig, AdaptSettings
from service.adapt.supervisor import WorkerSupervisor

# Stops only when killed: a worker still busy after the grace period.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


class SlowStore:
    """Takes back a worker's jobs as a store slow to answer does (a PostgreSQL restart)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.released: list[str] = []
        self.releasing = threading.Event()

    def release_worker(self, worker_id: str, message: str) -> list[Ended]:
        self.releasing.set()
        time.sleep(self.seconds)
        self.released.append(worker_id)
        return []


class StandIns(WorkerSupervisor):
    """Worker 0 exits at once; the others run until killed."""

    def command(self, worker_id: str) -> list[str]:
        code = "pass" if "-w0-" in worker_id else STUBBORN
        return [sys.executable, "-c", code]


def test_stopping_while_the_watcher_takes_back_a_dead_workers_jobs_stops_every_worker(tmp_path: Path) -> None:
    """The watcher takes a dead worker's jobs back in a thread, which a cancel does not stop: shutting down meanwhile
    once walked the workers while that thread removed one ("dictionary changed size during iteration"), and left the
    other workers running."""
    config = AdaptConfig(
        registry_dir=tmp_path / "registry", cache_dir=tmp_path / "cache",
        settings=AdaptSettings(dir=tmp_path / "adapt", max_concurrent_jobs=2),
    )  # fmt: skip
    store = SlowStore(seconds=1.0)
    supervisor = StandIns(config, store, check_every_s=0.05)  # type: ignore[arg-type]

    async def run() -> list[bool]:
        await supervisor.start()
        processes = [worker.process for worker in supervisor.workers.values()]
        try:
            assert await asyncio.to_thread(store.releasing.wait, 30)  # worker 0 exited: its jobs are being taken back
            await supervisor.stop(grace_s=0.5)
            return [process.poll() is None for process in processes]
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()

    assert asyncio.run(run()) == [False, False]  # none left running
    assert sorted(name.split("-")[-2] for name in store.released) == ["w0", "w1"]
    assert supervisor.workers == {}
