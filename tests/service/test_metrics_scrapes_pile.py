"""Scrapes of /metrics that wait for the job store do not take the threads other requests tokenise in."""

from __future__ import annotations

import os
import threading

from fastapi.testclient import TestClient

from adapt_jobs.store import JobStore

STORE_SECONDS = 60.0  # the longest the job store takes to answer a scrape's count: until the texts were embedded
# More scrapes than the threads of the event loop's default executor (min(32, CPUs + 4)) that `asyncio.to_thread` uses
SCRAPES = min(32, (os.cpu_count() or 1) + 4) + 2
LONG_TEXT = "word " * 2000  # tokenised in a thread: more characters than the event loop tokenises itself


def test_scrapes_waiting_for_the_job_store_leave_threads_to_the_requests(tmp_path, make_app, monkeypatch):
    lock = threading.Lock()
    waiting, answered = threading.Condition(lock), threading.Event()
    counts = [0]
    count_by_state = JobStore.count_by_state

    def slow_count(store: JobStore) -> dict[str, int]:  # a store restarting, or its pool exhausted
        with lock:
            counts[0] += 1
            waiting.notify_all()
        answered.wait(STORE_SECONDS)
        return count_by_state(store)

    monkeypatch.setattr(JobStore, "count_by_state", slow_count)
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    entered = [0]

    @app.middleware("http")
    async def count_scrapes(request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path == "/metrics":
            with lock:
                entered[0] += 1
                waiting.notify_all()
        return await call_next(request)

    scraped: list[str] = []
    with TestClient(app) as client:
        scrapes = [threading.Thread(target=lambda: scraped.append(client.get("/metrics").text)) for _ in range(SCRAPES)]
        for scrape in scrapes:
            scrape.start()
        try:
            with lock:  # every scrape arrived, and one waits for the store
                assert waiting.wait_for(lambda: entered[0] == SCRAPES and counts[0] >= 1, 30)
            response = client.post("/embed", json={"inputs": [LONG_TEXT], "truncate": True})
            assert response.status_code == 200, response.text
            assert not scraped, "the texts were tokenised only once the store answered the scrapes"
        finally:
            answered.set()
            for scrape in scrapes:
                scrape.join()
    assert len(scraped) == SCRAPES
    assert all('embed_adapt_jobs{state="queued"} 0.0' in text for text in scraped)
