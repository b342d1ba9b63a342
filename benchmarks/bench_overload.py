"""Overload: three loads against the int8 and the fp32 graph of one bundle, beside the unflooded figure.

Two ``embedder serve`` processes on one ``minilm-l6`` bundle — ``EMBED_SERVE_INT8=true`` and ``false``, default
admission settings — are loaded in turn, round by round, with the loads alternated so that a drift of the shared
machine hits every arm alike. Each client loops for ``--seconds``: post a request, read the answer, post the next;
a 429 is retried **at once** (a server must survive impolite clients; ``--backoff`` honours ``Retry-After``).

* **unflooded** — 8 clients × 32 short texts: the model's throughput when nobody is refused (the baseline);
* **bulk** — 8 clients × 32 paragraphs, an ordinary indexing job: must get no 429 on either graph;
* **crowd** — 64 clients × 32 short texts;
* **flood** — 256 clients × 32 short texts: the model must stay ≥ 95 % busy, the accepted texts/s ≥ 90 % of the
  unflooded figure of the same graph and round, and the accepted requests' server-side p99 within the documented
  bound (docs/API.md, "Admission"): ``overload_hold_seconds`` in line, then the longer of ``max_queue_wait_seconds``
  and the work of ``queue_wait_min_requests`` requests (here at the unflooded texts/s of the same graph and round)
  in the queue, then 1 s for the request's own batch and the estimate's error.

``--sdk`` also runs a client check on each graph: the OpenAI Python SDK (its default two retries, honouring
``Retry-After``), 8 threads × 5 requests × 32 paragraphs; counts the requests answered and the ``RateLimitError``s.

``--compare-hold`` adds a third server (int8, ``EMBED_OVERLOAD_HOLD_SECONDS=0``: refusals answered at once) to the
flood rounds, to show what the hold buys.

Per run: statuses; accepted texts/s (until the last answer); the model's busy share (the server's summed inference
time over the run: batches never overlap); accepted latency measured by the client (p50/p99) and by the server
(its ``x-total-time``, from the request's arrival at the admission, and ``x-queue-time``; and the p99 bucket
of its ``embed_request_duration_seconds`` and ``embed_queue_seconds`` histograms); the median ``Retry-After``; the
load generator's CPU (cores: it runs here, on the same cores as the server) and the 1-minute load average.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_overload.py --registry /tmp/ovl/registry --rounds 2 \\
        --out runs/bench_overload.json
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from bench_service import MODEL, ROOT, _free_port, _pct, _stop, _wait_ready, workloads
from report_file import write_report

from core.runtime import cpu_features, cpu_text
from core.settings import DEFAULT_REGISTRY_DIR

ROUTE = "/v1/embeddings"


@dataclass(frozen=True)
class Load:
    name: str
    clients: int
    kind: str  # "short" or "paragraphs"
    texts: int = 32


LOADS = (
    Load("unflooded", 8, "short"),
    Load("bulk", 8, "paragraphs"),
    Load("crowd", 64, "short"),
    Load("flood", 256, "short"),
)


def start_server(
    registry: Path,
    *,
    serve_int8: bool,
    threads: int,
    hold: float | None,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
    program: tuple[str, ...] = ("-m", "embedder.cli", "serve"),
) -> tuple[subprocess.Popen, str]:
    """``embedder serve`` on one model with default settings, except the graph, threads, hold and ``env``; run from
    the source tree ``root`` (``python -m`` puts it first on the path: another commit's tree serves that commit).
    ``program``: what Python runs instead, with the same flags (`serve_without_graph.py`)."""
    port = _free_port()
    environment = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "EMBED_SERVE_INT8": str(serve_int8).lower(),
        "EMBED_INTRA_OP_THREADS": str(threads), "EMBED_ADAPT_ENABLED": "false", "EMBED_REGISTRY_POLL_SECONDS": "0",
        "EMBED_LOG_LEVEL": "warning", "EMBED_MODELS": MODEL, "EMBED_DEFAULT_MODEL": MODEL,
    }  # fmt: skip
    if hold is not None:
        environment["EMBED_OVERLOAD_HOLD_SECONDS"] = str(hold)
    environment |= env or {}
    command = [sys.executable, *program, "--registry-dir", str(registry), "--port", str(port)]
    proc = subprocess.Popen(command, env=environment, cwd=root)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return proc, url


# ----------------------------------------------------------------------------------------------- the server's view
def scrape(url: str) -> dict[str, float]:
    """This model's series of /metrics: inference time, and the buckets of the two latency histograms."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or f'model="{MODEL}"' not in line:
            continue
        if line.startswith("embed_request_duration_seconds") and f'route="{ROUTE}"' not in line:
            continue
        key, value = line.rsplit(" ", 1)
        found[key] = float(value)
    return found


def histogram_p99(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    """Upper bound (s) of the bucket holding the 99th percentile of what was observed between two scrapes."""
    buckets = []
    for key, value in after.items():
        if key.startswith(f"{name}_bucket{{"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), value - before.get(key, 0.0)))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None
    return next(le for le, count in buckets if count >= 0.99 * total)


def check_run_args(parser: argparse.ArgumentParser, args: argparse.Namespace, max_rounds: int = 5) -> None:
    """What every load benchmark keeps to: bounded runs, and the promoted bundle it serves."""
    if not 0 < args.seconds <= 120 or not 1 <= args.rounds <= max_rounds:
        parser.error(f"keep it bounded: at most 120 s per run and {max_rounds} rounds")
    if not (args.registry / MODEL / "current").exists():
        parser.error(f"{args.registry} has no promoted {MODEL}; run: embedder export {MODEL} --name {MODEL} "
                     f"--promote --quantize auto --registry {args.registry}")  # fmt: skip


def admission_limits(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/info", timeout=30).json()["limits"]


# ----------------------------------------------------------------------------------------------- the clients' view
async def drive(
    url: str, payloads: list[bytes], clients: int, seconds: float, backoff: bool, key: str | None = None
) -> dict[str, Any]:
    """``clients`` closed loops posting the payloads in turn until ``seconds`` have passed (as API key ``key``, if
    given); then wait for the answers in flight. Returns statuses, texts, and the latencies of accepted requests
    from both sides."""
    import aiohttp

    statuses: Counter[str] = Counter()
    client_s: list[float] = []
    server_s: list[float] = []
    queue_s: list[float] = []
    retry_after: list[int] = []
    texts = 0
    last_answer = 0.0
    deadline = time.perf_counter() + seconds
    request_headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {key}"} if key else {})

    async def client(index: int, session: aiohttp.ClientSession) -> None:
        nonlocal texts, last_answer
        turn = index
        while time.perf_counter() < deadline:
            payload = payloads[turn % len(payloads)]
            turn += clients
            started = time.perf_counter()
            try:
                async with session.post(f"{url}{ROUTE}", data=payload, headers=request_headers) as response:
                    body = await response.read()
                    status, headers = response.status, response.headers
            except (aiohttp.ClientError, TimeoutError) as err:
                statuses[f"client error: {type(err).__name__}"] += 1
                continue
            last_answer = time.perf_counter()
            if status == 200:
                statuses["200"] += 1
                texts += len(json.loads(body)["data"])
                client_s.append(last_answer - started)
                server_s.append(float(headers["x-total-time"]) / 1000)
                queue_s.append(float(headers["x-queue-time"]) / 1000)
            elif status == 429:
                statuses["429"] += 1
                retry_after.append(int(headers.get("retry-after", "0")))
                if backoff:
                    await asyncio.sleep(min(int(headers.get("retry-after", "1")), max(0, deadline - last_answer)))
            else:
                statuses[str(status)] += 1

    started = time.perf_counter()
    cpu = time.process_time()
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(client(i, session) for i in range(clients)))
    wall = max(last_answer, time.perf_counter()) - started

    def ms(values: list[float], q: float) -> float | None:
        return round(_pct(values, q)) if values else None

    return {
        "statuses": dict(sorted(statuses.items())), "accepted_texts": texts, "seconds": round(wall, 2),
        "texts_per_s": round(texts / wall, 1), "loadgen_cpu_cores": round((time.process_time() - cpu) / wall, 2),
        "client_p50_ms": ms(client_s, 0.5), "client_p99_ms": ms(client_s, 0.99),
        "server_p50_ms": ms(server_s, 0.5), "server_p99_ms": ms(server_s, 0.99), "server_max_ms": ms(server_s, 1.0),
        "queue_p99_ms": ms(queue_s, 0.99),
        "retry_after_median_s": statistics.median(retry_after) if retry_after else None,
    }  # fmt: skip


def run(arm: str, url: str, load: Load, payloads: list[bytes], args: argparse.Namespace, round_: int) -> dict:
    load_avg = os.getloadavg()[0]
    before = scrape(url)
    result = asyncio.run(drive(url, payloads, load.clients, args.seconds, args.backoff))
    after = scrape(url)
    inference = f'embed_inference_seconds_sum{{model="{MODEL}"}}'
    busy = after[inference] - before[inference]
    row = {
        "round": round_, "arm": arm, "load": load.name, "clients": load.clients, "kind": load.kind,
        **result, "model_busy": round(busy / result["seconds"], 3),
        "histogram_duration_p99_s": histogram_p99(before, after, "embed_request_duration_seconds"),
        "histogram_queue_p99_s": histogram_p99(before, after, "embed_queue_seconds"),
        "load_average_1m": round(load_avg, 2),
    }  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def openai_sdk_bulk(url: str, paragraphs: list[str], threads: int = 8, requests: int = 5) -> dict[str, int]:
    """``threads`` OpenAI SDK clients, each sending ``requests`` requests of 32 paragraphs one after another."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)
    outcomes: Counter[str] = Counter()

    def worker(index: int) -> None:
        for k in range(requests):
            start = (index * requests + k) * 32 % (len(paragraphs) - 32)
            try:
                client.embeddings.create(model=MODEL, input=paragraphs[start : start + 32])
                outcomes["ok"] += 1
            except openai.RateLimitError:
                outcomes["RateLimitError"] += 1

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    return dict(outcomes)


# ----------------------------------------------------------------------------------------------- report
def latency_bound(limits: dict[str, Any], texts_per_s: float, texts_per_request: int = 32) -> float:
    """The documented bound on an accepted request's server-side latency under a flood (docs/API.md, "Admission")."""
    floor = limits["queue_wait_min_requests"] * texts_per_request / texts_per_s
    return limits["overload_hold_seconds"] + max(limits["max_queue_wait_seconds"], floor) + 1.0


def checks(rows: list[dict], limits: dict[str, Any]) -> list[str]:
    """The overload targets, per graph and round (the flood against the unflooded run of the same graph and round)."""
    lines = []
    by = {(r["round"], r["arm"], r["load"]): r for r in rows}
    for (round_, arm, load), r in sorted(by.items()):
        if load == "bulk":
            refused = r["statuses"].get("429", 0)
            lines.append(f"- round {round_}, {arm}, bulk: {refused} × 429 → {'met' if refused == 0 else 'missed'}")
        if load == "flood" and (round_, arm, "unflooded") in by:
            base = by[(round_, arm, "unflooded")]["texts_per_s"]
            ratio = r["texts_per_s"] / base
            bound_s = latency_bound(limits, base)
            p99 = r["server_p99_ms"] / 1000 if r["server_p99_ms"] is not None else float("inf")
            met = r["model_busy"] >= 0.95 and ratio >= 0.9 and p99 <= bound_s
            lines.append(
                f"- round {round_}, {arm}, flood: model busy {r['model_busy']:.0%} (≥ 95 %), accepted "
                f"{r['texts_per_s']} / unflooded {base} texts/s = {ratio:.2f} (≥ 0.90), server p99 {p99:.2f} s "
                f"(≤ {bound_s:.2f} s) → {'met' if met else 'missed'}"
            )
    return lines


def markdown(rows: list[dict]) -> str:
    lines = [
        "| round | graph | load | 200 | 429 | accepted texts/s | model busy | client p50 / p99 ms "
        "| server p50 / p99 ms (histogram p99 s) | queue p99 ms (histogram p99 s) | Retry-After "
        "| load-gen CPU (cores) | load avg |",
        "|---|---|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|",
    ]
    for r in rows:
        s = r["statuses"]
        other = {k: v for k, v in s.items() if k not in ("200", "429")}
        cells = [
            r["round"], r["arm"], f"{r['load']} ({r['clients']} × 32 {r['kind']})", s.get("200", 0),
            f"{s.get('429', 0)}" + (f" (+ {other})" if other else ""), r["texts_per_s"],
            f"{r['model_busy']:.0%}", f"{r['client_p50_ms']} / {r['client_p99_ms']}",
            f"{r['server_p50_ms']} / {r['server_p99_ms']} ({r['histogram_duration_p99_s']})",
            f"{r['queue_p99_ms']} ({r['histogram_queue_p99_s']})", r["retry_after_median_s"] or "–",
            r["loadgen_cpu_cores"], r["load_average_1m"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every load on every graph, alternated")
    parser.add_argument("--loads", default=",".join(load.name for load in LOADS), help="comma-separated subset")
    parser.add_argument("--backoff", action="store_true", help="honour Retry-After instead of retrying at once")
    parser.add_argument("--compare-hold", action="store_true", help="also flood an int8 server that refuses at once")
    parser.add_argument("--sdk", action="store_true", help="also run the OpenAI SDK bulk check on both graphs")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    check_run_args(parser, args)
    loads = [load for load in LOADS if load.name in args.loads.split(",")]
    short, paragraphs = workloads()
    payloads = {
        kind: [json.dumps({"input": texts[i : i + 32], "model": MODEL}).encode() for i in range(0, len(texts) - 31, 32)]
        for kind, texts in (("short", short), ("paragraphs", paragraphs))
    }
    servers = {"int8": start_server(args.registry, serve_int8=True, threads=args.threads, hold=None)}
    servers["fp32"] = start_server(args.registry, serve_int8=False, threads=args.threads, hold=None)
    if args.compare_hold:
        servers["int8, hold 0"] = start_server(args.registry, serve_int8=True, threads=args.threads, hold=0.0)
    rows: list[dict] = []
    try:
        graphs = {arm: httpx.get(f"{url}/v1/models").json()["data"][0]["quantization"] for arm, (_, url) in
                  servers.items()}  # fmt: skip
        limits = admission_limits(servers["int8"][1])
        for _, url in servers.values():  # warm-up: each server learns its throughput, as one in service has
            asyncio.run(drive(url, payloads["short"][:16], 4, 2.0, backoff=False))
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(reversed(servers))
            for load in loads:
                for arm in order:
                    if arm == "int8, hold 0" and load.name not in ("unflooded", "flood"):
                        continue
                    rows.append(run(arm, servers[arm][1], load, payloads[load.kind], args, round_))
        sdk = {}
        if args.sdk:
            for arm in ("int8", "fp32"):
                sdk[arm] = openai_sdk_bulk(servers[arm][1], paragraphs) | {"load_average_1m": os.getloadavg()[0]}
                print(f"OpenAI SDK, 8 threads × 5 requests × 32 paragraphs, {arm}: {sdk[arm]}", flush=True)
    finally:
        for proc, _ in servers.values():
            _stop(proc)
    report = {
        "cpu": cpu_features(), "threads": args.threads, "seconds": args.seconds, "backoff": args.backoff,
        "graphs": graphs, "limits": limits, "rows": rows, "openai_sdk": sdk,
    }  # fmt: skip
    print(f"CPU: {cpu_text(report['cpu'])}; graphs served: {graphs}")
    print(markdown(rows))
    print("\n".join(checks(rows, limits)))
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
