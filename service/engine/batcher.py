"""Per-model batching: a bounded queue of tokenised texts and one loop that forms and runs batches.

How a batch is formed (TEI's token-budget queue, with length sorting to cut padding):

* Admission happens in `submit`, on the event loop and before anything is queued: if the texts
  waiting plus the new ones exceed ``max_queue_size`` the request fails at once with 429 and a
  ``Retry-After`` estimated from the recent throughput.
* The loop takes a window of the oldest waiting texts (a few batches' worth; FIFO between windows,
  so a long text is never starved), sorts it by length, and cuts batches whose padded size
  (longest × count) stays within ``max_batch_tokens`` and whose count stays within ``max_batch_size``.
* Inference runs in one dedicated thread per model (onnxruntime releases the GIL). As soon as a batch
  finishes the next one is launched *before* the finished results are handed back, so the event loop
  serialises responses while the model is already busy with the next batch.
* When idle, a request is launched the moment it arrives: batching never waits to fill a batch, so
  at low load the latency is the single-text latency; under load batches fill up by themselves.

Results are bitwise independent of batch composition up to float rounding: the graph masks padding
(tested: a text alone equals the same text inside a large mixed batch within 1e-5).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.backend.base import Backend, Tokenized
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

WINDOW_BATCHES = 4  # a sort window holds this many full batches: more sorts better, but delays newer texts


@dataclass(eq=False, slots=True)
class EmbedJob:
    """One request's share of work; its future resolves when every row is filled."""

    out: np.ndarray  # (n, dim) float32
    future: asyncio.Future[EmbedJob]
    enqueued_at: float
    remaining: int
    queue_time: float = 0.0  # until its last batch started
    inference_time: float = 0.0  # sum over the batches that carried its texts
    last_batch: int = -1


@dataclass(slots=True)
class _Item:
    job: EmbedJob
    row: int
    tokens: Tokenized


@dataclass
class BatchStats:
    """Recent throughput, for the Retry-After estimate."""

    texts_per_second: float = 0.0
    batches: int = 0
    texts: int = 0
    _alpha: float = field(default=0.2, repr=False)

    def update(self, n: int, seconds: float) -> None:
        rate = n / max(seconds, 1e-6)
        self.texts_per_second = (
            rate if self.batches == 0 else (1 - self._alpha) * self.texts_per_second + (self._alpha * rate)
        )
        self.batches += 1
        self.texts += n


class Batcher:
    """The queue and batch loop of one model. Create, `start()` inside the event loop, `submit()`, `close()`."""

    def __init__(
        self,
        backend: Backend,
        *,
        name: str,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queue_size: int,
        metrics: ServiceMetrics,
    ) -> None:
        self.backend = backend
        self.name = name
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.stats = BatchStats()
        self._pending: deque[_Item] = deque()
        self._window: deque[_Item] = deque()  # sorted, longest first; drained before the next window
        self._queued = 0
        self._wakeup = asyncio.Event()
        self._closing = False
        self._batch_id = 0
        self._task: asyncio.Task[None] | None = None
        self._running: list[_Item] = []  # the batch in the inference thread
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{self.name}")
        self._queue_gauge = metrics.queue_depth.labels(self.name)
        self._m_inference = metrics.inference_time.labels(self.name)
        self._m_batch_size = metrics.batch_size.labels(self.name)
        self._m_batch_tokens = metrics.batch_tokens.labels(self.name)

    # ----------------------------------------------------------------------------------- public
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    @property
    def queued(self) -> int:
        """Texts waiting for a batch."""
        return self._queued

    def submit(self, tokens: Sequence[Tokenized]) -> EmbedJob:
        """Queue the texts of one request; ``await job.future`` gives the filled job. Raises 429/503 at once."""
        if self._closing:
            raise ServiceError(ErrorKind.model_not_ready, f"model {self.name!r} is being unloaded; retry")
        n = len(tokens)
        if self._queued + n > self.max_queue_size:
            raise ServiceError(
                ErrorKind.overloaded,
                f"model {self.name!r} is overloaded: {self._queued} texts queued, limit {self.max_queue_size}; "
                "retry after the number of seconds in Retry-After",
                headers={"Retry-After": str(self.retry_after())},
            )
        loop = asyncio.get_running_loop()
        job = EmbedJob(
            out=np.empty((n, self.backend.info.dim), dtype=np.float32),
            future=loop.create_future(),
            enqueued_at=time.perf_counter(),
            remaining=n,
        )
        self._pending.extend(_Item(job, row, tok) for row, tok in enumerate(tokens))
        self._queued += n
        self._queue_gauge.set(self._queued)
        self._wakeup.set()
        return job

    def retry_after(self) -> int:
        """Seconds until the current queue is likely drained (at least 1)."""
        rate = self.stats.texts_per_second
        return 1 if rate <= 0 else max(1, math.ceil(self._queued / rate))

    async def close(self, timeout: float) -> None:
        """Stop accepting texts, let the queued ones finish (up to ``timeout`` s), then free the model."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                log.warning(
                    "model %s: %d texts still queued after %.1fs; failing them", self.name, self._queued, timeout
                )
                self._task.cancel()
                self._fail_waiting(ServiceError(ErrorKind.shutting_down, "the server is shutting down; retry"))
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.backend.close()

    # ----------------------------------------------------------------------------------- loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._window and not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._next_batch()
            self._running = batch
            started = time.perf_counter()
            running = loop.run_in_executor(self._executor, self.backend.embed, [item.tokens for item in batch])
            while True:
                try:
                    embeddings = await running
                except Exception as err:  # the model failed: every request in the batch gets a 500
                    log.exception("model %s: inference failed on a batch of %d", self.name, len(batch))
                    self._fail(batch, err)
                    break
                finished = time.perf_counter()
                # Launch the next batch before handing these results back: the model works while the
                # event loop serialises responses.
                next_batch = self._next_batch() if (self._window or self._pending) else None
                next_started = time.perf_counter()
                if next_batch is not None:
                    running = loop.run_in_executor(
                        self._executor, self.backend.embed, [item.tokens for item in next_batch]
                    )
                self._deliver(batch, embeddings, started, finished)
                if next_batch is None:
                    break
                batch, started = next_batch, next_started
                self._running = batch

    def _next_batch(self) -> list[_Item]:
        if not self._window:
            take = min(len(self._pending), WINDOW_BATCHES * self.max_batch_size)
            window = [self._pending.popleft() for _ in range(take)]
            window.sort(key=lambda item: -item.tokens.n_tokens)
            self._window.extend(window)
        batch: list[_Item] = []
        width = 0
        # The sorted window first, then (if the batch has room) the oldest newcomers: old texts always go first.
        for source in (self._window, self._pending):
            while source and len(batch) < self.max_batch_size:
                n = max(source[0].tokens.n_tokens, 1)
                if batch and max(width, n) * (len(batch) + 1) > self.max_batch_tokens:
                    break
                batch.append(source.popleft())
                width = max(width, n)
            if self._window:
                break
        self._queued -= len(batch)
        self._queue_gauge.set(self._queued)
        self._m_batch_size.observe(len(batch))
        self._m_batch_tokens.observe(width * len(batch))
        return batch

    def _deliver(self, batch: list[_Item], embeddings: np.ndarray, started: float, finished: float) -> None:
        seconds = finished - started
        self._m_inference.observe(seconds)
        self.stats.update(len(batch), seconds)
        self._batch_id += 1
        for row, item in enumerate(batch):
            job = item.job
            job.out[item.row] = embeddings[row]
            if job.last_batch != self._batch_id:
                job.last_batch = self._batch_id
                job.inference_time += seconds
                job.queue_time = max(job.queue_time, started - job.enqueued_at)
            job.remaining -= 1
            if job.remaining == 0 and not job.future.done():
                job.future.set_result(job)

    def _fail(self, batch: list[_Item], err: BaseException) -> None:
        for item in batch:
            if not item.job.future.done():
                item.job.future.set_exception(err)

    def _fail_waiting(self, err: BaseException) -> None:
        waiting = [*self._running, *self._window, *self._pending]
        self._window.clear()
        self._pending.clear()
        self._queued = 0
        self._queue_gauge.set(0)
        self._fail(waiting, err)
