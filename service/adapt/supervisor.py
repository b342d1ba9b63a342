"""Start, watch and restart the adapt worker processes (single-machine mode).

The API process never trains: it runs ``python -m embedder.cli adapt-worker ...`` as child
processes that claim jobs from the SQLite store. When a worker exits while it holds a job (killed,
out of memory, crashed), its job is marked ``failed`` / ``interrupted`` — the bundle is published
by a rename only when complete, so the registry never holds half of it — and a fresh worker is
started after a short back-off. On startup, jobs left ``running`` by a previous service are marked
interrupted the same way; on shutdown the workers get SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from adapt.spec import AdaptConfig
from adapt.store import JobStore

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0


@dataclass
class _Worker:
    index: int
    worker_id: str
    process: subprocess.Popen[bytes]
    started_at: float


class WorkerSupervisor:
    """Keeps ``config.max_concurrent_jobs`` worker processes alive for the lifetime of the service."""

    def __init__(
        self, config: AdaptConfig, store: JobStore, *, python: str = sys.executable, check_every_s: float = 0.5
    ) -> None:
        self.config = config
        self.store = store
        self.python = python
        self.check_every_s = check_every_s
        self.workers: dict[int, _Worker] = {}
        self.restarts = 0
        self._failures: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    def command(self, worker_id: str) -> list[str]:
        c = self.config
        cmd = [
            self.python, "-m", "embedder.cli", "adapt-worker",
            "--db", str(c.db_path),
            "--registry-dir", str(c.registry_dir),
            "--worker-id", worker_id,
            "--max-running", str(c.max_concurrent_jobs),
            "--threads", str(c.worker_threads),
            "--nice", str(c.worker_nice),
            "--poll-s", str(c.worker_poll_s),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        if c.general_fast:
            cmd.append("--fast-general")
        if c.keep_uploads:
            cmd.append("--keep-uploads")
        for name, path in sorted(c.base_models.items()):
            cmd += ["--base-model", f"{name}={path}"]
        return cmd

    def recover(self) -> list[str]:
        """Fail jobs a previous run left active (no worker of ours can be running them now)."""
        ids = self.store.fail_active(message="the service restarted while the job was running (interrupted)")
        if ids:
            log.warning("adapt: marked %d interrupted job(s) failed: %s", len(ids), ", ".join(ids))
        return ids

    def spawn(self, index: int) -> _Worker:
        worker_id = f"w{index}-{secrets.token_hex(4)}"
        env = None  # inherit; the worker reads EMBED_CACHE_DIR through core.settings like every tool
        if self.config.cache_dir is not None:
            env = {**os.environ, "EMBED_CACHE_DIR": str(self.config.cache_dir)}
        process = subprocess.Popen(self.command(worker_id), stdin=subprocess.DEVNULL, env=env)
        worker = _Worker(index, worker_id, process, time.monotonic())
        self.workers[index] = worker
        log.info("adapt: started worker %s (pid %d)", worker_id, process.pid)
        return worker

    async def start(self) -> None:
        self.recover()
        for index in range(self.config.max_concurrent_jobs):
            self.spawn(index)
        self._task = asyncio.create_task(self._watch(), name="adapt-supervisor")

    def reap(self) -> list[int]:
        """Handle workers that exited: fail their jobs. Returns the indices that need a new worker."""
        dead = []
        for index, worker in list(self.workers.items()):
            code = worker.process.poll()
            if code is None:
                continue
            ids = self.store.fail_active(
                worker_id=worker.worker_id,
                message=f"the adapt worker exited with code {code} while the job was running (interrupted)",
            )
            log.error("adapt: worker %s exited with code %s; failed job(s): %s", worker.worker_id, code, ids or "none")
            del self.workers[index]
            # A worker that dies right after starting is broken (bad install): back off instead of spinning.
            quick = time.monotonic() - worker.started_at < 10.0
            self._failures[index] = self._failures.get(index, 0) + 1 if quick else 0
            dead.append(index)
        return dead

    async def _watch(self) -> None:
        pending: dict[int, float] = {}  # index -> monotonic time to respawn
        while True:
            for index in self.reap():
                delay = min(MAX_BACKOFF_S, 0.5 * 2 ** self._failures.get(index, 0))
                pending[index] = time.monotonic() + delay
            now = time.monotonic()
            for index, when in list(pending.items()):
                if now >= when:
                    del pending[index]
                    self.restarts += 1
                    self.spawn(index)
            await asyncio.sleep(self.check_every_s)

    async def stop(self, grace_s: float = 10.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for worker in self.workers.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in self.workers.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.to_thread(worker.process.wait, remaining)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                await asyncio.to_thread(worker.process.wait)
            self.store.fail_active(
                worker_id=worker.worker_id, message="the service shut down while the job was running (interrupted)"
            )
        self.workers.clear()

    def status(self) -> dict[str, object]:
        return {
            "workers": [
                {"worker_id": w.worker_id, "pid": w.process.pid, "alive": w.process.poll() is None}
                for w in self.workers.values()
            ],
            "restarts": self.restarts,
        }
