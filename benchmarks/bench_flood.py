"""Overload: a flood of many-text requests against ``embedder serve``, the wait bound on vs off (issue 14, item 6).

For each arm the real server starts on a loopback port (``minilm-l6`` fp32, default batching), gets a short
warm-up (so its throughput is known, as on a server in service), then ``--clients`` concurrent clients each
send ``--texts`` short sentences per request, back to back, for ``--seconds``. A client that gets 429 waits
the ``Retry-After`` it was given (as the OpenAI client does; ``--no-backoff`` retries at once). The flood
stops by itself: no new request after ``--seconds``, and whatever is still in flight gets ``--drain-seconds``
more before it is cancelled. Arms:

* **off** — ``--max-queue-wait-seconds 0``: the count bound (``max_queue_size``, 4,096 texts) alone, the
  baseline;
* **on** — ``--max-queue-wait-seconds`` ``--bound`` (default 2 s, the service default).

``--rounds`` alternates off/on pairs, so a drift of the shared machine's speed hits both arms alike.

Printed per arm: statuses (200 / 429 / 5xx / other / client errors), latency of accepted requests (p50, p99,
max; and their server-side ``x-queue-time``) and of 429s, accepted texts/s over the flood (until the last
response), the share of that time the model was busy (the server's summed inference time: below 100 % the
queue ran dry, so throughput was lost), the server's peak RSS (VmHWM) and RSS before the flood, and whether
the server still answers afterwards (five sequential one-text requests). The load generator
(aiohttp, one event loop) runs in this process and shares the machine's cores with the server; its CPU
use is reported.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_flood.py --registry /tmp/flood/registry \\
        --clients 128 --seconds 30 --out runs/bench_flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from bench_service import MODEL, ROOT, _free_port, _pct, _stop, _wait_ready, workloads


def _rss_kib(pid: int) -> dict[str, int]:
    """Current (VmRSS) and peak (VmHWM) resident memory of a process, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


async def flood(url: str, payloads: list[bytes], clients: int, seconds: float, drain_seconds: float,
                backoff: bool) -> dict[str, Any]:  # fmt: skip
    """``clients`` loops posting the payloads in turn until ``seconds`` have passed; statuses and latencies."""
    import aiohttp

    statuses: Counter[str] = Counter()
    accepted: list[float] = []
    queue_times: list[float] = []  # the server's x-queue-time of accepted requests
    rejected: list[float] = []
    retry_after: list[int] = []
    accepted_texts = 0
    deadline = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=seconds + drain_seconds)

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal accepted_texts
        turn = index
        while time.perf_counter() < deadline:
            payload = payloads[turn % len(payloads)]
            turn += clients
            started = time.perf_counter()
            try:
                async with session.post(
                    f"{url}/v1/embeddings", data=payload, headers={"content-type": "application/json"}
                ) as response:
                    body = await response.read()
                    status = response.status
                    wait = response.headers.get("retry-after")
                    queue_ms = response.headers.get("x-queue-time")
            except (aiohttp.ClientError, TimeoutError) as err:  # e.g. a pooled keep-alive connection the server closed
                statuses[f"client error: {type(err).__name__}"] += 1
                continue
            latency = time.perf_counter() - started
            if status == 200:
                statuses["200"] += 1
                accepted.append(latency)
                queue_times.append(float(queue_ms or "nan") / 1000)
                accepted_texts += len(json.loads(body)["data"])
            elif status == 429:
                statuses["429"] += 1
                rejected.append(latency)
                retry_after.append(int(wait or 0))
                if backoff:
                    await asyncio.sleep(min(int(wait or 1), max(0.0, deadline - time.perf_counter())))
            else:
                statuses["5xx" if status >= 500 else str(status)] += 1

    started = time.perf_counter()
    cpu0 = time.process_time()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(client(i, session)) for i in range(clients)]
        _, unfinished = await asyncio.wait(tasks, timeout=seconds + drain_seconds)
        for task in unfinished:
            task.cancel()
        statuses["cancelled at the drain limit"] += len(unfinished)
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0

    def ms(values: list[float], q: float) -> float | None:
        return round(_pct(values, q), 1) if values else None

    return {
        "statuses": {key: value for key, value in sorted(statuses.items()) if value},
        "accepted_p50_ms": ms(accepted, 0.5), "accepted_p99_ms": ms(accepted, 0.99),
        "accepted_max_ms": round(max(accepted) * 1000, 1) if accepted else None,
        "accepted_queue_p50_ms": ms(queue_times, 0.5), "accepted_queue_p99_ms": ms(queue_times, 0.99),
        "rejected_p50_ms": ms(rejected, 0.5), "rejected_p99_ms": ms(rejected, 0.99),
        "retry_after_median_s": statistics.median(retry_after) if retry_after else None,
        "accepted_texts": accepted_texts, "seconds": round(wall, 1),
        "accepted_texts_per_s": round(accepted_texts / wall, 1), "loadgen_cpu_cores": round(cpu / wall, 2),
    }  # fmt: skip


def _inference_seconds(url: str) -> tuple[float, float]:
    """The server's summed inference time and batch count (its busy time: batches never overlap)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        for key in ("embed_inference_seconds_sum", "embed_inference_seconds_count"):
            if line.startswith(key + "{") and f'model="{MODEL}"' in line:
                found[key] = float(line.rsplit(" ", 1)[1])
    return found["embed_inference_seconds_sum"], found["embed_inference_seconds_count"]


def run_arm(name: str, bound: float, args: argparse.Namespace, payloads: list[bytes], env: dict) -> dict[str, Any]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(args.registry), "--port", str(port),
        "--models", MODEL, "--default-model", MODEL, "--intra-op-threads", str(args.threads),
        "--no-adapt-enabled", "--no-adapt-supervise-worker", "--log-level", "warning", "--registry-poll-seconds", "0",
        "--max-queue-wait-seconds", str(bound),
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        _wait_ready(url, proc)
        with httpx.Client(timeout=60) as client:
            for payload in payloads[:16]:  # warm-up: the server learns its throughput, as one in service has
                client.post(f"{url}/v1/embeddings", content=payload, headers={"content-type": "application/json"})
        before = _rss_kib(proc.pid)
        busy0, batches0 = _inference_seconds(url)
        result = asyncio.run(flood(url, payloads, args.clients, args.seconds, args.drain_seconds, not args.no_backoff))
        busy, batches = (a - b for a, b in zip(_inference_seconds(url), (busy0, batches0), strict=True))
        result |= {"model_busy_fraction": round(busy / result["seconds"], 2),
                   "texts_per_batch": round(result["accepted_texts"] / max(batches, 1), 1)}  # fmt: skip
        after: list[float] = []
        with httpx.Client(timeout=60) as client:
            for i in range(5):
                started = time.perf_counter()
                response = client.post(f"{url}/v1/embeddings", json={"input": f"still fine {i}?", "model": MODEL})
                after.append((time.perf_counter() - started) * 1000 if response.status_code == 200 else float("nan"))
        memory = _rss_kib(proc.pid)
    finally:
        _stop(proc)
    row = {"arm": name, "max_queue_wait_seconds": bound, **result,
           "rss_before_flood_mib": round(before["VmRSS"] / 1024), "rss_peak_mib": round(memory["VmHWM"] / 1024),
           "after_flood_ms": [round(x, 1) for x in after]}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | 200 | 429 | 5xx | other | accepted p50 ms | accepted p99 ms | accepted max ms | queue p99 ms "
        "| 429 p99 ms | accepted texts/s | model busy | peak RSS MiB (before flood) | after the flood, 1 text ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        s = r["statuses"]
        other = sum(v for k, v in s.items() if k not in ("200", "429", "5xx"))
        bound = r["max_queue_wait_seconds"]
        label = "off (count bound only)" if bound == 0 else f"on, {bound:g} s"
        cells = [
            label, s.get("200", 0), s.get("429", 0), s.get("5xx", 0), other, r["accepted_p50_ms"], r["accepted_p99_ms"],
            r["accepted_max_ms"], r["accepted_queue_p99_ms"], r["rejected_p99_ms"], r["accepted_texts_per_s"],
            f"{r['model_busy_fraction']:.0%}", f"{r['rss_peak_mib']} ({r['rss_before_flood_mib']})",
            ", ".join(map(str, r["after_flood_ms"])),
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / "registry", help="registry holding minilm-l6")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--clients", type=int, default=128, help="concurrent clients (loopback only)")
    parser.add_argument("--texts", type=int, default=32, help="texts per request")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the flood per arm")
    parser.add_argument("--drain-seconds", type=float, default=90.0, help="grace for requests in flight at the end")
    parser.add_argument("--rounds", type=int, default=1, help="off/on pairs, alternated (the machine's speed drifts)")
    parser.add_argument("--bound", type=float, default=2.0, help="max_queue_wait_seconds of the 'on' arm")
    parser.add_argument("--no-backoff", action="store_true", help="retry a 429 at once instead of after Retry-After")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= 1024 or not 0 < args.seconds <= 600 or not 1 <= args.rounds <= 5:
        parser.error("keep the flood bounded: 1-1024 clients, at most 600 s, 1-5 rounds")

    if not (args.registry / MODEL / "current").exists():  # a promoted bundle; no import of the registry's floor
        parser.error(f"{args.registry} has no promoted {MODEL}; run: embedder export {MODEL} --name {MODEL} "
                     f"--promote --registry {args.registry}")  # fmt: skip
    short, _ = workloads()
    chunks = [short[i : i + args.texts] for i in range(0, len(short) - args.texts + 1, args.texts)]
    payloads = [json.dumps({"input": c, "model": MODEL, "encoding_format": "float"}).encode() for c in chunks]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    report: dict[str, Any] = {"clients": args.clients, "texts_per_request": args.texts, "seconds": args.seconds,
                              "backoff": not args.no_backoff, "threads": args.threads,
                              "started": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    report["arms"] = []
    for _ in range(args.rounds):
        report["arms"] += [run_arm("off", 0.0, args, payloads, env), run_arm("on", args.bound, args, payloads, env)]
    report["finished"] = time.strftime("%H:%M")
    print(markdown(report["arms"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
