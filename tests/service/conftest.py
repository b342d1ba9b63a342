"""Service test fixtures: a deterministic fake backend (API edge cases, timing control), fake bundles in a
temporary registry, an app factory, a live uvicorn server on a free loopback port, and real ONNX bundles
exported once per session with `export.bundle.export_bundle`.
"""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI

from core import registry
from service.backend.base import Backend, ModelInfo, Token, Tokenized

VOCAB = 997


class FakeBackend(Backend):
    """Whitespace tokens; an embedding is the normalised sum of seeded random vectors of its token ids, so it
    depends only on the text (never on the batch). Manifest key ``fake`` tunes it: ``seed`` (changes every
    vector: tells versions apart), ``delay_s`` (per batch), ``warmup_s``, ``fail_word`` (a text containing it makes the
    batch raise)."""

    def __init__(self, bundle_dir: Path, settings: Any = None) -> None:
        manifest = registry.read_manifest(bundle_dir)
        fake = manifest.get("fake", {})
        self.info = ModelInfo(
            name=manifest["name"],
            version=str(manifest["version"]),
            dim=int(manifest["dim"]),
            max_seq_length=int(manifest["max_seq_length"]),
            normalized=bool(manifest.get("normalized", True)),
            path=Path(bundle_dir),
            manifest=manifest,
        )
        self.seed = int(fake.get("seed", 0))
        self.delay_s = float(fake.get("delay_s", 0.0))
        self.warmup_s = float(fake.get("warmup_s", 0.0))
        fail_word = fake.get("fail_word")
        self.fail_id = self._word_id(fail_word) if fail_word else None
        self.basis = np.random.default_rng(self.seed).standard_normal((VOCAB, self.info.dim)).astype(np.float32)
        self.batches: list[list[int]] = []  # token counts of every batch run, in order
        self.closed = False
        self.warmed = False

    @staticmethod
    def _word_id(word: str) -> int:
        return 3 + zlib.crc32(word.encode()) % (VOCAB - 3)

    def tokenize(self, texts: Sequence[str], direction: str = "right") -> list[Tokenized]:
        out = []
        limit = self.info.max_seq_length
        for text in texts:
            ids = [1, *(self._word_id(w) for w in text.split()), 2]
            cut = len(ids) > limit
            if cut:  # "left" keeps the last words between the two special ids
                ids = ids[:limit] if direction == "right" else [1, *ids[len(ids) - limit + 1 :]]
            out.append(Tokenized(ids, len(ids), cut))
        return out

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2

    def tokens(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[Token]]:
        out = []
        for text in texts:
            words = [Token(self._word_id(m[0]), m[0], False, m.start(), m.end()) for m in re.finditer(r"\S+", text)]
            special = add_special_tokens
            out.append(
                [Token(1, "[CLS]", True, None, None), *words, Token(2, "[SEP]", True, None, None)] if special else words
            )
        return out

    def embed(self, batch: Sequence[Tokenized]) -> np.ndarray:
        self.batches.append([item.n_tokens for item in batch])
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_id is not None and any(self.fail_id in item.payload for item in batch):
            raise RuntimeError("fake backend failure (secret detail that must not reach clients)")
        vectors = np.stack([self.basis[item.payload].sum(axis=0) for item in batch])
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def warmup(self) -> None:
        time.sleep(self.warmup_s)
        self.warmed = True

    def close(self) -> None:
        self.closed = True


def make_fake_bundle(
    root: Path,
    name: str,
    *,
    dim: int = 16,
    max_seq_length: int = 16,
    promote: bool = True,
    normalized: bool = True,
    **fake: Any,
) -> Path:
    """Publish a manifest-only bundle (enough for `FakeBackend`) through the real registry functions."""
    version = registry.reserve_version(root, name)
    staging = root / name / f".staging-{version}"
    staging.mkdir(parents=True)
    manifest = {
        "name": name, "version": version, "dim": dim, "max_seq_length": max_seq_length, "normalized": normalized,
        "quantization": "none", "base_model": "fake", "method": {"name": "fake", "hyperparameters": {}},
        "fake": fake,
    }  # fmt: skip
    (staging / "manifest.json").write_text(json.dumps(manifest))
    bundle = registry.publish(staging, root, name, version)
    if promote:
        registry.promote(root, name, version)
    return bundle


@pytest.fixture
def fake_backend_cls() -> type[FakeBackend]:
    return FakeBackend


@pytest.fixture
def publish_fake() -> Callable[..., Path]:
    return make_fake_bundle


@pytest.fixture
def fake_registry(tmp_path: Path) -> Path:
    root = tmp_path / "registry"
    root.mkdir()
    make_fake_bundle(root, "fake-a", dim=16)
    make_fake_bundle(root, "fake-b", dim=8, seed=7)
    return root


@pytest.fixture
def make_settings(fake_registry: Path) -> Callable[..., Any]:
    from service.settings import ServiceSettings

    def build(**overrides: Any) -> ServiceSettings:
        values: dict[str, Any] = {
            "registry_dir": fake_registry, "default_model": "fake-a", "registry_poll_seconds": 0,
            "adapt_enabled": False, "max_batch_tokens": 256, "max_batch_size": 8, "shutdown_grace_seconds": 5,
        }  # fmt: skip
        values.update(overrides)
        return ServiceSettings.from_flat(**values)

    return build


@pytest.fixture
def make_app(make_settings: Callable[..., Any]) -> Callable[..., FastAPI]:
    from service.app import create_app

    def build(include_adapt: bool = False, **overrides: Any) -> FastAPI:
        return create_app(make_settings(**overrides), backend_factory=FakeBackend, include_adapt=include_adapt)

    return build


def backends_of(app: FastAPI) -> dict[str, FakeBackend]:
    """The live backend of each served model (to read the batches it ran)."""
    return {m.name: m.backend for m in app.state.engine.models.models()}  # type: ignore[misc]


@pytest.fixture
def fake_backends() -> Callable[[FastAPI], dict[str, FakeBackend]]:
    return backends_of


def wait_ready(proc: subprocess.Popen[str], url: str, seconds: float = 90) -> None:
    """Until an `embedder serve` process answers ``/ready`` with 200 (fails with its output if it exits first)."""
    import httpx

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.1)
    pytest.fail(f"embedder serve did not become ready in {seconds:g} s")


@contextmanager
def live_server(app: FastAPI, grace_seconds: float = 5.0) -> Iterator[tuple[str, Any]]:
    """Run ``app`` under uvicorn in a thread on a free 127.0.0.1 port; yields (base URL, server)."""
    import uvicorn

    from service.cli import DrainingServer

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False)
    server = DrainingServer(config, app.state, grace_seconds)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start (see the log above)")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def serve() -> Callable[..., Any]:
    return live_server


@contextmanager
def service_log(formatter: logging.Formatter) -> Iterator[io.StringIO]:
    """What the ``service`` logger writes at INFO while the block runs, with each request's context, as text."""
    from service.observability import RequestContextFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestContextFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger("service")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
