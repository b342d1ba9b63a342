"""Unloading a model (a newer version promoted, or shutdown) never holds the event loop the other models are served
on, even when a batch is still running after the grace period."""

from __future__ import annotations

import asyncio
import time

from service.engine.batcher import Batcher
from service.metrics import ServiceMetrics

BATCH_SECONDS = 1.5


def test_a_close_past_its_grace_period_waits_for_the_running_batch_off_the_event_loop(
    publish_fake, tmp_path, fake_backend_cls
):
    backend = fake_backend_cls(publish_fake(tmp_path, "m", delay_s=BATCH_SECONDS))

    async def run() -> float:
        batcher = Batcher(backend, name="m", metrics=ServiceMetrics(), max_batch_tokens=40, max_batch_size=1,
                          max_queue_size=100)  # fmt: skip
        batcher.start()
        jobs = [batcher.submit(backend.tokenize([text])) for text in ("in the model", "still queued")]
        await asyncio.sleep(0.05)  # the first batch is running
        gaps: list[float] = []

        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        await batcher.close(timeout=0.1)
        await asyncio.sleep(0.05)  # the ticker notes the gap the close left, if it left one
        ticker.cancel()
        await asyncio.gather(*(job.future for job in jobs), return_exceptions=True)
        assert backend.closed  # freed once the running batch returned
        return max(gaps)

    stalled = asyncio.run(run())
    assert stalled < BATCH_SECONDS / 3, f"the event loop stood still for {stalled:.2f} s"
