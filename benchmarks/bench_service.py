"""Service throughput and latency against the in-process ceiling and a naive server (issue 4's benchmark).

In one run, on the same ``minilm-l6`` fp32 bundle and fixed seeded workloads (2,000 short sentences of
8–20 words; 500 paragraphs of 120–200 words):

* **ceiling** — `export.runtime.OnnxBundle.encode` in this process at batch 32, same thread count as the
  server; and the in-process latency of one short text;
* **ours** — ``embedder serve`` in a subprocess, loaded by (a) 1-text requests at concurrency 32 and
  (b) 32-text requests at concurrency 8, plus (c) 1-text requests at concurrency 1 for idle latency;
* **naive** — FastAPI + sentence-transformers: one route calling ``model.encode`` in the thread pool
  (defined below, run in a subprocess), under the same loads.

The load generator (aiohttp, one event loop) runs in this process; its CPU use is reported because
it shares the machine's cores with the server. Results go to a JSON file and a Markdown table.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_service.py run --out benchmarks/results/service.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "minilm-l6"

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her it an were are which this be or have had "
    "one not but all they their there been has more when who will no if out so said what up its about into "
    "than them can only other new some could time these two may then first any my now such like our over man "
    "me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work "
    "long get here between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three city river market music house school water "
    "history model data system network energy light music story film game team player season company market "
    "price report study research result method analysis language text vector search query document answer"
)
_WORDS = _WORD_TEXT.split()


def workloads(seed: int = 0) -> tuple[list[str], list[str]]:
    """2,000 short sentences (8–20 words) and 500 paragraphs (120–200 words), seeded."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
        return " ".join(words).capitalize() + "."

    return [text(8, 20) for _ in range(2000)], [text(120, 200) for _ in range(500)]


# ----------------------------------------------------------------------------------------------- naive server
def naive_app():  # pragma: no cover - runs in the naive-server subprocess
    """The baseline: sentence-transformers `encode` in FastAPI's thread pool, default JSON responses."""
    from fastapi import FastAPI
    from fastapi.concurrency import run_in_threadpool
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    from training.catalog import resolve_model

    model = SentenceTransformer(str(resolve_model(MODEL)), device="cpu")
    app = FastAPI()

    class Request(BaseModel):
        input: str | list[str]
        model: str | None = None

    @app.post("/v1/embeddings")
    async def embeddings(body: Request) -> dict:
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = await run_in_threadpool(model.encode, texts, batch_size=32)
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return {"object": "list", "data": data, "model": MODEL}

    @app.get("/ready")
    async def ready() -> dict:
        return {"status": "ready"}

    return app


def serve_naive(port: int, threads: int) -> None:  # pragma: no cover - subprocess entry point
    import torch
    import uvicorn

    torch.set_num_threads(threads)
    uvicorn.run(naive_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ----------------------------------------------------------------------------------------------- load generator
@dataclass
class LoadResult:
    label: str
    texts: int
    requests: int
    errors: int
    seconds: float
    texts_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    loadgen_cpu_cores: float  # CPU seconds of the load generator per wall second


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


async def _load(url: str, batches: list[list[str]], concurrency: int, label: str) -> LoadResult:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    queue = list(enumerate(batches))
    queue.reverse()
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    payloads = [json.dumps({"input": b, "model": MODEL, "encoding_format": "float"}).encode() for b in batches]

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal errors
            while queue:
                index, _ = queue.pop()
                started = time.perf_counter()
                async with session.post(
                    f"{url}/v1/embeddings", data=payloads[index], headers={"content-type": "application/json"}
                ) as response:
                    await response.read()
                    if response.status != 200:
                        errors += 1
                latencies.append(time.perf_counter() - started)

        cpu0, wall0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    texts = sum(len(b) for b in batches)
    return LoadResult(
        label=label, texts=texts, requests=len(batches), errors=errors, seconds=round(wall, 2),
        texts_per_s=round(texts / wall, 1), p50_ms=round(_pct(latencies, 0.5), 2),
        p95_ms=round(_pct(latencies, 0.95), 2), p99_ms=round(_pct(latencies, 0.99), 2),
        loadgen_cpu_cores=round(cpu / wall, 2),
    )  # fmt: skip


def _chunks(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {url} not ready after {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_loads(url: str, name: str, short: list[str], paragraphs: list[str], idle_requests: int) -> list[LoadResult]:
    results = []
    asyncio.run(_load(url, _chunks(short[:64], 1), 8, "warm-up"))
    results.append(asyncio.run(_load(url, _chunks(short, 1), 32, f"{name} (a) short, 1 text/request, c=32")))
    results.append(asyncio.run(_load(url, _chunks(short, 32), 8, f"{name} (b) short, 32 texts/request, c=8")))
    results.append(asyncio.run(_load(url, _chunks(paragraphs, 1), 32, f"{name} (a) paragraphs, 1 text/request, c=32")))
    results.append(asyncio.run(_load(url, _chunks(paragraphs, 32), 8, f"{name} (b) paragraphs, 32 texts/request, c=8")))
    results.append(
        asyncio.run(_load(url, _chunks(short[:idle_requests], 1), 1, f"{name} (c) short, 1 text/request, c=1"))
    )
    for result in results:
        print(json.dumps(asdict(result)), flush=True)
    return results


# ----------------------------------------------------------------------------------------------- ceiling
def ceiling(bundle_dir: Path, threads: int, short: list[str], paragraphs: list[str]) -> dict[str, float]:
    from export.runtime import OnnxBundle

    bundle = OnnxBundle(bundle_dir, intra_op_threads=threads)
    bundle.encode(short[:64], batch_size=32)
    out: dict[str, float] = {}
    for label, texts in (("short", short), ("paragraphs", paragraphs)):
        started = time.perf_counter()
        bundle.encode(texts, batch_size=32)
        out[f"{label}_texts_per_s"] = round(len(texts) / (time.perf_counter() - started), 1)
    single = []
    for text in short[:200]:
        started = time.perf_counter()
        bundle.encode([text])
        single.append(time.perf_counter() - started)
    out["single_text_p50_ms"] = round(statistics.median(single) * 1000, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="measure ceiling, our server and the naive server")
    run.add_argument("--registry", type=Path, default=ROOT / "registry", help="registry holding minilm-l6")
    run.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    run.add_argument("--idle-requests", type=int, default=300, help="requests of the concurrency-1 run")
    run.add_argument("--skip-naive", action="store_true", help="only the ceiling and our server")
    run.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    naive = sub.add_parser("naive-server", help="(internal) run the naive baseline server")
    naive.add_argument("--port", type=int, required=True)
    naive.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)

    if args.command == "naive-server":
        serve_naive(args.port, args.threads)
        return 0

    from export import registry

    if registry.current_version(args.registry, MODEL) is None:
        subprocess.run(
            [sys.executable, "-m", "embedder.cli", "export", MODEL, "--name", MODEL, "--registry", str(args.registry),
             "--promote"], check=True,
        )  # fmt: skip
    short, paragraphs = workloads()
    report: dict[str, object] = {"threads": args.threads, "cpus": os.cpu_count()}
    report["ceiling"] = ceiling(registry.current_bundle(args.registry, MODEL), args.threads, short, paragraphs)
    print(json.dumps(report["ceiling"]), flush=True)

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    port = _free_port()
    ours = subprocess.Popen(
        [sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(args.registry), "--port", str(port),
         "--models", MODEL, "--default-model", MODEL, "--intra-op-threads", str(args.threads),
         "--no-adapt-enabled", "--no-adapt-supervise-worker", "--log-level", "warning",
         "--registry-poll-seconds", "0"],
        env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        _wait_ready(f"http://127.0.0.1:{port}", ours)
        report["ours"] = [asdict(r) for r in run_loads(f"http://127.0.0.1:{port}", "ours", short, paragraphs,
                                                        args.idle_requests)]  # fmt: skip
    finally:
        _stop(ours)

    if not args.skip_naive:
        port = _free_port()
        naive_proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "naive-server", "--port", str(port),
             "--threads", str(args.threads)], env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            _wait_ready(f"http://127.0.0.1:{port}", naive_proc)
            report["naive"] = [asdict(r) for r in run_loads(f"http://127.0.0.1:{port}", "naive", short, paragraphs,
                                                             args.idle_requests)]  # fmt: skip
        finally:
            _stop(naive_proc)

    print(markdown(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def markdown(report: dict) -> str:
    """The BENCHMARKS.md table plus the target checks."""
    ceil = report["ceiling"]
    rows = ["| run | texts/s | × ceiling | p50 ms | p95 ms | p99 ms | errors | load-gen CPU (cores) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    rows.append(f"| ceiling: in-process onnxruntime, short, batch 32 | {ceil['short_texts_per_s']} | 1.00 | | | | | |")
    rows.append(
        f"| ceiling: in-process onnxruntime, paragraphs, batch 32 | {ceil['paragraphs_texts_per_s']} | 1.00 | | | | | |"
    )
    rows.append(f"| in-process single short text | | | {ceil['single_text_p50_ms']} | | | | |")
    for result in report.get("ours", []) + report.get("naive", []):
        base = ceil["paragraphs_texts_per_s"] if "paragraphs" in result["label"] else ceil["short_texts_per_s"]
        rows.append(
            f"| {result['label']} | {result['texts_per_s']} | {result['texts_per_s'] / base:.2f} | {result['p50_ms']} "
            f"| {result['p95_ms']} | {result['p99_ms']} | {result['errors']} | {result['loadgen_cpu_cores']} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
