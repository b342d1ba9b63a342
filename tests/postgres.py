"""A real PostgreSQL server for the tests, from the binaries the `pgserver` wheel ships (a dev dependency, so
`scripts/bootstrap.sh` puts it on every machine; no system package, no root needed).

PostgreSQL refuses to run as root: as root the server runs as the system user ``postgres`` (Debian's package makes
it) or, when there is none, a system user this module creates once, ``embedder-pg``. Each test gets its own database.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from tests.ports import free_port


def _binaries() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver wheel is not installed: run `bash scripts/bootstrap.sh` (dev dependencies)")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def _server_user() -> str | None:
    """Who runs the server: None (this user) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "embedder-pg"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "embedder-pg"],
                   check=True)  # fmt: skip
    return "embedder-pg"


class PostgresServer:
    """One throwaway cluster on 127.0.0.1 (trust auth), stopped and deleted by `close`."""

    def __init__(self) -> None:
        self.bin = _binaries()
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="embedder-pg-"))  # not under pytest's 0700 tmp: the server's user
        self.data = self.root / "data"                           # must reach it
        self.port = free_port()
        if self.user is not None:
            shutil.chown(self.root, self.user)
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: object) -> None:
        cmd = [str(self.bin / tool), *map(str, args)]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off -c max_connections=200"
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", self.root / "server.log", "-w", "-t", "60", "start")

    def stop(self) -> None:
        """Stop at once (`immediate`: like a crash, clients' connections break mid-transaction)."""
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
