"""Fair share between API keys: a key with 8 clients beside a key flooding the server with 256.

One ``embedder serve`` (int8 where it passes its probe check, default admission settings) with two client keys.
Each round runs, in turn:

* **alone** — the quiet key's 8 clients × 32 short texts: its unflooded throughput (the baseline);
* **flooded** — the same 8 clients while the flooding key's 256 clients × 32 short texts retry every 429 at once.

Targets (per round): the quiet key keeps ≥ 45 % of its unflooded texts/s and no more than 5 % of its requests
are refused. The two keys' clients run in two processes (two tenants are two client machines). Also printed: the
flood's accepted texts/s and 429s, the server's per-key admission counters
(``embed_admissions_total``), the load generator's CPU (it runs on the same cores as the server) and the CPU.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_fair_share.py --registry /tmp/ovl/registry --rounds 3 \\
        --out runs/bench_fair_share.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from bench_overload import check_run_args, drive, start_server
from bench_service import MODEL, ROOT, _stop, workloads
from report_file import write_report

from core.runtime import cpu_features, cpu_text
from core.settings import DEFAULT_REGISTRY_DIR
from service.auth import key_id

QUIET, FLOOD = "quiet-tenant-key", "flooding-tenant-key"
QUIET_CLIENTS, FLOOD_CLIENTS = 8, 256


def admissions(url: str) -> dict[str, float]:
    """The server's ``embed_admissions_total`` by (key id, outcome)."""
    counts = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("embed_admissions_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.removeprefix("embed_admissions_total")] = float(value)
    return counts


def _flood(url: str, payloads: list[bytes], seconds: float) -> dict[str, Any]:
    return asyncio.run(drive(url, payloads, FLOOD_CLIENTS, seconds, backoff=False, key=FLOOD))


def flooded(url: str, payloads: list[bytes], seconds: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quiet key's clients beside the flood's, each in its own process (two tenants are two client machines:
    one event loop for both would slow the quiet clients by the flood's own client-side work)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        flood = pool.submit(_flood, url, payloads, seconds + 2.0)
        time.sleep(2.0)  # the flood's process starts and fills the server before the quiet key starts
        quiet = asyncio.run(drive(url, payloads, QUIET_CLIENTS, seconds, backoff=False, key=QUIET))
        return quiet, flood.result()


def refused_share(result: dict[str, Any]) -> float:
    statuses = result["statuses"]
    total = sum(statuses.values())
    return statuses.get("429", 0) / total if total else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alone / flooded")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    check_run_args(parser, args)
    short, _ = workloads()
    payloads = [json.dumps({"input": short[i : i + 32], "model": MODEL}).encode() for i in range(0, 1969, 32)]
    proc, url = start_server(
        args.registry, serve_int8=True, threads=args.threads, hold=None, env={"EMBED_API_KEYS": f"{QUIET},{FLOOD}"}
    )
    rows = []
    try:
        asyncio.run(drive(url, payloads[:16], 4, 2.0, backoff=False, key=QUIET))  # warm-up: the throughput is known
        for round_ in range(1, args.rounds + 1):
            alone = asyncio.run(drive(url, payloads, QUIET_CLIENTS, args.seconds, backoff=False, key=QUIET))
            before = admissions(url)
            quiet, flood = flooded(url, payloads, args.seconds)
            after = admissions(url)
            row = {
                "round": round_, "quiet_alone": alone, "quiet_flooded": quiet, "flood": flood,
                "kept": round(quiet["texts_per_s"] / alone["texts_per_s"], 3),
                "quiet_refused": round(refused_share(quiet), 4),
                "admissions": {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)},
                "load_average_1m": round(os.getloadavg()[0], 2),
            }  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        _stop(proc)
    cpu = cpu_features()
    print(f"CPU: {cpu_text(cpu)}; keys: quiet {key_id(QUIET)}, flood {key_id(FLOOD)}")
    print("| round | quiet alone texts/s | quiet flooded texts/s | kept | quiet 429 share | flood texts/s | flood 429 "
          "| load-gen CPU (cores) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['round']} | {r['quiet_alone']['texts_per_s']} | {r['quiet_flooded']['texts_per_s']} | "
              f"{r['kept']:.0%} | {r['quiet_refused']:.1%} | {r['flood']['texts_per_s']} | "
              f"{r['flood']['statuses'].get('429', 0)} | {r['quiet_flooded']['loadgen_cpu_cores']} |")  # fmt: skip
    for r in rows:
        met = r["kept"] >= 0.45 and r["quiet_refused"] <= 0.05
        print(f"- round {r['round']}: kept {r['kept']:.0%} (≥ 45 %), refused {r['quiet_refused']:.1%} (≤ 5 %) → "
              f"{'met' if met else 'missed'}")  # fmt: skip
    write_report(args.out, {"cpu": cpu, "threads": args.threads, "seconds": args.seconds, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
