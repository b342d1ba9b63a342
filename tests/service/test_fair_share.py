"""Capacity shared fairly between API keys: deficit round robin in the model queue, per-key bounds, and a line at
the admission that lets the key with the fewest requests in flight in first."""

from __future__ import annotations

import asyncio

import pytest

from service.backend.base import Tokenized
from service.engine.admission import Admission, Ticket
from service.engine.batcher import WINDOW_BATCHES, Batcher
from service.engine.fair import FairQueue
from service.errors import ErrorKind, ServiceError
from service.metrics import ServiceMetrics

FULL = ServiceError(ErrorKind.overloaded, "full", headers={"Retry-After": "1"})


def test_one_tenant_is_served_in_fifo_order():
    queue: FairQueue[int] = FairQueue(lambda item: 7, quantum=3)
    queue.extend("a", range(10))
    assert [queue.popleft() for _ in range(10)] == list(range(10)) and not queue


def test_a_flooding_tenant_gets_the_same_cost_per_round_as_a_small_one():
    queue: FairQueue[tuple[str, int]] = FairQueue(lambda item: 10, quantum=20)
    queue.extend("flood", [("flood", i) for i in range(1000)])
    queue.extend("small", [("small", i) for i in range(6)])
    first = [queue.popleft()[0] for _ in range(12)]
    assert first.count("small") == 6 and first.count("flood") == 6  # 2 items (20 of cost) each per turn
    assert len(queue) == 994 and queue.tenants() == ["flood"]


def test_costs_not_counts_are_shared():
    """A tenant of long texts gets as many tokens per round as one of short texts, so fewer texts."""
    queue: FairQueue[int] = FairQueue(lambda cost: cost, quantum=100)
    queue.extend("long", [100] * 50)
    queue.extend("short", [10] * 500)
    taken = [queue.popleft() for _ in range(220)]
    assert sum(c for c in taken if c == 100) == pytest.approx(sum(c for c in taken if c == 10), rel=0.1)


def test_peek_is_what_popleft_returns_and_an_emptied_tenant_keeps_no_credit():
    queue: FairQueue[str] = FairQueue(lambda item: 1, quantum=1)
    queue.extend("a", ["a1", "a2"])
    queue.extend("b", ["b1"])
    order = []
    while queue:
        peeked = queue.peek()
        order.append(queue.popleft())
        assert order[-1] == peeked
    assert order == ["a1", "b1", "a2"]
    with pytest.raises(IndexError):
        queue.peek()
    with pytest.raises(ValueError, match="quantum must be at least 1"):
        FairQueue(lambda item: 1, quantum=0)


class KeyedRoom:
    """Room for a key while it has fewer than ``limit`` requests in flight at the admission (a per-key bound)."""

    def __init__(self, gate_holder: list[Admission], limit: int) -> None:
        self.gate_holder = gate_holder
        self.limit = limit
        self.total_limit = 10**6

    def __call__(self, tenant: str) -> ServiceError | None:
        admission = self.gate_holder[0]
        if admission.in_flight >= self.total_limit:
            return FULL
        return FULL if admission.in_flight_by[tenant] >= self.limit else None


def test_the_key_with_fewer_requests_in_flight_is_let_in_first():
    async def run() -> list[str]:
        holder: list[Admission] = []
        room = KeyedRoom(holder, limit=10**6)
        room.total_limit = 4
        admission = Admission(room, hold_seconds=5, max_waiting=64)
        holder.append(admission)
        flood = [await admission.enter("flood") for _ in range(4)]  # the flood holds every slot
        assert all(isinstance(t, Ticket) for t in flood)
        order: list[str] = []

        async def request(key: str) -> None:
            ticket = await admission.enter(key)
            assert isinstance(ticket, Ticket)
            order.append(key)
            ticket.queued()

        waiting = [asyncio.create_task(request("flood")) for _ in range(5)]
        await asyncio.sleep(0.01)
        waiting.append(asyncio.create_task(request("small")))  # arrives last, after five of the flood
        await asyncio.sleep(0.01)
        assert admission.waiting == 6
        flood[0].done()  # one slot frees: the key with none in flight gets it, not the flood's oldest waiter
        await asyncio.sleep(0.01)
        assert order == ["small"]
        for ticket in flood[1:]:
            ticket.done()
        await asyncio.sleep(0.3)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return order

    assert asyncio.run(run())[:1] == ["small"]


def test_a_newcomer_of_a_quiet_key_is_not_held_behind_a_flooding_keys_line():
    async def run() -> None:
        holder: list[Admission] = []
        admission = Admission(KeyedRoom(holder, limit=2), hold_seconds=5, max_waiting=64)
        holder.append(admission)
        held = [await admission.enter("flood") for _ in range(2)]
        waiting = [asyncio.create_task(admission.enter("flood")) for _ in range(3)]  # over the flood's own bound
        await asyncio.sleep(0.01)
        assert admission.waiting == 3
        quiet = await asyncio.wait_for(admission.enter("quiet"), 1)  # straight in: its key is under its bound
        assert isinstance(quiet, Ticket) and not quiet.from_line and quiet.tenant == "quiet"
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        for ticket in [*held, quiet]:
            assert isinstance(ticket, Ticket)
            ticket.done()
        assert admission.in_flight == 0 and not admission.in_flight_by

    asyncio.run(run())


def test_a_full_line_gives_a_quiet_keys_request_the_place_of_the_floods_newest():
    async def run() -> None:
        holder: list[Admission] = []
        room = KeyedRoom(holder, limit=0)  # nobody gets in: everyone waits
        admission = Admission(room, hold_seconds=5, max_waiting=4)
        holder.append(admission)
        flood = [asyncio.create_task(admission.enter("flood")) for _ in range(4)]
        await asyncio.sleep(0.01)
        quiet = asyncio.create_task(admission.enter("quiet"))
        await asyncio.sleep(0.01)
        assert flood[-1].done() and flood[-1].result().kind is ErrorKind.overloaded  # the flood's newest, refused
        assert not quiet.done() and admission.waiting == 4
        assert await admission.enter("flood") is FULL  # the flood's line is the longest: its newcomer is refused
        for task in [*flood, quiet]:
            task.cancel()
        await asyncio.gather(*flood, quiet, return_exceptions=True)
        assert admission.waiting == 0

    asyncio.run(run())


def _tokens(n: int, length: int = 4) -> list[Tokenized]:
    return [Tokenized(list(range(length)), length, False) for _ in range(n)]


def _batcher(publish_fake, tmp_path, fake_backend_cls, **limits) -> Batcher:
    """A batcher whose loop is not started: what is queued stays queued, and `_next_batch` forms batches by hand."""
    backend = fake_backend_cls(publish_fake(tmp_path, "m", max_seq_length=64))
    values = {"max_batch_tokens": 64, "max_batch_size": 4, "max_queue_size": 4096} | limits
    return Batcher(backend, name="m", metrics=ServiceMetrics(), **values)


def test_the_queue_bound_is_shared_between_the_keys_queuing(publish_fake, tmp_path, fake_backend_cls):
    async def run() -> None:
        batcher = _batcher(publish_fake, tmp_path, fake_backend_cls, max_queue_size=8)
        batcher.submit(_tokens(8), "flood")  # alone, the flood may fill the queue
        assert batcher.refusal(1, "flood") is not None
        assert batcher.refusal(4, "quiet") is None  # half of the bound is the quiet key's share...
        batcher.submit(_tokens(4), "quiet")
        refused = batcher.refusal(1, "quiet")  # ...and no more
        assert refused is not None and "4 of this key's, its share 4" in refused.message

    asyncio.run(run())


def test_the_wait_bound_counts_what_fair_queuing_serves_first(publish_fake, tmp_path, fake_backend_cls):
    async def run() -> None:
        batcher = _batcher(publish_fake, tmp_path, fake_backend_cls, queue_wait_min_requests=1)
        batcher.throughput.update(100, 1.0)  # 100 tokens/s
        for _ in range(10):
            batcher.submit(_tokens(8, length=10), "flood")  # 800 tokens: 8 s to drain
        batcher.max_queue_wait_seconds = 1.0
        assert batcher.estimated_wait() == pytest.approx(8, rel=0.01)
        assert batcher.refusal(1, "flood") is not None
        batcher.submit(_tokens(2, length=10), "quiet")  # 20 tokens of its own, served beside 20 of the flood
        assert batcher.estimated_wait("quiet") == pytest.approx(0.4, rel=0.01)
        assert batcher.refusal(1, "quiet") is None

    asyncio.run(run())


def test_batches_interleave_the_keys_and_one_key_alone_is_fifo(publish_fake, tmp_path, fake_backend_cls):
    async def run() -> None:
        batcher = _batcher(publish_fake, tmp_path, fake_backend_cls)
        flood = [batcher.submit(_tokens(4, length=10), "flood") for _ in range(20)]
        quiet = batcher.submit(_tokens(4, length=10), "quiet")
        batches = [batcher._next_batch() for _ in range(6)]
        carried_quiet = [i for i, batch in enumerate(batches) if any(item.job is quiet for item in batch)]
        assert carried_quiet and carried_quiet[-1] <= 2  # in the first window, not after the flood's 80 texts
        assert [len(b) for b in batches] == [4] * 6
        assert batcher.queued == 84 - 24 and batcher._queued_by == {"flood": 60}
        alone = [job for batch in batches for item in batch for job in [item.job] if job is not quiet]
        assert alone == sorted(alone, key=flood.index)  # the flood's own texts in their order

    asyncio.run(run())


def test_a_key_arriving_after_a_window_of_long_texts_waits_only_a_few_batches(
    publish_fake, tmp_path, fake_backend_cls
):
    """The sort window holds a few batches' worth of tokens, not only of texts: long texts fill a batch's token
    budget with far fewer texts than ``max_batch_size``, and a window of ``WINDOW_BATCHES * max_batch_size`` texts
    made a key arriving just after it wait for many more batches of another key's (here 16, not 2 windows of 4)."""

    async def run() -> None:
        batcher = _batcher(publish_fake, tmp_path, fake_backend_cls, max_batch_tokens=256, max_batch_size=8)
        flood = batcher.submit(_tokens(64, length=64), "flood")  # 4 texts of 64 tokens fill a batch: 16 batches
        first = batcher._next_batch()
        quiet = batcher.submit(_tokens(1, length=10), "quiet")
        batches = [first] + [batcher._next_batch() for _ in range(16)]
        carried_quiet = [i for i, batch in enumerate(batches) if any(item.job is quiet for item in batch)]
        assert all(item.job is flood for item in first) and [len(batch) for batch in batches[:4]] == [4] * 4
        assert carried_quiet and carried_quiet[0] <= 2 * WINDOW_BATCHES, carried_quiet

    asyncio.run(run())
