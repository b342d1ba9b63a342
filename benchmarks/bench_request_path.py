"""What the server adds to one text: server p50/p99 of 1 text x 1 client against the in-process p50, in one run.

One ``embedder serve`` on a ``minilm-l6`` bundle with the engine of ``--engine`` (``auto``: whatever it chose; the
in-process arm then runs the same engine, small-batch routing included), and in this process an `OnnxBundle` of the
same engine, graph, threads and spinning (``EMBED_ORT_SPINNING``, as the server). The same short texts
(bench_service's seeded sentences) go, one request at a time, through four arms per round:

* **in process** — `OnnxBundle.encode` of the one text: tokenise, pad, run (what the server cannot avoid);
* **server, raw client** — a keep-alive HTTP/1.1 connection on a plain socket sending pre-encoded requests: the
  client's own cost is a ``send`` and a ``recv`` (tens of microseconds), so the figure is the server's;
* **server, httpx** — ``httpx.Client.post(json=...)``, what a Python client meets (the client's JSON and
  request building included);
* **server, graph skipped** — the raw client against a second server, `serve_without_graph.py`: the same server
  with a constant vector in place of the graph's run, so its p50 is what the server costs around the graph: text by
  text, with the caches as the other arms' graph runs leave them (as a real request finds them); with ``--blocks``,
  warm (no graph run between its requests) — the floor of "server − in process" on this CPU.

The arms take turns text by text (in an order rotating from text to text), so a drift of the shared machine hits
each alike; with ``--blocks`` each arm runs all the texts in turn instead, the order alternating between rounds (each
arm then runs back to back, warm, as a server under steady single-client traffic would). Printed per round: the
load average, p50 and p99 per arm, the servers' own medians (their ``x-*-time`` headers) and the difference of the
raw-client p50 and the in-process p50; then the median of the rounds, and the CPU (model name; avx2 / avx512_vnni /
amx). ``--server-root`` changes the first server only; the graph-skipped one runs from this tree. ``--gap-ms`` idles
before every request of every arm (sporadic traffic: the inference threads fall asleep between texts).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_request_path.py --registry /tmp/reg --rounds 5
    # the server of another commit, same client and in-process arm:
    git archive 0e1be9b | tar -x -C /tmp/base && HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_request_path.py \
        --registry /tmp/reg --rounds 5 --server-root /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from bench_overload import start_server
from bench_service import MODEL, ROOT, _pct, _stop, server_spinning, workloads
from report_file import write_report

from core.engine_choice import ENGINE_SETTINGS, Route, describe
from core.engines import open_routes
from core.runtime import OnnxBundle, cpu_features
from core.settings import DEFAULT_REGISTRY_DIR

ARMS = ("in process", "server, raw client", "server, httpx", "server, graph skipped")
SKIPPED_GRAPH = Path(__file__).with_name("serve_without_graph.py")  # run from this tree, whatever --server-root says
SERVED = {ARMS[1]: "server headers p50 (ms)", ARMS[3]: "graph-skipped server headers p50 (ms)"}


class RawClient:
    """HTTP/1.1 keep-alive on one socket; requests built once, responses read by Content-Length."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host, self.address = f"{host}:{port}", (host, int(port))
        self.sock = self.connect()

    def connect(self) -> socket.socket:
        sock = socket.create_connection(self.address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def reconnect(self) -> None:
        """A fresh connection: the server closes an idle one after its keep-alive timeout."""
        self.sock.close()
        self.sock = self.connect()

    def request(self, text: str) -> bytes:
        body = json.dumps({"input": text, "model": MODEL, "encoding_format": "float"}).encode()
        head = (
            f"POST /v1/embeddings HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    def post(self, request: bytes) -> dict[str, float]:
        """Send one request; the server's own timings (its ``x-*-time`` headers, ms)."""
        self.sock.sendall(request)
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += self._recv()
        head, _, body = buffer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"the server answered {head.splitlines()[0]!r}")
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        while len(body) < int(fields[b"content-length"]):
            body += self._recv()
        return {k.decode()[2:-5]: float(v) for k, v in fields.items() if k.startswith(b"x-") and k.endswith(b"-time")}

    def _recv(self) -> bytes:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def in_process_bundle(bundle_dir: Path, choice: dict[str, Any], threads: int) -> OnnxBundle:
    """An `OnnxBundle` of the engines the server serves, each batch routed as the server routes it."""
    routes = [(r["engine"], r["shapes"]) for r in choice["routes"]]
    return open_routes(bundle_dir, routes, intra_op_threads=threads, spinning=server_spinning())


def reopen(connection: RawClient, requests: list[bytes]) -> None:
    """A fresh connection, its first requests (which pay the connection's set-up) left out of the timings."""
    connection.reconnect()
    timed_ms(connection.post, requests[:5])


def timed_ms(
    call: Any, items: list[Any], server: dict[str, list[float]] | None = None, gap_s: float = 0.0
) -> list[float]:
    """Milliseconds of ``call`` on each item, each after ``gap_s`` idle; the server's timings (what ``call`` returns)
    gathered in ``server``."""
    latencies = []
    for item in items:
        if gap_s:
            time.sleep(gap_s)
        started = time.perf_counter()
        timings = call(item)
        latencies.append((time.perf_counter() - started) * 1000)
        if server is not None:
            for key, value in timings.items():
                server.setdefault(key, []).append(value)
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--engine", default="onnxruntime-int8", choices=ENGINE_SETTINGS, help="EMBED_ENGINE")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="texts per arm and round")
    parser.add_argument(
        "--server-root", type=Path, default=ROOT, help="source tree the server runs from (another commit's, unpacked)"
    )
    parser.add_argument("--blocks", action="store_true", help="each arm runs all texts in turn, not text by text")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="idle before each request: sporadic traffic")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 15 or not 10 <= args.requests <= 5000 or not 0 <= args.gap_ms <= 1000:
        parser.error("keep it bounded: 1-15 rounds of 10-5000 requests, gaps of 0-1000 ms")
    gap_s = args.gap_ms / 1000
    short, _ = workloads()
    texts = short[: args.requests]
    served: dict[str, Any] = {"serve_int8": True, "threads": args.threads, "hold": None,
                              "env": {"EMBED_ENGINE": args.engine}}  # fmt: skip
    proc, url = start_server(args.registry, root=args.server_root, **served)
    skipped_proc, skipped_url = start_server(args.registry, program=(str(SKIPPED_GRAPH),), **served)
    rows: list[dict[str, Any]] = []
    try:
        (card,) = [c for c in httpx.get(f"{url}/v1/models", timeout=30).json()["data"] if c["id"] == MODEL]
        choice = card["engine_choice"]
        routes = describe([Route(**{k: r[k] for k in ("engine", "batches", "shapes", "reason")})
                           for r in choice["routes"]])  # fmt: skip
        print(f"server: {routes} (setting {args.engine}; chosen in {choice['seconds']} s)", flush=True)
        bundle = in_process_bundle(args.registry / MODEL / "current", choice, args.threads)
        raw, skipped = RawClient(url), RawClient(skipped_url)
        connections = {ARMS[1]: raw, ARMS[3]: skipped}
        requests = [raw.request(text) for text in texts]
        with httpx.Client(timeout=60) as client:

            def via_httpx(text: str) -> None:
                client.post(f"{url}/v1/embeddings", json={"input": text, "model": MODEL, "encoding_format": "float"})

            calls = {
                ARMS[0]: (lambda text: bundle.encode([text]), texts),
                ARMS[1]: (raw.post, requests),
                ARMS[2]: (via_httpx, texts),
                ARMS[3]: (skipped.post, requests),
            }
            for call, items in calls.values():  # warm-up: every arm's first requests pay lazy set-up
                timed_ms(call, items[:30])
            for round_ in range(1, args.rounds + 1):
                row: dict[str, Any] = {"round": round_, "load_average_1m": os.getloadavg()[0]}
                for connection in connections.values():
                    reopen(connection, requests)
                latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
                server: dict[str, dict[str, list[float]]] = {arm: {} for arm in SERVED}
                if args.blocks:  # each arm runs every text in turn, the arms' order alternating between rounds
                    for arm in ARMS if round_ % 2 else reversed(ARMS):
                        if arm in connections:  # idle through the other arms' blocks: past the keep-alive timeout
                            reopen(connections[arm], requests)
                        latencies[arm] = timed_ms(*calls[arm], server.get(arm), gap_s)
                for index in range(0 if args.blocks else len(texts)):  # the arms take turns text by text
                    turn = index % len(ARMS)
                    for arm in ARMS[turn:] + ARMS[:turn]:
                        call, items = calls[arm]
                        latencies[arm] += timed_ms(call, items[index : index + 1], server.get(arm), gap_s)
                for arm in ARMS:
                    seconds = [ms / 1000 for ms in latencies[arm]]
                    row[arm] = {"p50_ms": round(_pct(seconds, 0.5), 3), "p99_ms": round(_pct(seconds, 0.99), 3)}
                for arm, key in SERVED.items():
                    row[key] = {k: round(statistics.median(v), 3) for k, v in server[arm].items()}
                row["raw p50 - in-process p50 (ms)"] = round(row[ARMS[1]]["p50_ms"] - row[ARMS[0]]["p50_ms"], 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
        raw.close()
        skipped.close()
    finally:
        _stop(proc)
        _stop(skipped_proc)
    cpu = cpu_features()
    amx = any(f.startswith("amx") for f in cpu["flags"])
    flags = f"avx2 {'avx2' in cpu['flags']}, avx512_vnni {'avx512_vnni' in cpu['flags']}, amx {amx}"
    idle = f"; {args.gap_ms:g} ms idle before each request" if args.gap_ms else ""
    print(f"CPU: {cpu['model']} ({flags}); {args.threads} threads; engine {choice['engine']}{idle}")
    print("| arm | p50 ms (median of rounds) | p99 ms (median of rounds) |\n|---|---:|---:|")
    for arm in ARMS:
        p50 = statistics.median(r[arm]["p50_ms"] for r in rows)
        p99 = statistics.median(r[arm]["p99_ms"] for r in rows)
        print(f"| {arm} | {p50:.2f} | {p99:.2f} |")
    floor = statistics.median(r[ARMS[3]]["p50_ms"] for r in rows)
    floor_inside = statistics.median(r[SERVED[ARMS[3]]].get("total", float("nan")) for r in rows)
    print(f"the server with the graph skipped: p50 {floor:.2f} ms, {floor_inside:.2f} ms of it from admission to the "
          "response (its headers)")  # fmt: skip
    differences = [r["raw p50 - in-process p50 (ms)"] for r in rows]
    loads = [r["load_average_1m"] for r in rows]
    print(f"server (raw client) p50 - in-process p50: median {statistics.median(differences):+.2f} ms "
          f"(per round {', '.join(f'{d:+.2f}' for d in differences)}); "
          f"1-minute load average {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    write_report(args.out, {"cpu": cpu, "threads": args.threads, "setting": args.engine, "engine": choice,
                            "gap_ms": args.gap_ms, "rows": rows})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
