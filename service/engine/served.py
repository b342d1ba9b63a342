"""The models this process serves: loaded from the registry at start, hot-swapped when a new version is promoted.

A swap never interrupts clients: the new version is loaded and warmed in a worker thread while the
old one keeps answering; then the name points at the new model (one dict assignment on the event
loop) and the old model's queue drains before its session is freed. Requests that already hold the
old model finish on it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core import registry
from core.engine_choice import AUTO, BASELINE, shapes_text
from service.backend.base import Backend, BackendFactory, ModelInfo
from service.engine.batcher import Batcher
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics
from service.settings import ServiceSettings

log = logging.getLogger(__name__)


def _no_one_waits() -> None:
    pass


@dataclass(eq=False)
class ServedModel:
    """A loaded, warmed model and its queue."""

    name: str  # the registry name (what clients send as `model`)
    backend: Backend
    batcher: Batcher
    loaded_at: float

    @property
    def info(self) -> ModelInfo:
        return self.backend.info


def models_to_serve(settings: ServiceSettings, found: Mapping[str, Path]) -> list[str]:
    """The names a server with ``settings`` serves from the promoted bundles ``found`` (`registry.served_models`):
    ``models``, or every promoted one; RuntimeError says what is missing and what to do."""
    root = Path(settings.registry_dir).absolute()
    wanted = list(settings.models) or sorted(found)
    missing = [name for name in wanted if name not in found]
    if missing or not wanted:
        raise RuntimeError(
            f"no promoted bundle for {missing or 'any model'} in registry {root} "
            f"(promoted: {sorted(found) or 'none'}); export one with `embedder export MODEL_OR_FOLDER --name NAME "
            f"--registry {root} --promote` or change EMBED_MODELS"
        )
    if settings.default_model not in wanted:
        raise RuntimeError(
            f"default model {settings.default_model!r} is not among the served models {wanted}; "
            "set EMBED_DEFAULT_MODEL to one of them"
        )
    return wanted


def check_token_budget(name: str, bundle: Path, max_batch_tokens: int) -> None:
    """RuntimeError, naming both values and what to set, when the bundle's ``max_seq_length`` exceeds
    ``max_batch_tokens``: one text of that length alone would be a batch over the budget (TEI refuses to start so too).
    Read from the manifest, before the bundle is loaded and its engines are timed."""
    max_seq_length = int(registry.read_manifest(bundle)["max_seq_length"])
    if max_seq_length > max_batch_tokens:
        raise RuntimeError(
            f"model {name!r} ({bundle}) has max_seq_length {max_seq_length}, more than max_batch_tokens "
            f"({max_batch_tokens}): one text of {max_seq_length} tokens alone would be a batch over the token budget; "
            f"set EMBED_MAX_BATCH_TOKENS to at least {max_seq_length}, or serve a bundle with a shorter max_seq_length"
        )


class ModelManager:
    """Loads the promoted bundles named by the settings and keeps them current."""

    def __init__(self, settings: ServiceSettings, backend_factory: BackendFactory, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.root = Path(settings.registry_dir)
        self.backend_factory = backend_factory
        self.metrics = metrics
        self._models: dict[str, ServedModel] = {}
        self._failed: dict[str, Path] = {}  # name -> bundle that failed to load (not retried until it changes)
        self._ready = False
        self._poller: asyncio.Task[None] | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        self._refresh_lock = asyncio.Lock()
        # Called whenever a model's queue may have room again (a batch launched): the admission's wake-up.
        self.on_room: Callable[[], None] = _no_one_waits

    # ---------------------------------------------------------------------------------- lookup
    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def names(self) -> list[str]:
        return sorted(self._models)

    def models(self) -> list[ServedModel]:
        return [self._models[name] for name in sorted(self._models)]

    def current(self, name: str) -> ServedModel | None:
        """The model now served under ``name`` (None: none is)."""
        return self._models.get(name)

    def get(self, name: str | None) -> ServedModel:
        """The model a request names (the default when ``None``); 404 lists the served names."""
        wanted = name or self.settings.default_model
        model = self._models.get(wanted)
        if model is not None:
            return model
        if not self._ready:
            raise ServiceError(ErrorKind.model_not_ready, "models are still loading; retry when /ready answers 200")
        served = ", ".join(self.names) or "none"
        raise ServiceError(ErrorKind.model_not_found, f"model {wanted!r} is not served here; served models: {served}")

    # ---------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load and warm every model to serve; fail with a message naming what is missing."""
        found = await asyncio.to_thread(registry.served_models, self.root)
        wanted = models_to_serve(self.settings, found)
        for name in wanted:
            self._install(await self._load(name, found[name]))
        self._ready = True
        if self.settings.registry_poll_seconds > 0:
            self._poller = asyncio.get_running_loop().create_task(self._poll(), name="registry-poll")

    async def stop(self, timeout: float) -> None:
        """Stop polling, then drain every queue (in-flight texts finish, up to ``timeout`` s)."""
        self._ready = False
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        closing = [model.batcher.close(timeout) for model in self._models.values()]
        await asyncio.gather(*closing, *self._retiring, return_exceptions=True)
        self._models.clear()
        self.metrics.models_loaded.set(0)

    async def refresh(self) -> list[str]:
        """Load newly promoted versions (and new names when serving everything); returns what changed."""
        async with self._refresh_lock:
            found = await asyncio.to_thread(registry.served_models, self.root)
            wanted = list(self.settings.models) or sorted(found)
            changed = []
            for name in wanted:
                bundle = found.get(name)
                current = self._models.get(name)
                if bundle is None or (current is not None and current.info.path == bundle):
                    continue
                if self._failed.get(name) == bundle:
                    continue
                try:
                    model = await self._load(name, bundle)
                except Exception:
                    log.exception("model %s: could not load %s; still serving the previous version", name, bundle)
                    self._failed[name] = bundle
                    continue
                self._install(model)
                changed.append(name)
            return changed

    # ---------------------------------------------------------------------------------- internals
    async def _load(self, name: str, bundle: Path) -> ServedModel:
        started = time.perf_counter()
        await asyncio.to_thread(check_token_budget, name, bundle, self.settings.max_batch_tokens)
        backend = await asyncio.to_thread(self._load_and_warm, bundle)
        if backend.info.name != name:
            log.warning("bundle %s says its name is %r; serving it as %r", bundle, backend.info.name, name)
        batcher = Batcher(
            backend,
            name=name,
            max_batch_tokens=self.settings.max_batch_tokens,
            max_batch_size=self.settings.max_batch_size,
            max_queue_size=self.settings.max_queue_size,
            max_queue_wait_seconds=self.settings.max_queue_wait_seconds,
            queue_wait_min_requests=self.settings.queue_wait_min_requests,
            on_room=lambda: self.on_room(),
            metrics=self.metrics,
        )
        log.info(
            "model %s version %s loaded from %s in %.1fs (dim %d, max_seq_length %d, %s graph, engine %s)",
            name, backend.info.version, bundle, time.perf_counter() - started, backend.info.dim,
            backend.info.max_seq_length, backend.info.variant, backend.info.engine.get("engine", "-"),
        )  # fmt: skip
        return ServedModel(name=name, backend=backend, batcher=batcher, loaded_at=time.time())

    def _load_and_warm(self, bundle: Path) -> Backend:
        """The bundle loaded and warmed with the engine setting; when the automatic choice raises (one engine's
        runtime failing on this graph or CPU while it is checked, timed or warmed), loaded again on the baseline
        engine — which still holds the parity bars, fp32 where int8 misses them — and the choice says why."""
        try:
            return self._warm(self.backend_factory(bundle, self.settings))
        except Exception as error:
            if self.settings.engine != AUTO:
                raise
            why = f"{type(error).__name__}: {str(error)[:300]}"
            log.warning("bundle %s: the engine choice failed (%s); loading it on %s", bundle, why, BASELINE,
                        exc_info=True)  # fmt: skip
            backend = self._warm(self.backend_factory(bundle, self.settings.model_copy(update={"engine": BASELINE})))
        choice = backend.info.engine
        reason = f"the engine choice failed ({why}), so {BASELINE} is served as if pinned; {choice.get('reason', '')}"
        backend.info = replace(backend.info, engine={**choice, "reason": reason})
        return backend

    def _warm(self, backend: Backend) -> Backend:
        if self.settings.warmup:
            backend.warmup()
        return backend

    def _install(self, model: ServedModel) -> None:
        name = model.name
        self.metrics.register_model(name)
        precision = model.info.engine.get("precision", model.info.variant)  # the engine of its largest batches
        self.metrics.model_int8.labels(name).set(1 if precision == "int8" else 0)
        old = self._models.get(name)
        if old is not None and old.info.engine:
            self.metrics.model_engine.remove(name, old.info.engine["engine"], old.info.engine["precision"])
            for labels in _route_labels(old.info.engine):
                self.metrics.model_engine_route.remove(name, *labels)
        if model.info.engine:
            self.metrics.model_engine.labels(name, model.info.engine["engine"], model.info.engine["precision"]).set(1)
            for labels in _route_labels(model.info.engine):
                self.metrics.model_engine_route.labels(name, *labels).set(1)
        model.batcher.start()
        self._models[name] = model
        self._failed.pop(name, None)
        self.metrics.models_loaded.set(len(self._models))
        if old is not None:
            log.info("model %s: now serving version %s (was %s)", name, model.info.version, old.info.version)
            task = asyncio.get_running_loop().create_task(old.batcher.close(self.settings.shutdown_grace_seconds))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.settings.registry_poll_seconds)
            try:
                await self.refresh()
            except Exception:  # a broken registry must not stop serving what is loaded
                log.exception("registry poll failed")


def _route_labels(choice: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(engine, precision, shapes) of each route of an engine choice (`core.engine_choice.EngineChoice.as_dict`)."""
    routes = choice.get("routes", [])
    return [(r["engine"], r["precision"], shapes_text(r["shapes"]) if len(routes) > 1 else "all") for r in routes]
