"""bench_concurrent_batches shares a batch's copies out between its engines, each on a thread of its own."""

from __future__ import annotations

import threading

import numpy as np

from tests.benchmark_scripts import load_script


class _Counting:
    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        self.threads.append(threading.current_thread())  # an ident may be reused once a thread ends
        return np.zeros((feeds["input_ids"].shape[0], 4), dtype=np.float32)


def test_concurrent_runs_every_copy_once_each_engine_on_its_own_thread() -> None:
    script = load_script("bench_concurrent_batches")
    engines = [_Counting(), _Counting()]
    feed = {"input_ids": np.ones((3, 5), dtype=np.int64)}
    speed = script.concurrent(engines, feed, repeats=5)
    assert [len(e.threads) for e in engines] == [3, 2]
    assert len({t for e in engines for t in e.threads}) == 2 and threading.main_thread() not in engines[0].threads
    assert speed > 0
    sequential = _Counting()
    assert script.sequential(sequential, feed, repeats=5) > 0 and len(sequential.threads) == 5
