"""The batching engine: token budget, count cap, length sorting, FIFO fairness, no wait when idle, 429s."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from service.engine import batcher as batcher_module
from service.engine.batcher import Batcher
from service.engine.throughput import Throughput
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics


def _batcher(backend, **limits) -> Batcher:
    values = {"max_batch_tokens": 40, "max_batch_size": 4, "max_queue_size": 100} | limits
    return Batcher(backend, name=backend.info.name, metrics=ServiceMetrics(), **values)


def _text(n_tokens: int, word: str = "w") -> str:
    return " ".join(f"{word}{i}" for i in range(n_tokens - 2))  # + [CLS] [SEP]


def test_batches_respect_budget_and_cap_and_sort_by_length(publish_fake, tmp_path, fake_backend_cls):
    bundle = publish_fake(tmp_path, "m", max_seq_length=64, delay_s=0.05)
    backend = fake_backend_cls(bundle)
    lengths = [3, 12, 5, 20, 4, 9, 15, 3, 7, 11, 6, 18]

    async def run() -> list:
        batcher = _batcher(backend)
        batcher.start()
        first = batcher.submit(backend.tokenize([_text(5)]))
        await asyncio.sleep(0.01)  # the first text runs alone while the rest queue up
        jobs = [batcher.submit(backend.tokenize([_text(n)])) for n in lengths]
        await asyncio.gather(first.future, *(job.future for job in jobs))
        await batcher.close(timeout=5)
        return jobs

    jobs = asyncio.run(run())
    assert backend.batches[0] == [5]
    rest = backend.batches[1:]
    assert sorted(n for batch in rest for n in batch) == sorted(lengths)
    for batch in rest:
        assert len(batch) <= 4 and max(batch) * len(batch) <= 40, batch
        assert batch == sorted(batch, reverse=True), batch
    assert len(rest) >= 4  # 12 texts under a cap of 4 and a budget of 40 tokens
    # results land in the right rows
    for job, n in zip(jobs, lengths, strict=True):
        expected = backend.embed(backend.tokenize([_text(n)]))[0]
        np.testing.assert_allclose(job.out[0], expected, atol=1e-6)
    assert backend.closed


def test_one_request_larger_than_a_batch_keeps_its_row_order(publish_fake, tmp_path, fake_backend_cls):
    bundle = publish_fake(tmp_path, "m", max_seq_length=64)
    backend = fake_backend_cls(bundle)
    texts = [_text(3 + (i * 7) % 17, word=f"t{i}_") for i in range(23)]

    async def run() -> np.ndarray:
        batcher = _batcher(backend)
        batcher.start()
        job = batcher.submit(backend.tokenize(texts))
        await job.future
        await batcher.close(timeout=5)
        return job.out

    out = asyncio.run(run())
    assert len(backend.batches) >= 6
    alone = np.stack([backend.embed(backend.tokenize([t]))[0] for t in texts])
    np.testing.assert_allclose(out, alone, atol=1e-6)


def test_idle_request_starts_at_once(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m"))

    async def run() -> int:
        batcher = _batcher(backend)
        batcher.start()
        await asyncio.sleep(0.01)
        job = batcher.submit(backend.tokenize(["hello"]))
        # one turn of the event loop, in which no time need pass: the loop woken by the text launches it then,
        # without waiting for a batch to fill (a time bound instead would hold on a quiet machine only)
        await asyncio.sleep(0)
        unlaunched = job.unlaunched
        await job.future
        await batcher.close(timeout=5)
        return unlaunched

    assert asyncio.run(run()) == 0


def test_a_lone_small_batch_runs_on_the_event_loop_while_small_batches_are_fast(
    publish_fake, tmp_path, fake_backend_cls, monkeypatch
):
    monkeypatch.setattr(batcher_module, "INLINE_BATCH_SECONDS", 0.2)  # the rule, not this machine's speed
    history = batcher_module.INLINE_HISTORY

    class Recording(fake_backend_cls):
        runs_small_batches_inline = True

        def embed(self, batch):
            self.threads.append((len(batch), threading.current_thread().name))
            return super().embed(batch)

    backend = Recording(publish_fake(tmp_path, "m", max_seq_length=64))
    backend.threads = []

    async def lone(n: int) -> None:
        for _ in range(n):
            await batcher.submit(backend.tokenize([_text(5)])).future

    async def run() -> None:
        nonlocal batcher
        batcher = _batcher(backend)
        batcher.start()
        await lone(history + 2)  # the first ones build the history on the inference thread
        jobs = [batcher.submit(backend.tokenize([_text(5)])) for _ in range(6)]  # a queue: never on the loop
        await asyncio.gather(*(job.future for job in jobs))
        backend.delay_s = 0.3  # a slow small batch (run on the loop, as the history said it would be fast) ...
        await lone(1)
        backend.delay_s = 0.0
        await lone(history + 1)  # ... sends the next ones back to the thread until it leaves the history
        await batcher.close(timeout=5)

    batcher: Batcher | None = None
    asyncio.run(run())
    on_loop = [thread == threading.main_thread().name for _, thread in backend.threads]
    assert on_loop[:history] == [False] * history and on_loop[history : history + 2] == [True, True]
    queued = backend.threads[history + 2 : history + 4]
    assert [n for n, _ in queued] == [4, 2] and all(t.startswith("infer-") for _, t in queued)
    assert on_loop[history + 4 :] == [True] + [False] * history + [True]


def test_a_batch_that_fails_on_the_event_loop_fails_its_requests_only(
    publish_fake, tmp_path, fake_backend_cls, monkeypatch
):
    monkeypatch.setattr(batcher_module, "INLINE_BATCH_SECONDS", 0.2)

    class Inline(fake_backend_cls):
        runs_small_batches_inline = True

    backend = Inline(publish_fake(tmp_path, "m", max_seq_length=64, fail_word="boom"))

    async def run() -> tuple[BaseException | None, int]:
        batcher = _batcher(backend)
        batcher.start()
        for _ in range(batcher_module.INLINE_HISTORY):
            await batcher.submit(backend.tokenize([_text(5)])).future
        failed = batcher.submit(backend.tokenize(["boom"]))
        error = await asyncio.gather(failed.future, return_exceptions=True)
        after = await batcher.submit(backend.tokenize([_text(4)])).future
        await batcher.close(timeout=5)
        return error[0], after.out.shape[0]

    error, rows = asyncio.run(run())
    assert isinstance(error, RuntimeError) and rows == 1


def test_full_queue_rejects_at_once_with_retry_after(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", delay_s=0.05))

    async def run() -> ServiceError:
        batcher = _batcher(backend, max_queue_size=5)
        batcher.start()
        running = batcher.submit(backend.tokenize(["a"]))
        await asyncio.sleep(0.01)  # the first batch is running; the queue is empty
        waiting = batcher.submit(backend.tokenize(["b"] * 5))
        with pytest.raises(ServiceError) as info:
            batcher.submit(backend.tokenize(["c"]))
        await asyncio.gather(running.future, waiting.future)
        await batcher.close(timeout=5)
        return info.value

    err = asyncio.run(run())
    assert err.kind is ErrorKind.overloaded and "5 texts queued, limit 5" in err.message
    assert int(err.headers["Retry-After"]) >= 1


def test_flood_against_a_tiny_queue_gets_429s_and_no_other_errors(make_app, serve):
    app = make_app(max_queue_size=3, max_batch_size=2, max_client_batch_size=2)

    async def flood(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(
                *(client.post("/embed", json={"inputs": [f"text {i}", "two"]}) for i in range(40))
            )

    with serve(app) as (url, _):
        for backend in app.state.engine.models.models():
            backend.backend.delay_s = 0.02
        started = time.perf_counter()
        responses = asyncio.run(flood(url))
        elapsed = time.perf_counter() - started
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(429) >= 10 and statuses.count(200) >= 1
        rejected = next(r for r in responses if r.status_code == 429)
        assert rejected.json()["error"]["code"] == "queue_full" and int(rejected.headers["retry-after"]) >= 1
        assert elapsed < 20
        metrics = httpx.get(f"{url}/metrics").text
        line = 'embed_request_failures_total{error_type="queue_full",model="fake-a",route="/embed"}'
        assert f"{line} {float(statuses.count(429))}" in metrics


def test_throughput_is_tokens_over_busy_seconds_and_follows_a_new_workload():
    steady = Throughput(horizon_seconds=math.inf)
    steady.update(1280, 0.1)  # a full batch: 12,800 tokens/s
    steady.update(1, 0.01)  # a lone short text: 100 tokens/s
    assert steady.tokens_per_second == pytest.approx(1281 / 0.11)  # not the mean of the two rates (6,450)

    recent = Throughput(horizon_seconds=2.0)
    assert recent.tokens_per_second is None  # cold start: unknown, not zero
    for _ in range(100):
        recent.update(100, 0.1)  # 10 s at 1,000 tokens/s
    for _ in range(100):
        recent.update(10, 0.1)  # then 10 s at 100 tokens/s
    assert recent.tokens_per_second == pytest.approx(100, rel=0.1)


def test_the_loop_feeds_the_throughput_with_busy_time(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", max_seq_length=64, delay_s=0.02))

    async def run() -> tuple[float, Throughput]:
        batcher = _batcher(backend)
        batcher.throughput = Throughput(horizon_seconds=math.inf)
        batcher.start()
        started = time.perf_counter()
        jobs = [batcher.submit(backend.tokenize([_text(3 + i % 7)] * 3)) for i in range(6)]
        await asyncio.gather(*(job.future for job in jobs))
        elapsed = time.perf_counter() - started
        await batcher.close(timeout=5)
        return elapsed, batcher.throughput

    elapsed, throughput = asyncio.run(run())
    assert throughput.batches == len(backend.batches)
    assert throughput.tokens == sum(n for batch in backend.batches for n in batch)
    assert 0.02 * len(backend.batches) <= throughput.seconds <= elapsed


def test_wait_bound_rejects_when_the_queue_ahead_would_take_too_long(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", max_seq_length=64))

    async def run() -> ServiceError:
        batcher = _batcher(backend, max_queue_wait_seconds=1.0)  # not started: nothing drains
        batcher.throughput.update(100, 1.0)  # 100 tokens/s
        batcher.submit(backend.tokenize([_text(30)] * 2))  # 0.6 s of work queued
        batcher.submit(backend.tokenize([_text(30)] * 2))  # ahead of it 0.6 s <= 1 s: accepted, 1.2 s queued
        assert batcher.estimated_wait() == pytest.approx(1.2)
        with pytest.raises(ServiceError) as info:
            batcher.submit(backend.tokenize([_text(3)]))
        assert batcher.queued == 4  # the count bound (100 texts) is far away
        await batcher.close(timeout=5)
        return info.value

    err = asyncio.run(run())
    assert err.kind is ErrorKind.overloaded
    assert "the 2 requests queued ahead would take about 1.2 s, limit 1 s" in err.message
    assert err.headers["Retry-After"] == "2"  # the queue drains in 1.2 s


def test_wait_bound_admits_what_the_count_bound_admits_when_cold_idle_or_off(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", max_seq_length=64))

    async def run() -> ServiceError:
        cold = _batcher(backend, max_queue_wait_seconds=0.001, max_queue_size=10)
        for _ in range(5):
            cold.submit(backend.tokenize([_text(30)] * 2))  # no throughput known: count bound only
        with pytest.raises(ServiceError) as info:
            cold.submit(backend.tokenize([_text(3)]))
        slow = _batcher(backend, max_queue_wait_seconds=0.001)
        slow.throughput.update(1, 1.0)  # 1 token/s
        slow.submit(backend.tokenize([_text(60)] * 8))  # nothing queued ahead: a big request still gets in
        off = _batcher(backend, max_queue_wait_seconds=0.0)
        off.throughput.update(1, 1.0)
        for _ in range(5):
            off.submit(backend.tokenize([_text(60)] * 8))
        for batcher in (cold, slow, off):
            await batcher.close(timeout=5)
        return info.value

    err = asyncio.run(run())
    assert "10 texts queued, limit 10" in err.message and err.headers["Retry-After"] == "1"


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        await asyncio.sleep(0.01)


def test_wait_bound_429_comes_before_tokenising_and_is_counted(make_app, serve):
    app = make_app(max_queue_wait_seconds=1.0, queue_wait_min_requests=1, overload_hold_seconds=0)
    running_batch, release = threading.Event(), threading.Event()

    async def traffic(url: str) -> tuple[httpx.Response, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            running = asyncio.create_task(client.post("/embed", json={"inputs": ["runs first"]}))
            await _until(running_batch.is_set, "the first request's batch running")  # it holds the model ...
            queued = asyncio.create_task(client.post("/embed", json={"inputs": ["queued next"]}))
            await _until(lambda: served.batcher.queued == 1, "the second request queued")
            try:
                rejected = await client.post("/embed", json={"inputs": ["turned away"]})
            finally:
                release.set()  # ... until the third is answered
            return rejected, list(await asyncio.gather(running, queued))

    with serve(app) as (url, _):
        served = app.state.engine.models.get("fake-a")
        embed = served.backend.embed

        def held(batch):
            if not running_batch.is_set():
                running_batch.set()
                release.wait(30)
            return embed(batch)

        served.backend.embed = held
        served.batcher.throughput.update(1, 1.0)  # 1 token/s: anything queued ahead is too long a wait
        tokenized: list[str] = []
        tokenize = served.backend.tokenize
        served.backend.tokenize = lambda texts, *how: tokenized.extend(texts) or tokenize(texts, *how)
        rejected, accepted = asyncio.run(traffic(url))
        metrics = httpx.get(f"{url}/metrics").text
    assert [r.status_code for r in accepted] == [200, 200]
    assert rejected.status_code == 429 and rejected.json()["error"]["code"] == "queue_full"
    assert "limit 1 s" in rejected.json()["error"]["message"] and int(rejected.headers["retry-after"]) >= 4
    assert "turned away" not in tokenized and "queued next" in tokenized
    # fake-b has room, so the gate let it in (it could have named fake-b); fake-a refused it once the body said so
    line = 'embed_request_failures_total{error_type="queue_full",model="fake-a",route="/embed"}'
    assert f"{line} 1.0" in metrics


def test_close_fails_what_cannot_finish_within_the_grace_period(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m"))
    embed, release = backend.embed, threading.Event()

    def held(batch):  # the batch in the model outlasts the grace period, however slowly the test runs
        release.wait(30)
        return embed(batch)

    backend.embed = held

    async def run() -> tuple[BaseException | None, BaseException | None]:
        batcher = _batcher(backend, max_batch_size=1)
        batcher.start()
        running = batcher.submit(backend.tokenize(["in the model"]))
        await asyncio.sleep(0.05)
        waiting = batcher.submit(backend.tokenize(["still queued"]))
        closing = asyncio.create_task(batcher.close(timeout=0.1))
        try:
            done, _ = await asyncio.wait([running.future, waiting.future], timeout=5)
        finally:
            release.set()
        await closing
        with pytest.raises(ServiceError, match="being unloaded"):
            batcher.submit(backend.tokenize(["too late"]))
        assert len(done) == 2  # nobody is left waiting forever
        return running.future.exception(), waiting.future.exception()

    first, second = asyncio.run(run())
    for err in (first, second):
        assert isinstance(err, ServiceError) and err.kind is ErrorKind.shutting_down
    assert backend.closed


def test_the_wait_bound_spares_the_first_requests_whatever_their_size(publish_fake, tmp_path, fake_backend_cls):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", max_seq_length=64))

    async def run() -> ServiceError:
        batcher = _batcher(backend, max_queue_wait_seconds=0.1, queue_wait_min_requests=3)  # not started
        batcher.throughput.update(10, 1.0)  # 10 tokens/s: one 60-token request is 6 s of work
        for _ in range(3):  # 0, 1, then 2 requests ahead: fewer than 3, so the 0.1 s bound does not apply
            batcher.submit(backend.tokenize([_text(60)]))
        assert batcher.waiting_requests == 3 and batcher.estimated_wait() == pytest.approx(18)
        with pytest.raises(ServiceError) as info:
            batcher.submit(backend.tokenize([_text(3)]))  # 3 requests ahead and 18 s of work
        await batcher.close(timeout=0.1)
        return info.value

    err = asyncio.run(run())
    assert "the 3 requests queued ahead would take about 18.0 s, limit 0.1 s" in err.message


def test_a_few_bulk_clients_are_served_whole_on_a_model_far_slower_than_the_wait_bound(make_app, serve):
    """Eight clients sending big requests back to back: each waits behind at most seven requests of the others, so the
    default request floor admits every one, however long that work takes (here 0.8 s ahead against a 0.05 s bound);
    with the floor at 1 the same load is turned away."""

    async def clients(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def one(i: int) -> list[int]:
                statuses = []
                for k in range(3):
                    texts = [f"client {i} request {k} text {j}" for j in range(8)]
                    statuses.append((await client.post("/embed", json={"inputs": texts})).status_code)
                return statuses

            return [status for statuses in await asyncio.gather(*(one(i) for i in range(8))) for status in statuses]

    statuses = {}
    for floor in (16, 1):
        app = make_app(max_queue_wait_seconds=0.05, queue_wait_min_requests=floor, overload_hold_seconds=0)
        with serve(app) as (url, _):
            app.state.engine.models.get("fake-a").backend.delay_s = 0.05  # one batch of 8 texts: 0.05 s
            statuses[floor] = asyncio.run(clients(url))
    assert statuses[16] == [200] * 24
    assert 429 in statuses[1]
