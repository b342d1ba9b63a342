"""Start, watch and restart this replica's adapt worker processes (single-machine mode).

The API process never trains: it runs ``python -m embedder.cli adapt-worker --config FILE`` as child processes
(``FILE``: this service's `AdaptConfig`, written once, owner-only) that claim jobs from the shared store under a
lease. A worker's environment is an allow-list of the service's (`worker_environment`): no API key reaches it.
A process only ever cleans up after its *own* workers:

* a worker of ours that exits while it holds a job (killed, out of memory, crashed) is dead for sure, so its jobs are
  taken back at once (`JobStore.release_worker`: retried, or failed once their attempts are spent) — no waiting for
  the lease — and a fresh worker is started after a short back-off;
* on shutdown the workers get SIGTERM, stop at their next training step and hand their jobs back to the queue
  (another replica's worker, or this one after a restart, runs them); one that is still running after the grace
  period is killed and its jobs taken back like a crash's.

Jobs of *other* processes are never judged here: when one dies, its lease lapses and a rescuer takes the job back
(`service.adapt.api_router`'s, in every replica, or any idle worker's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from adapt_jobs.jobs import StoreUnavailable
from adapt_jobs.settings import AdaptConfig
from adapt_jobs.store import JobStore
from core import held
from core.settings import Settings

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0
CONFIG_PREFIX = "embedder-adapt-"  # the folder of the workers' config file, under the temporary folder

# What a worker's environment keeps of the service's: the system's and the libraries' own variables (Python, the
# offline switches of the Hugging Face libraries, thread pools, locale). Everything else stays behind — the API keys,
# the store URL (the worker reads it from its config file), whatever else a pod's environment carries.
WORKER_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "LD_PRELOAD", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE",
    "HF_DATASETS_OFFLINE", "TRANSFORMERS_CACHE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
})  # fmt: skip
WORKER_ENV_PREFIXES = ("LC_", "PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_")
# The tool settings (core.settings.Settings: cache, registry, device, threads) that library code reads when it is
# passed no value; none of them is a secret.
WORKER_SETTINGS = frozenset(f"EMBED_{name.upper()}" for name in Settings.model_fields)


def worker_environment(parent: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """A supervised worker's environment: the allow-listed names of ``parent`` (the service's own environment), and
    ``EMBED_CACHE_DIR`` set to the service's cache. The worker runs by its config file (`AdaptConfig.write`), so it
    needs no ``EMBED_*`` setting of the service; an API key in its environment would only be one more place to leak
    it from (a crash dump, a child process, a job's code)."""
    env = {
        name: value
        for name, value in parent.items()
        if name in WORKER_ENV_NAMES or name in WORKER_SETTINGS or name.startswith(WORKER_ENV_PREFIXES)
    }
    return env | {"EMBED_CACHE_DIR": str(cache_dir)}


@dataclass
class _Worker:
    index: int
    worker_id: str
    process: subprocess.Popen[bytes]
    started_at: float


class WorkerSupervisor:
    """Keeps ``max_concurrent_jobs`` worker processes alive for the lifetime of the service."""

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
        self._reaping: asyncio.Future[list[int]] | None = None  # the watcher's round of `reap`, in its thread
        # Owner-only: the file may hold a password. A service killed before `stop` (SIGKILL, out of memory) left its
        # folder, password and all, where a restart of its container finds it: gone once no live process holds it.
        held.sweep(Path(tempfile.gettempdir()), f"{CONFIG_PREFIX}*")
        self._folder = held.make_held(CONFIG_PREFIX)
        self.config_file = config.write(self._folder)

    def command(self, worker_id: str) -> list[str]:
        return [
            self.python, "-m", "embedder.cli", "adapt-worker", "--config", str(self.config_file),
            "--worker-id", worker_id, "--parent-pid", str(os.getpid()),
        ]  # fmt: skip

    def spawn(self, index: int) -> _Worker:
        worker_id = f"{_host()}-w{index}-{secrets.token_hex(4)}"
        env = worker_environment(os.environ, self.config.cache_dir)
        process = subprocess.Popen(self.command(worker_id), stdin=subprocess.DEVNULL, env=env)
        worker = _Worker(index, worker_id, process, time.monotonic())
        self.workers[index] = worker
        log.info("adapt: started worker %s (pid %d)", worker_id, process.pid)
        return worker

    async def start(self) -> None:
        for index in range(self.config.settings.max_concurrent_jobs):
            self.spawn(index)
        self._task = asyncio.create_task(self._watch(), name="adapt-supervisor")

    def _take_back(self, worker: _Worker, message: str) -> list[str]:
        """The jobs of a worker of ours that is gone, back to the queue (or ended when their attempts are spent)."""
        try:
            ended = self.store.release_worker(worker.worker_id, message)
        except StoreUnavailable as err:  # its leases lapse instead, and a rescuer takes the jobs back
            log.warning("adapt: could not take back the jobs of worker %s: %s", worker.worker_id, err)
            return []
        return [f"{e.job_id} ({e.state})" for e in ended]

    def reap(self) -> list[int]:
        """Handle workers that exited: take back their jobs. Returns the indices that need a new worker."""
        dead = []
        for index, worker in list(self.workers.items()):
            code = worker.process.poll()
            if code is None:
                continue
            jobs = self._take_back(worker, f"its adapt worker exited with code {code}")
            log.error("adapt: worker %s exited with code %s; its jobs: %s", worker.worker_id, code, jobs or "none")
            del self.workers[index]
            # A worker that dies right after starting is broken (bad install): back off instead of spinning.
            quick = time.monotonic() - worker.started_at < 10.0
            self._failures[index] = self._failures.get(index, 0) + 1 if quick else 0
            dead.append(index)
        return dead

    async def _watch(self) -> None:
        pending: dict[int, float] = {}  # index -> monotonic time to respawn
        while True:
            # Shielded: a cancel (`stop`) cannot stop the thread, so the round finishes and `stop` waits for it.
            self._reaping = asyncio.ensure_future(asyncio.to_thread(self.reap))
            for index in await asyncio.shield(self._reaping):
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
        """SIGTERM every worker (each hands its job back to the queue), then kill what is left after ``grace_s``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._reaping is not None:
            # A round of `reap` still running in its thread takes back its workers' jobs and removes them from
            # `workers`: done before `workers` is walked here, not while (the dict would change under the walk).
            await asyncio.gather(self._reaping, return_exceptions=True)
            self._reaping = None
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
            # Normally nothing is left (the worker handed its job back); a killed worker's jobs are taken back here.
            await asyncio.to_thread(self._take_back, worker, "its adapt worker was killed at shutdown")
        self.workers.clear()
        shutil.rmtree(self._folder, ignore_errors=True)
        held.let_go(self._folder)

    def status(self) -> dict[str, object]:
        return {
            "workers": [
                {"worker_id": w.worker_id, "pid": w.process.pid, "alive": w.process.poll() is None}
                for w in self.workers.values()
            ],
            "restarts": self.restarts,
        }


def _host() -> str:
    return os.uname().nodename.split(".")[0] or "host"
