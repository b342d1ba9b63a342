"""`embedder serve`: every `ServiceSettings` field is a flag (and an ``EMBED_`` variable); flags win.

On a fresh machine the registry is empty, so the default model's bundle is created first — in a
subprocess (``embedder export``), because exporting needs torch and this process must never import it.
Bound to an interface other hosts reach, it refuses to start while /adapt is on and no key may use it
(`ServiceSettings.open_adapt_error`, checked before anything is loaded). The port is bound before the bundles are made
and the models loaded, so a port already in use is named in a second, not after the load.
Shutdown is graceful: on SIGTERM/SIGINT the server stops taking work (503), lets requests in flight
finish (up to ``shutdown_grace_seconds``), then drains the model queues and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, get_args, get_origin

import uvicorn
from pydantic import SecretStr, TypeAdapter, ValidationError

from core import registry
from core.catalog import BUILTIN_MODELS
from core.model_folder import embedding_file_digests, run_folder_hint
from service.engine.served import models_to_serve
from service.errors import validation_message
from service.observability import configure_logging
from service.settings import ServiceSettings

log = logging.getLogger("service")


class DrainingServer(uvicorn.Server):
    """uvicorn, but a first exit signal only starts draining: new requests get 503 (readiness fails, so a load
    balancer moves traffic away) while in-flight ones finish; then uvicorn's own shutdown runs. A second signal
    exits at once, and so does a first one while the models are still loading."""

    def __init__(self, config: uvicorn.Config, app_state: Any, grace_seconds: float) -> None:
        super().__init__(config)
        self.app_state = app_state
        self.grace_seconds = grace_seconds
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.started:
            # Still loading and warming the models (a minute on a slow CPU), which runs in a thread nothing can
            # interrupt and uvicorn waits for however often it is signalled: nothing was served, nothing is in flight
            # and the adapt workers stop when this process is gone, so stop now.
            name = signal.Signals(sig).name
            print(f"embedder serve: stopped by {name} while starting, before anything was served", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + sig)
        if self.app_state.draining or self._loop is None:
            # a second signal (uvicorn forces the exit only on a second SIGINT): stop waiting for anything
            self.force_exit = self.app_state.draining
            super().handle_exit(sig, frame)
            return
        self.app_state.draining = True
        log.info("draining: %d requests in flight", self.app_state.in_flight)
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._drain_then_exit(sig, frame)))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        deadline = time.monotonic() + self.grace_seconds
        while self.app_state.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # should_exit (not handle_exit): a drained server exits 0 instead of re-raising the signal.
        self.should_exit = True


def _is_bool(annotation: Any) -> bool:
    return annotation is bool


def _is_dict(annotation: Any) -> bool:
    return get_origin(annotation) is dict or any(get_origin(a) is dict for a in get_args(annotation))


def _default_text(name: str, field: Any) -> str:
    default = field.get_default(call_default_factory=True)
    if isinstance(default, list):
        return ",".join("***" if isinstance(v, SecretStr) else str(v) for v in default) or "empty"
    if isinstance(default, timedelta):  # as it is written in the environment and the chart: ISO 8601 (P7D)
        return str(TypeAdapter(timedelta).dump_python(default, mode="json"))
    return "none" if default is None else str(default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="embedder serve",
        description="Serve promoted embedding bundles over HTTP (OpenAI /v1/embeddings, TEI /embed and /similarity, "
        "/metrics). Each option is also an environment variable; the command line wins. API keys are safer in "
        "the environment than on a command line other users can read.",
    )
    for name, field in ServiceSettings.flat_fields().items():
        flag = "--" + name.replace("_", "-")
        text = f"{field.description} (env EMBED_{name.upper()}; default {_default_text(name, field)})"
        text = text.replace("%", "%%")
        if _is_bool(field.annotation):
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, dest=name, default=None, metavar=name.upper(), help=text)
    return parser


def settings_from_args(argv: list[str]) -> ServiceSettings:
    """Environment first, then the flags given (pydantic coerces the strings and checks every limit)."""
    args = build_parser().parse_args(argv)
    fields = ServiceSettings.flat_fields()
    values: dict[str, Any] = {}
    for name, value in vars(args).items():
        if value is None:
            continue
        if _is_dict(fields[name].annotation) and isinstance(value, str):
            value = json.loads(value)
        values[name] = value
    return ServiceSettings.from_flat(**values)


def export_command(settings: ServiceSettings, name: str | None = None, source: Path | None = None) -> list[str]:
    """The subprocess that builds a bundle (the default model's unless ``name``) from the built-in model of the same
    name or from the model folder ``source``, with every graph (the engine that serves it is chosen on this CPU at
    load: `core.engines`)."""
    name = name or settings.default_model
    return [
        sys.executable, "-m", "embedder.cli", "export", str(source or name), "--name", name,
        "--registry", str(Path(settings.registry_dir).absolute()), "--promote", "--quantize", "auto",
    ]  # fmt: skip


def is_folder_entry(entry: str) -> bool:
    """Whether a ``models`` entry is a path (holds a separator, or starts with '.' or '~') rather than a name."""
    return "/" in entry or os.sep in entry or entry.startswith((".", "~"))


def folder_model_name(folder: Path) -> str:
    """The registry name a model folder is served under: its folder's name made one (`core.registry.name_from`)."""
    try:
        return registry.name_from(folder.name)
    except registry.RegistryError:
        raise RuntimeError(f"models: no model name can be made from the folder name {folder.name!r}") from None


def model_folders(settings: ServiceSettings) -> tuple[ServiceSettings, dict[str, Path]]:
    """The settings with each model folder in ``models`` (and ``default_model``) replaced by the name it is served
    under (`folder_model_name`), and those folders by name; RuntimeError for a path that is no model folder."""
    folders: dict[str, Path] = {}
    names = []
    for entry in settings.models:
        if not is_folder_entry(entry):
            names.append(entry)
            continue
        folder = Path(entry).expanduser().resolve()
        if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
            hint = run_folder_hint(folder)
            raise RuntimeError(f"models: {entry!r} is not a Hugging Face model folder ({hint or 'no config.json'})")
        name = folder_model_name(folder)
        if folders.get(name, folder) != folder:
            raise RuntimeError(f"models: {folders[name]} and {folder} would both be served as {name!r}")
        folders[name] = folder
        names.append(name)
    default = settings.default_model
    if is_folder_entry(default):
        default = folder_model_name(Path(default).expanduser().resolve())
    return settings.model_copy(update={"models": names, "default_model": default}), folders


def _reexport_reason(name: str, bundle: Path | None, folder: Path) -> str | None:
    """Why the model folder ``folder`` must be exported again for ``name``, or None when its promoted ``bundle`` was
    exported from the folder as it is now: every file that decides the embeddings (weights, configs, tokenizer,
    pooling, prompts, Dense layer: `core.model_folder.embedding_file_digests`) has the sha256 the bundle's manifest
    recorded at export. A bundle exported before manifests recorded those files (only its weights' sha256) is
    exported again once, since what else changed cannot be known."""
    if bundle is None:
        return f"no promoted {name!r}: creating it from {folder} once"
    source = registry.read_manifest(bundle).get("source") or {}
    recorded = source.get("files")
    version = f"{name!r} version {bundle.name}"
    if not isinstance(recorded, dict):
        return (
            f"{version} records only its weights' sha256, not those of the other files that decide the embeddings "
            f"(configs, tokenizer, pooling, prompts): exporting {folder} again once so later starts can compare them"
        )
    current = embedding_file_digests(folder)
    changed = sorted(path for path in recorded.keys() | current.keys() if recorded.get(path) != current.get(path))
    if not changed:
        return None
    return f"{folder} changed since {version} was exported from it ({', '.join(changed)}): exporting it again"


def ensure_bundles(settings: ServiceSettings, folders: Mapping[str, Path] = {}) -> list[str]:
    """Export, each in a child process, every bundle the server is to serve and the registry lacks: the default
    model when the registry has no promoted model at all, every built-in name in ``models`` once, and each model
    folder (``folders``, by name: `model_folders`) the promoted bundle of its name was not exported from as it is
    now (`_reexport_reason`) — so a folder retrained, or given another pooling, tokenizer, prompt or length, in place
    is exported again on the next start. Then the names it serves (`models_to_serve`: RuntimeError says what is
    missing, before the server starts)."""
    root = Path(settings.registry_dir)
    found = registry.served_models(root)
    wanted = list(settings.models) or ([] if found else [settings.default_model])
    exports: list[tuple[str, Path | None, str]] = [
        (name, None, f"no promoted {name!r}: creating it from the built-in model once")
        for name in wanted
        if name not in found and name in BUILTIN_MODELS and name not in folders
    ]
    for name, folder in folders.items():
        reason = _reexport_reason(name, found.get(name), folder)
        if reason is not None:
            exports.append((name, folder, reason))
    for name, source, reason in exports:
        command = export_command(settings, name, source)
        log.info("registry %s: %s (a minute or two; next starts skip this)", root.absolute(), reason)
        env = {**os.environ, "EMBED_CACHE_DIR": str(settings.cache_dir)}
        returncode = run_export(command, env=env)
        if returncode != 0:
            raise RuntimeError(
                f"creating the bundle {name!r} failed (exit {returncode}); run it yourself to see why: "
                + " ".join(command)
            )
    return models_to_serve(settings, registry.served_models(root))


EXPORT_STOP_SECONDS = 60.0  # on Ctrl-C: how long the export may take to remove its staging folder before a kill


def run_export(command: list[str], env: Mapping[str, str]) -> int:
    """Run the export subprocess; its exit code. It runs in a session of its own, so a terminal's Ctrl-C reaches
    this process alone, which then hands it on (``KeyboardInterrupt``, re-raised once the export stopped): the export
    removes its staging folder and publishes nothing, with time to do so before it is killed. One signal either way,
    whoever sent it to whom."""
    process = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=EXPORT_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings = settings_from_args(argv)
    except ValidationError as err:  # where and what, never the value sent (a key, a password in a URL)
        print(f"embedder serve: {validation_message(err.errors(), what='settings', limit=10)}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as err:
        print(f"embedder serve: invalid settings: {err}", file=sys.stderr)
        return 2
    refusal = settings.open_adapt_error()
    if refusal is not None:  # before the default bundle is exported: that can take minutes
        print(f"embedder serve: {refusal}", file=sys.stderr)
        return 2
    try:
        listeners = bind_listeners(settings.host, settings.port)
    except OSError as err:
        print(f"embedder serve: cannot listen on {settings.host} port {settings.port}: {err.strerror or err}"
              + (" (another server is using it: stop it, or pass --port)" if err.errno == errno.EADDRINUSE else ""),
              file=sys.stderr)  # fmt: skip
        return 2
    with contextlib.ExitStack() as closing:
        for listener in listeners:
            closing.enter_context(listener)
        configure_logging(settings.log_level, settings.log_format)
        try:
            settings, folders = model_folders(settings)
            ensure_bundles(settings, folders)
        except RuntimeError as err:
            log.error("%s", err)
            return 1
        except KeyboardInterrupt:
            print("embedder serve: stopped by SIGINT before the server started", file=sys.stderr)
            return 128 + signal.SIGINT
        from service.app import create_app

        return run_server(create_app(settings), settings, listeners)


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """TCP sockets bound to ``host``:``port`` (not yet listening: a connection is refused until the server runs),
    one per address the host has, as uvicorn (asyncio) would bind them: ``localhost`` is often ::1 and 127.0.0.1, and
    a client may call either. With ``port`` 0 every address gets the port the first one drew. ``OSError`` when an
    address is taken or not this machine's."""
    host = host.strip("[]")  # "[::1]", as a URL writes it
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):  # each address once, in the resolver's order
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio: "::" does not also take the IPv4 addresses
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def run_server(app: Any, settings: ServiceSettings, listeners: list[socket.socket] | None = None) -> int:
    """Serve ``app`` (`service.app.create_app`'s) with uvicorn on ``listeners`` (`bind_listeners`'), or on the
    settings' host and port, until a signal drains it; 0 once it ran, 1 if it never started."""
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_seconds) or None,
    )  # fmt: skip
    server = DrainingServer(config, app.state, settings.shutdown_grace_seconds)
    server.run(sockets=listeners)
    return 0 if server.started else 1
