"""What the chart runs, as processes on this machine: `embedder serve` replicas and `embedder adapt-worker` workers
sharing one registry folder, one adapt folder and one job store, configured only by ``EMBED_*`` variables (the
chart's ConfigMap and Secret). Each process logs to a file next to the shared folders, printed when a test fails."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "admin-key"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
ACTIVE = ("queued", "running", "evaluating")


def wait_for(predicate: Callable[[], Any], timeout_s: float = 120.0, every_s: float = 0.2, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"{what or 'condition'} not met within {timeout_s} s")


def cluster_env(root: Path, store_url: str | None, base_model: Path, **settings: Any) -> dict[str, str]:
    """The environment every process of one deployment shares (flat setting names, as in the chart's values)."""
    values: dict[str, Any] = {
        "registry_dir": root / "registry",
        "cache_dir": root / "cache",
        "default_model": "tiny-base",
        "registry_poll_seconds": 0.5,
        "warmup": False,
        "admin_api_keys": ADMIN,
        "adapt_dir": root / "adapt",
        "adapt_base_models": json.dumps({"tiny": str(base_model)}),
        "adapt_min_documents": 16,
        "adapt_batch_size": 8,
        "adapt_lr": 5e-3,
        "adapt_train_last_layers": 0,
        "adapt_gate_margin": 100.0,
        "adapt_general_tasks": "LeeDocSTS",
        "adapt_general_fast": True,
        "adapt_publish_int8": False,  # the int8 trial costs seconds per job; test_student checks it
        "adapt_worker_threads": 1,
        "adapt_worker_nice": 0,
        "adapt_lease_seconds": 3.0,
        "adapt_max_pending_jobs": 16,
        "adapt_poll_seconds": 0.2,
        **settings,
    }
    if store_url is not None:
        values["adapt_store_url"] = store_url
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_")}
    env.update({f"EMBED_{k.upper()}": str(v) for k, v in values.items()})
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


class Process:
    """One `embedder` process with its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
        self.name = name
        self.args = args
        self.env = env
        self.log_path = logs / f"{name}.log"
        logs.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "embedder.cli", *self.args], cwd=ROOT, env=self.env, stdout=log, stderr=log
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no handler runs, like an OOM kill or a node that vanished."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, as Kubernetes does first; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Replica(Process):
    """`embedder serve` on its own port."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        self.port = free_port()
        super().__init__(name, ["serve"], {**env, "EMBED_PORT": str(self.port), "EMBED_HOST": "127.0.0.1"}, logs)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30, headers=AUTH)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, f"{self.name} exited:\n{self.log()[-3000:]}"
            try:
                return self.client.get("/ready").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s, what=f"{self.name} ready")

    def restart(self) -> None:
        assert self.stop() == 0, f"{self.name} did not drain cleanly:\n{self.log()[-3000:]}"
        self.start()
        self.wait_ready()

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/adapt/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def submit(self, texts: list[str], **fields: Any) -> dict[str, Any]:
        r = self.client.post("/adapt", json={"base_model": "tiny", "texts": texts, **fields})
        assert r.status_code == 202, r.text
        return r.json()

    def serves(self, name: str) -> bool:
        models = [m["id"] for m in self.client.get("/v1/models").json()["data"]]
        if name not in models:
            return False
        r = self.client.post("/v1/embeddings", json={"model": name, "input": ["served"]})
        return r.status_code == 200


class Worker(Process):
    """`embedder adapt-worker` on its own, configured by the environment (the chart's worker pods)."""

    def __init__(self, name: str, env: dict[str, str], logs: Path) -> None:
        super().__init__(name, ["adapt-worker", "--worker-id", name], env, logs)


def pid_of_worker(worker_id: str) -> int | None:
    """The process running ``embedder adapt-worker --worker-id worker_id`` (a replica's child, or the test's own)."""
    wanted = f"--worker-id\0{worker_id}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    return None


def can_mount() -> bool:
    """Root may mount (a size-limited tmpfs, a read-only bind): the faults a volume can have, made for real."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


@contextmanager
def size_limited_dir(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"24m"``) mounted at ``path``: writes past it fail with ENOSPC."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """``path`` made read-only for everyone, root included (a read-only bind mount onto itself): EROFS."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
