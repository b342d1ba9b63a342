"""Unloading a model (a newer version promoted, or shutdown) never holds the event loop the other models are served
on, even when a batch is still running after the grace period."""

from __future__ import annotations

import asyncio
import threading
import time

from service.engine.batcher import Batcher
from service.metrics import ServiceMetrics

HELD_SECONDS = 30.0  # the longest the running batch lasts: until the test lets it end


def test_a_close_past_its_grace_period_waits_for_the_running_batch_off_the_event_loop(
    publish_fake, tmp_path, fake_backend_cls
):
    backend = fake_backend_cls(publish_fake(tmp_path, "m"))
    embed, running, release = backend.embed, threading.Event(), threading.Event()

    def held(batch):
        running.set()
        release.wait(HELD_SECONDS)
        return embed(batch)

    backend.embed = held

    async def run() -> bool:
        batcher = Batcher(backend, name="m", metrics=ServiceMetrics(), max_batch_tokens=40, max_batch_size=1,
                          max_queue_size=100)  # fmt: skip
        batcher.start()
        jobs = [batcher.submit(backend.tokenize([text])) for text in ("in the model", "still queued")]
        closing = None
        try:
            deadline = time.monotonic() + HELD_SECONDS
            while not running.is_set() and time.monotonic() < deadline:  # the first batch is running
                await asyncio.sleep(0.01)
            closing = asyncio.create_task(batcher.close(timeout=0.1))
            while not jobs[1].future.done() and time.monotonic() < deadline:  # past the grace: the queued text failed
                await asyncio.sleep(0.01)
            # the event loop runs this while the batch is still held: a close that waited for it on the loop would
            # have returned first, once the batch ended HELD_SECONDS later
            off_the_loop = jobs[1].future.done() and not closing.done()
        finally:
            release.set()
        await closing
        await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)
        assert backend.closed  # freed once the running batch returned
        return off_the_loop

    assert asyncio.run(run()), "the close held the event loop until the running batch returned"
