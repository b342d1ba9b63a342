"""Per-model batching: a bounded queue of tokenised texts and one loop that forms and runs batches.

How a batch is formed (TEI's token-budget queue, with length sorting to cut padding):

* Admission (`refusal`) is decided on the event loop before anything is queued — by the server's admission
  before a request's body is even read (`service.guard.GuardMiddleware`), and again here when the texts are
  queued. A request is refused (429, ``Retry-After`` = the estimated seconds to drain the queue) if the texts
  waiting plus the new ones exceed ``max_queue_size`` (memory), or if at least ``queue_wait_min_requests``
  requests are already waiting ahead of it *and* their work would take longer than ``max_queue_wait_seconds``
  at the recent throughput (`service.engine.throughput.Throughput`) — latency under a flood. The request floor is
  what makes the wait bound hold on any CPU: a few concurrent clients are always served however large their
  requests and however slow the CPU (the work ahead of a client among k is at most k - 1 of its own requests,
  wherever it runs), and only a crowd of requests meets a bound in seconds. The wait bound applies only once the
  throughput is known (a cold model admits what the count bound admits).
* Capacity is shared fairly between callers (API keys; `service.engine.fair`): texts wait in one FIFO per key,
  and the loop draws them in deficit round robin by tokens, so a key with a few clients is served as many tokens
  per round as a key flooding the queue. The bounds above apply per key once several keys have texts queued: a key
  may queue its share of ``max_queue_size`` (the bound over the number of keys queuing), its wait is estimated as
  fair queuing will serve it (each other key's queued tokens counted up to its own), and the request floor counts
  its own requests. With one key all of this is the plain FIFO queue.
* The loop takes a window of the next waiting texts in that order (a few batches' worth; FIFO within a key
  between windows, so a long text is never starved), sorts it by length, and cuts batches whose padded size
  (longest × count) stays within ``max_batch_tokens`` and whose count stays within ``max_batch_size``.
* Inference runs in one dedicated thread per model (onnxruntime releases the GIL). As soon as a batch
  finishes the next one is launched *before* the finished results are handed back, so the event loop
  serialises responses while the model is already busy with the next batch.
* When idle, a request is launched the moment it arrives: batching never waits to fill a batch, so
  at low load the latency is the single-text latency; under load batches fill up by themselves.
* A lone small batch — nothing else queued, at most ``INLINE_BATCH_TOKENS`` padded tokens, on a backend whose small
  batches take a predictable few milliseconds (`Backend.runs_small_batches_inline`), and the last
  ``INLINE_HISTORY`` such batches each done within ``INLINE_BATCH_SECONDS`` — runs on the event loop itself: handing
  it to the inference thread and its result back costs two thread wake-ups, which on a busy 2-core machine took
  ~0.5 ms of a 2 ms text. The loop is held for that long (the model is busy meanwhile either way); any slow
  small batch (a crowded machine) sends them back to the inference thread for the next ``INLINE_HISTORY``.

Whether results depend on the batch a text is in depends on the graph. fp32 graphs (and OpenVINO's int8, whose
scales were fixed at export) mask the padding, so a text's embedding does not depend on its batch beyond float
rounding (tested: with onnxruntime fp32, a text alone equals the same text inside a large mixed batch within 1e-5).
onnxruntime's dynamic int8 quantises each activation with one scale over the whole batch, padding included, so a short
text among long ones comes out slightly differently: held to the parity bars, since the export and the engine check
at load score every probe at the worse of length-sorted and mixed-length batches (`core.runtime.probe_cosines`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service.auth import ANONYMOUS
from service.backend.base import Backend, Tokenized
from service.engine.fair import FairQueue
from service.engine.throughput import Throughput
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

WINDOW_BATCHES = 4  # a sort window holds this many batches' texts and tokens: more sorts better, but delays newer texts
INLINE_BATCH_TOKENS = 128  # a lone batch of at most this many padded tokens may run on the event loop ...
INLINE_BATCH_SECONDS = 0.005  # ... while the last INLINE_HISTORY batches that small each took at most this long
INLINE_HISTORY = 8


@dataclass(eq=False, slots=True)
class EmbedJob:
    """One request's share of work; its future resolves when every row is filled."""

    out: np.ndarray  # (n, dim) float32
    future: asyncio.Future[EmbedJob]
    enqueued_at: float
    remaining: int  # rows not yet embedded
    unlaunched: int  # rows not yet in a launched batch
    tenant: str = ANONYMOUS  # the caller's key id: whose share of the queue the texts take
    queue_time: float = 0.0  # until its last batch started
    started_at: float = 0.0  # when its first batch started (perf_counter)
    finished_at: float = 0.0  # when its last row was delivered
    inference_time: float = 0.0  # sum over the batches that carried its texts
    last_batch: int = -1


@dataclass(slots=True)
class _Item:
    job: EmbedJob
    row: int
    tokens: Tokenized


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
        max_queue_wait_seconds: float = 0.0,
        queue_wait_min_requests: int = 0,
        on_room: Callable[[], None] | None = None,
        metrics: ServiceMetrics,
    ) -> None:
        self.backend = backend
        self.name = name
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.max_queue_wait_seconds = max_queue_wait_seconds
        self.queue_wait_min_requests = queue_wait_min_requests
        self.on_room = on_room  # told after every batch launch: the queue may have room for a waiting request
        self.throughput = Throughput()
        self._waiting_jobs = 0  # requests with texts not yet launched in a batch
        # A key's credit per round robin turn: one text's share of a batch's token budget, so every key with texts
        # waiting gets turns within each sort window.
        self._pending: FairQueue[_Item] = FairQueue(_item_cost, quantum=max(1, max_batch_tokens // max_batch_size))
        self._window: deque[_Item] = deque()  # sorted, longest first; drained before the next window
        self._queued = 0
        self._queued_tokens = 0
        # The same three, per key (texts in the window included): what the per-key bounds read.
        self._waiting_by: Counter[str] = Counter()
        self._queued_by: Counter[str] = Counter()
        self._tokens_by: Counter[str] = Counter()
        self._running_tokens = 0  # of the batch in the inference thread, launched at _running_since
        self._running_since = 0.0
        self._wakeup = asyncio.Event()
        self._closing = False
        self._batch_id = 0
        self._task: asyncio.Task[None] | None = None
        self._running: list[_Item] = []  # the batch in the inference thread
        self._inline = backend.runs_small_batches_inline
        self._small_seconds: deque[float] = deque(maxlen=INLINE_HISTORY)  # recent batches of <= INLINE_BATCH_TOKENS
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{self.name}")
        self._queue_gauge = metrics.queue_depth.labels(self.name)
        self._m_inference = metrics.inference_time.labels(self.name)
        self._m_batch_size = metrics.batch_size.labels(self.name)
        self._m_batch_tokens = metrics.batch_tokens.labels(self.name)

    # ----------------------------------------------------------------------------------- public
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    @property
    def closing(self) -> bool:
        """Whether this queue takes no more texts (its model was replaced by a newer version, or the server stops)."""
        return self._closing

    @property
    def queued(self) -> int:
        """Texts waiting for a batch."""
        return self._queued

    @property
    def waiting_requests(self) -> int:
        """Requests with texts still waiting for a batch."""
        return self._waiting_jobs

    def refusal(self, n: int = 1, tenant: str = ANONYMOUS) -> ServiceError | None:
        """Why ``n`` more texts of ``tenant`` may not be queued now (503 while the model is unloaded, 429 with
        Retry-After when over a bound), or None. Needs no tokens: with ``n = 1`` it is admission's question, asked
        before a request's body is read — is this model over its bound for this key whatever the request holds?"""
        if self._closing:
            return ServiceError(ErrorKind.model_not_ready, f"model {self.name!r} is being unloaded; retry")
        if self._queued + n > self.max_queue_size:
            keys = len(self._queued_by.keys() | {tenant})
            share = self.max_queue_size // keys
            if self._queued_by[tenant] + n > share:
                mine = "" if keys == 1 else f" ({self._queued_by[tenant]} of this key's, its share {share})"
                return self._overloaded(f"{self._queued} texts queued{mine}, limit {self.max_queue_size}")
        waiting = self._waiting_by[tenant]
        if self.max_queue_wait_seconds > 0 and waiting >= max(self.queue_wait_min_requests, 1):
            wait = self.estimated_wait(tenant)
            if wait is not None and wait > self.max_queue_wait_seconds:
                return self._overloaded(
                    f"the {waiting} requests queued ahead would take about {wait:.1f} s, "
                    f"limit {self.max_queue_wait_seconds:g} s"
                )
        return None

    def check_admission(self, n: int, tenant: str = ANONYMOUS) -> None:
        """Raise `refusal`'s error, if any."""
        err = self.refusal(n, tenant)
        if err is not None:
            raise err

    def _overloaded(self, why: str) -> ServiceError:
        return ServiceError(
            ErrorKind.overloaded,
            f"model {self.name!r} is overloaded: {why}; retry after the number of seconds in Retry-After",
            headers={"Retry-After": str(self.retry_after())},
        )

    def estimated_wait(self, tenant: str | None = None) -> float | None:
        """Seconds until a text queued now would start: the tokens served before it plus what is left of the
        running batch, over the recent throughput. None before any batch was delivered. For a ``tenant``, the
        tokens served first are as fair queuing orders them: its own queued tokens, and each other key's up to as
        many (none queued: just the running batch); without one, every queued token (the whole queue drained)."""
        rate = self.throughput.tokens_per_second
        if rate is None:
            return None
        running_left = max(0.0, self._running_tokens / rate - (time.perf_counter() - self._running_since))
        if tenant is None:
            ahead = self._queued_tokens
        else:
            mine = self._tokens_by[tenant]
            ahead = sum(min(tokens, mine) for tokens in self._tokens_by.values())
        return ahead / rate + running_left

    def submit(self, tokens: Sequence[Tokenized], tenant: str = ANONYMOUS) -> EmbedJob:
        """Queue the texts of one request of ``tenant`` (a key id); ``await job.future`` gives the filled job.
        Raises 429/503 at once."""
        n = len(tokens)
        self.check_admission(n, tenant)
        loop = asyncio.get_running_loop()
        job = EmbedJob(
            out=np.empty((n, self.backend.info.dim), dtype=np.float32),
            future=loop.create_future(),
            enqueued_at=time.perf_counter(),
            remaining=n,
            unlaunched=n,
            tenant=tenant,
        )
        self._pending.extend(tenant, (_Item(job, row, tok) for row, tok in enumerate(tokens)))
        cost = sum(_cost(tok) for tok in tokens)
        self._waiting_jobs += 1
        self._queued += n
        self._queued_tokens += cost
        self._waiting_by[tenant] += 1
        self._queued_by[tenant] += n
        self._tokens_by[tenant] += cost
        self._queue_gauge.set(self._queued)
        self._wakeup.set()
        return job

    def cancel(self, job: EmbedJob) -> None:
        """Drop the texts of ``job`` not yet in a batch (its client went away): they are never embedded and free
        their places in the queue at once; rows already running are computed and discarded."""
        if not job.future.done():
            job.future.cancel()
        if job.unlaunched == 0:
            return
        dropped = [item for item in self._window if item.job is job]
        if dropped:
            kept = [item for item in self._window if item.job is not job]
            self._window.clear()
            self._window.extend(kept)
        dropped += self._pending.remove(job.tenant, lambda item: item.job is job)
        self._dequeued(dropped)
        if self.on_room is not None:
            self.on_room()

    def retry_after(self) -> int:
        """Seconds until the current queue is likely drained (at least 1; 1 while the throughput is unknown)."""
        wait = self.estimated_wait()
        return 1 if wait is None else max(1, math.ceil(wait))

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
        # Waited for in a thread: after a timeout a batch may still be running, and the event loop serves the other
        # models (and the new version of this one) meanwhile.
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)
        self.backend.close()

    # ----------------------------------------------------------------------------------- loop
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._window and not self._pending:
                self._running_tokens = 0
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._next_batch()
            self._running = batch
            started = time.perf_counter()
            if self._runs_inline(batch):
                try:
                    embeddings = self.backend.embed([item.tokens for item in batch])
                except Exception as err:
                    log.exception("model %s: inference failed on a batch of %d", self.name, len(batch))
                    self._fail(batch, err)
                else:
                    self._deliver(batch, embeddings, started, time.perf_counter())
                continue
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

    def _runs_inline(self, batch: list[_Item]) -> bool:
        """Whether ``batch`` runs on the event loop (see the module's docstring)."""
        if not self._inline or self._window or self._pending or len(self._small_seconds) < INLINE_HISTORY:
            return False
        return _padded(batch) <= INLINE_BATCH_TOKENS and max(self._small_seconds) <= INLINE_BATCH_SECONDS

    def _next_batch(self) -> list[_Item]:
        if not self._window:
            # A few batches' worth by count and by tokens: long texts fill a batch's budget with few texts, and a
            # window is drained before the next is drawn, so a text arriving now waits at most for this window.
            window: list[_Item] = []
            budget = WINDOW_BATCHES * self.max_batch_tokens
            while self._pending and len(window) < WINDOW_BATCHES * self.max_batch_size and budget > 0:
                window.append(self._pending.popleft())
                budget -= _item_cost(window[-1])
            window.sort(key=lambda item: -item.tokens.n_tokens)
            self._window.extend(window)
        batch: list[_Item] = []
        width = 0
        # The sorted window first, then (if the batch has room) the next newcomers: older texts go first.
        for source in (self._window, self._pending):
            while source and len(batch) < self.max_batch_size:
                n = _item_cost(source[0] if isinstance(source, deque) else source.peek())
                if batch and max(width, n) * (len(batch) + 1) > self.max_batch_tokens:
                    break
                batch.append(source.popleft())
                width = max(width, n)
            if self._window:
                break
        self._dequeued(batch)
        self._running_tokens = sum(_cost(item.tokens) for item in batch)
        self._running_since = time.perf_counter()
        self._m_batch_size.observe(len(batch))
        self._m_batch_tokens.observe(width * len(batch))
        if self.on_room is not None:
            self.on_room()
        return batch

    def _dequeued(self, items: list[_Item]) -> None:
        """``items`` left the queue (launched in a batch, or dropped with their request): the counts the bounds
        read no longer hold them."""
        self._queued -= len(items)
        for item in items:
            job = item.job
            cost = _item_cost(item)
            job.unlaunched -= 1
            self._queued_tokens -= cost
            self._queued_by[job.tenant] -= 1
            self._tokens_by[job.tenant] -= cost
            if job.unlaunched == 0:
                self._waiting_jobs -= 1
                self._waiting_by[job.tenant] -= 1
        for tenant in {item.job.tenant for item in items}:
            for counter in (self._queued_by, self._tokens_by, self._waiting_by):
                if counter[tenant] <= 0:  # a key with nothing queued is not one of the keys sharing the queue
                    del counter[tenant]
        self._queue_gauge.set(self._queued)

    def _deliver(self, batch: list[_Item], embeddings: np.ndarray, started: float, finished: float) -> None:
        seconds = finished - started
        self._m_inference.observe(seconds)
        # started..finished is busy wall-clock time: the next batch is launched after `finished` is taken,
        # so intervals never overlap, and `finished` is when the event loop got round to the result.
        self.throughput.update(sum(_cost(item.tokens) for item in batch), seconds)
        if _padded(batch) <= INLINE_BATCH_TOKENS:
            self._small_seconds.append(seconds)
        self._batch_id += 1
        for row, item in enumerate(batch):
            job = item.job
            job.out[item.row] = embeddings[row]
            if job.last_batch != self._batch_id:
                if job.last_batch < 0:
                    job.started_at = started
                job.last_batch = self._batch_id
                job.inference_time += seconds
                job.queue_time = max(job.queue_time, started - job.enqueued_at)
            job.remaining -= 1
            if job.remaining == 0 and not job.future.done():
                job.finished_at = finished
                job.future.set_result(job)

    def _fail(self, batch: list[_Item], err: BaseException) -> None:
        for item in batch:
            if not item.job.future.done():
                item.job.future.set_exception(err)

    def _fail_waiting(self, err: BaseException) -> None:
        waiting = [*self._running, *self._window, *self._pending.clear()]
        self._window.clear()
        self._queued = 0
        self._queued_tokens = 0
        self._running_tokens = 0
        self._waiting_jobs = 0
        for counter in (self._queued_by, self._tokens_by, self._waiting_by):
            counter.clear()
        self._queue_gauge.set(0)
        self._fail(waiting, err)


def _cost(tokens: Tokenized) -> int:
    return max(tokens.n_tokens, 1)


def _item_cost(item: _Item) -> int:
    return _cost(item.tokens)


def _padded(batch: list[_Item]) -> int:
    """Tokens of ``batch`` once padded to its longest text."""
    return max(map(_item_cost, batch)) * len(batch)
