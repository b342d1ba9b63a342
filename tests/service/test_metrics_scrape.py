"""A /metrics scrape on the main port does not hold the event loop: its collectors may read the adapt job store."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from adapt_jobs.store import JobStore

STORE_SECONDS = 30.0  # the longest the job store takes to answer the scrape's count: until /health was answered


def test_a_scrape_waiting_for_the_job_store_does_not_stall_other_requests(tmp_path, make_app, monkeypatch):
    counting, answered = threading.Event(), threading.Event()
    count_by_state = JobStore.count_by_state

    def slow_count(store: JobStore) -> dict[str, int]:  # a store restarting, or its pool exhausted
        counting.set()
        answered.wait(STORE_SECONDS)
        return count_by_state(store)

    monkeypatch.setattr(JobStore, "count_by_state", slow_count)
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    scraped: list[str] = []
    with TestClient(app) as client:
        scrape = threading.Thread(target=lambda: scraped.append(client.get("/metrics").text))
        scrape.start()
        assert counting.wait(10)
        try:
            assert client.get("/health").status_code == 200
            # answered while the store had not answered the scrape: a scrape holding the event loop would have let
            # /health through only once the count returned, STORE_SECONDS later
            assert not scraped, "/health waited for the scrape"
        finally:
            answered.set()
            scrape.join()
    assert 'embed_adapt_jobs{state="queued"} 0.0' in scraped[0]
