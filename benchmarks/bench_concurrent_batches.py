"""One batch at a time on every thread (what the server runs) against as many batches at once as there are threads,
each on one thread of its own engine, in process, per engine that keeps the parity bars on this CPU.

The server's batcher runs one forward pass per model at a time with ``intra_op_threads`` threads. On a 2-core
machine a small batch's operators may not split well over two threads; two batches at once, one thread each, would
then carry more texts per second under load. The batches are bench_routes' (`served_batches`: 8-64 short texts, as
many paragraphs as fit the server's token budget); each arm runs the same `REPEATS` copies of a batch, one after
another or shared out between the threads, in rounds whose arm order alternates. OpenVINO engines get a third arm,
its own way of running batches at once: one compiled model with a stream per thread (``NUM_STREAMS``), an infer
request per stream — two compiled models of one thread each may be pinned to the same core. Printed: the CPU, and
per engine and batch each arm's median texts/s and its ratio to one at a time (above 1: batches at once carry more).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_concurrent_batches.py --bundle state/registry/minilm-l6/current
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from bench_routes import served_batches
from bench_service import server_spinning
from bundle_args import bundle_arguments
from report_file import write_report

from core.engine_choice import BY_NAME
from core.engines import load_engine, open_routes
from core.runtime import OUTPUT_NAME, OnnxBundle, cpu_text, graph_files

ENGINES = ("onnxruntime-int8", "openvino-int8", "openvino-bf16")  # the served ones; the f32 engines are slower alone
REPEATS = 8  # copies of a batch per timing, so each thread of the concurrent arm has several to run


def sequential(engine: OnnxBundle, feed: dict[str, np.ndarray], repeats: int) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        engine.run(feed)
    return repeats * feed["input_ids"].shape[0] / (time.perf_counter() - started)


def concurrent(engines: list[Any], feed: dict[str, np.ndarray], repeats: int) -> float:
    shares = [len(range(i, repeats, len(engines))) for i in range(len(engines))]

    def work(engine: OnnxBundle, count: int) -> None:
        for _ in range(count):
            engine.run(feed)

    threads = [threading.Thread(target=work, args=pair) for pair in zip(engines, shares, strict=True)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return repeats * feed["input_ids"].shape[0] / (time.perf_counter() - started)


class _Streams:
    """An OpenVINO engine of the bundle compiled with ``streams`` streams; `requests` runs on one of them each."""

    def __init__(self, bundle: OnnxBundle, name: str, streams: int) -> None:
        import openvino as ov

        engine = BY_NAME[name]
        config = {"INFERENCE_PRECISION_HINT": engine.inference_precision, "INFERENCE_NUM_THREADS": streams,
                  "NUM_STREAMS": streams, "PERFORMANCE_HINT": "THROUGHPUT"}  # fmt: skip
        file = bundle.path / graph_files(bundle.manifest)[engine.graph]
        compiled = ov.Core().compile_model(str(file), "CPU", config)
        self.output = compiled.output(OUTPUT_NAME)
        self.requests = [compiled.create_infer_request() for _ in range(streams)]

    def engines(self) -> list[Any]:
        return [_Request(request, self.output) for request in self.requests]


class _Request:
    def __init__(self, request: Any, output: Any) -> None:
        self.request, self.output = request, output

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return np.array(self.request.infer(feeds)[self.output], copy=True)


def main(argv: list[str] | None = None) -> int:
    args = bundle_arguments(__doc__, 5, argv)
    if args.threads < 2:
        raise SystemExit("needs at least 2 threads: with one there is nothing to share out")
    spinning = server_spinning()
    _, choice = load_engine(args.bundle, intra_op_threads=args.threads, spinning=spinning)
    print(f"CPU: {cpu_text(choice.cpu)}, {args.threads} threads", flush=True)
    passed = [trial.engine for trial in choice.trials if trial.status == "passed" and trial.engine in ENGINES]
    rows: list[dict[str, Any]] = []
    for name in passed:
        whole = open_routes(args.bundle, [(name, [])], intra_op_threads=args.threads, spinning=spinning)
        singles = [
            open_routes(args.bundle, [(name, [])], intra_op_threads=1, spinning=spinning) for _ in range(args.threads)
        ]
        arms: dict[str, Callable[[dict[str, np.ndarray], int], float]] = {
            "one at a time": partial(sequential, whole),
            f"{args.threads} at once": partial(concurrent, singles),
        }
        if whole.runtime == "openvino":
            streams = _Streams(whole, name, args.threads).engines()
            arms[f"{args.threads} streams"] = partial(concurrent, streams)
        feeds = {batch: whole.pad(whole.tokenize(texts)) for batch, texts in served_batches(whole).items()}
        for batch, feed in feeds.items():
            samples: dict[str, list[float]] = {arm: [] for arm in arms}
            for round_ in range(args.rounds + 1):
                for arm in list(arms) if round_ % 2 else list(arms)[::-1]:
                    speed = arms[arm](feed, REPEATS)
                    if round_:  # round 0 warms up (OpenVINO compiles each new shape on first use)
                        samples[arm].append(speed)
            speeds = {arm: round(statistics.median(values), 1) for arm, values in samples.items()}
            base = speeds["one at a time"]
            rows.append({"engine": name, "batch": batch, "texts_per_s": speeds})
            cells = "  ".join(f"{arm} {speed:7.1f}/s ({speed / base:.2f}x)" for arm, speed in speeds.items())
            print(f"{name:16s} {batch:16s} {cells}", flush=True)
    write_report(args.out, {"cpu": choice.cpu, "threads": args.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
