"""/v1/embeddings latency on one replica with and without large /adapt uploads in flight.

One ``embedder serve`` process (``minilm-l6``, default settings, /adapt on without a worker of its own, so nothing
trains) is loaded by ``--clients`` closed loops, each posting one short text to /v1/embeddings, reading the answer and
posting the next, for ``--seconds``. In the **uploads** arm one more client posts large corpora to /adapt back to back
meanwhile, each job cancelled at once (which deletes its corpus): a JSON body of ``--documents`` documents (~40 MB)
and the same documents as a multipart Parquet file (~40 MB once decoded). The **quiet** arm is the same load alone.
The arms alternate round by round (quiet, uploads, uploads, quiet, ...) so a drift of the shared machine hits both.

Prints each arm's client-side p50/p99 over all rounds, the uploads answered and their mean time, and the p99
difference (uploads − quiet); the target is at most +50 ms.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_uploads.py --registry /tmp/b/registry --rounds 4 \\
        --out runs/bench_uploads.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from bench_overload import check_run_args
from bench_service import MODEL, ROOT, _free_port, _pct, _stop, _wait_ready, workloads
from report_file import write_report

from core.runtime import cpu_features
from core.settings import DEFAULT_REGISTRY_DIR

TARGET_MS = 50.0


def start_server(registry: Path, adapt_dir: Path, threads: int) -> tuple[Any, str]:
    import subprocess

    port = _free_port()
    environment = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "EMBED_INTRA_OP_THREADS": str(threads),
        "EMBED_REGISTRY_POLL_SECONDS": "0", "EMBED_LOG_LEVEL": "warning", "EMBED_MODELS": MODEL,
        "EMBED_DEFAULT_MODEL": MODEL, "EMBED_ADAPT_DIR": str(adapt_dir), "EMBED_ADAPT_SUPERVISE_WORKER": "false",
    }  # fmt: skip
    command = [sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(registry), "--port", str(port)]
    proc = subprocess.Popen(command, env=environment, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return proc, url


def uploads(documents: int) -> list[tuple[str, Any]]:
    """The large corpora: (kind, request arguments for aiohttp) — a JSON body and a multipart Parquet file."""
    _, paragraphs = workloads(seed=1)
    texts = [f"{paragraphs[i % 500]} {paragraphs[(i * 7 + 3) % 500]}" for i in range(documents)]
    fields = {"base_model": MODEL, "name": "bench-upload", "promote": "never"}
    body = json.dumps({**fields, "texts": texts}).encode()
    parquet = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), parquet, compression="zstd")
    return [("json", body), ("parquet", (fields, parquet.getvalue()))]


async def drive(url: str, clients: int, seconds: float, corpora: list[tuple[str, Any]] | None) -> dict[str, Any]:
    """``clients`` closed loops of one-text embedding requests for ``seconds``; with ``corpora``, one more client
    posts them to /adapt in turn (cancelling each job) until the embedding clients are done."""
    import aiohttp

    short, _ = workloads()
    payloads = [json.dumps({"input": [text], "model": MODEL}).encode() for text in short]
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    upload_s: list[float] = []
    upload_statuses: Counter[str] = Counter()
    deadline = time.perf_counter() + seconds
    done = asyncio.Event()

    async def embedder_client(index: int, session: aiohttp.ClientSession) -> None:
        turn = index
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            async with session.post(f"{url}/v1/embeddings", data=payloads[turn % len(payloads)],
                                    headers={"content-type": "application/json"}) as response:  # fmt: skip
                await response.read()
                statuses[str(response.status)] += 1
            latencies.append(time.perf_counter() - started)
            turn += clients

    async def upload_client(session: aiohttp.ClientSession) -> None:
        turn = 0
        while not done.is_set():
            kind, payload = corpora[turn % len(corpora)]  # type: ignore[index]
            turn += 1
            if kind == "json":
                request = {"data": payload, "headers": {"content-type": "application/json"}}
            else:
                form = aiohttp.FormData(payload[0])
                form.add_field("file", payload[1], filename="corpus.parquet")
                request = {"data": form}
            started = time.perf_counter()
            async with session.post(f"{url}/adapt", **request) as response:
                answer = await response.json()
            upload_s.append(time.perf_counter() - started)
            upload_statuses[f"{kind} {response.status}"] += 1
            if response.status == 202:
                async with session.post(f"{url}/adapt/{answer['id']}/cancel") as cancelled:
                    await cancelled.read()

    connector = aiohttp.TCPConnector(limit=clients + 1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        uploader = asyncio.create_task(upload_client(session)) if corpora else None
        await asyncio.gather(*(embedder_client(i, session) for i in range(clients)))
        done.set()
        if uploader is not None:
            await uploader
    return {
        "requests": len(latencies), "statuses": dict(statuses), "p50_ms": round(_pct(latencies, 0.5), 1),
        "p99_ms": round(_pct(latencies, 0.99), 1), "latencies_s": latencies,
        "uploads": dict(upload_statuses),
        "upload_mean_s": round(sum(upload_s) / len(upload_s), 2) if upload_s else None,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--clients", type=int, default=4, help="embedding clients, one text per request")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both arms, alternated")
    parser.add_argument("--documents", type=int, default=20_000, help="documents per upload (~2 KB each)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    check_run_args(parser, args, max_rounds=6)
    corpora = uploads(args.documents)
    sizes = {kind: len(p if kind == "json" else p[1]) for kind, p in corpora}
    print(f"uploads: {sizes} bytes, {args.documents} documents each", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-uploads-") as adapt_dir:
        proc, url = start_server(args.registry, Path(adapt_dir), args.threads)
        runs: list[dict[str, Any]] = []
        try:
            asyncio.run(drive(url, args.clients, 3.0, None))  # warm-up
            for round_ in range(1, args.rounds + 1):
                for arm in ("quiet", "uploads") if round_ % 2 else ("uploads", "quiet"):
                    load_avg = os.getloadavg()[0]
                    result = asyncio.run(drive(url, args.clients, args.seconds, corpora if arm == "uploads" else None))
                    result |= {"round": round_, "arm": arm, "load_average_1m": round(load_avg, 2)}
                    runs.append(result)
                    print(json.dumps({k: v for k, v in result.items() if k != "latencies_s"}), flush=True)
        finally:
            _stop(proc)
    arms = {}
    for arm in ("quiet", "uploads"):
        latencies = [s for r in runs if r["arm"] == arm for s in r["latencies_s"]]
        arms[arm] = {"requests": len(latencies), "p50_ms": round(_pct(latencies, 0.5), 1),
                     "p99_ms": round(_pct(latencies, 0.99), 1)}  # fmt: skip
    difference = round(arms["uploads"]["p99_ms"] - arms["quiet"]["p99_ms"], 1)
    cpu = cpu_features()
    print(f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}); {args.clients} clients, {args.threads} threads")
    for arm, figures in arms.items():
        p50, p99 = figures["p50_ms"], figures["p99_ms"]
        print(f"{arm:8s} requests {figures['requests']:6d}  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms")
    uploaded = Counter()
    for r in runs:
        uploaded.update(r["uploads"])
    print(f"uploads answered: {dict(uploaded)}")
    verdict = "within" if difference <= TARGET_MS else "OVER"
    print(f"p99 with uploads in flight − without: {difference:+.1f} ms ({verdict} the +{TARGET_MS:.0f} ms target)")
    for r in runs:
        del r["latencies_s"]
    write_report(args.out, {"cpu": cpu, "args": {k: str(v) for k, v in vars(args).items()}, "sizes": sizes,
                            "runs": runs, "arms": arms, "p99_difference_ms": difference})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
