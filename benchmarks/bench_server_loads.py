"""Our server against another tree's server at concurrent loads: texts/s per round, before and after, in one run.

Two ``embedder serve`` processes on the same ``minilm-l6`` bundle and engine (``--engine``, default onnxruntime int8,
so an engine choice made on a busy machine does not differ between the two): **before** runs from ``--before-root``
(another commit's tree, unpacked with ``git archive``), **after** from this tree. Both stay up; each round runs every
load (bench_peers' loads, bench_service's seeded texts and aiohttp client) on both, the order of the two alternating
between rounds, so a drift of the shared machine hits each alike. Printed per round and load: the 1-minute load
average, texts/s and p50 of each, and after ÷ before; then per load the median of the rounds' ratios, and the CPU
(model name; avx2 / avx512_vnni / amx). ``--before-root`` of this tree measures the noise: the ratios of two equal
servers; ``--after-env`` gives the "after" server settings of its own (``EMBED_...=value``), the same tree then
measuring a setting.

    git archive 824c26a | tar -x -C /tmp/before   # an empty folder
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_server_loads.py --registry /tmp/reg --before-root /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from pathlib import Path
from typing import Any

from bench_overload import start_server
from bench_peers import LOADS
from bench_service import ROOT, _chunks, _load, _stop, workloads
from report_file import write_report

from core.engine_choice import ENGINE_SETTINGS
from core.runtime import cpu_features
from core.settings import DEFAULT_REGISTRY_DIR

DEFAULT_LOADS = ("1 text, 32 clients", "32 short texts, 8 clients")


def run(url: str, load: str, texts: dict[str, list[str]], repeat: int) -> dict[str, float]:
    """texts/s and p50 (ms) of ``load`` on ``url``, its texts sent ``repeat`` times over."""
    kind, per_request, concurrency, n = LOADS[load]
    result = asyncio.run(_load(url, _chunks(texts[kind][:n] * repeat, per_request), concurrency, load))
    if result.errors:
        raise RuntimeError(f"{result.errors} of {result.requests} requests failed on {url} ({load})")
    return {"texts_per_s": result.texts_per_s, "p50_ms": result.p50_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--before-root", type=Path, required=True, help="source tree of the 'before' server")
    parser.add_argument("--engine", default="onnxruntime-int8", choices=ENGINE_SETTINGS, help="EMBED_ENGINE of both")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--loads", nargs="+", default=list(DEFAULT_LOADS), choices=list(LOADS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=4, help="each load's texts sent this many times a round")
    parser.add_argument(
        "--after-env", nargs="*", default=[], metavar="KEY=VALUE", help="settings of the 'after' server only"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 20 or not 1 <= args.repeat <= 20:
        parser.error("keep it bounded: 1-20 rounds, 1-20 repeats")
    if any(LOADS[load][2] == 1 for load in args.loads):
        parser.error("one client is bench_request_path's load (latency); these are the concurrent ones")
    short, paragraphs = workloads()
    texts = {"short": short, "paragraphs": paragraphs}
    roots = {"before": args.before_root, "after": ROOT}
    env = {"EMBED_ENGINE": args.engine}
    after_env = env | dict(pair.split("=", 1) for pair in args.after_env)
    envs = {"before": env, "after": after_env}
    servers = {
        name: start_server(args.registry, serve_int8=True, threads=args.threads, hold=None, env=envs[name], root=root)
        for name, root in roots.items()
    }
    rows: list[dict[str, Any]] = []
    try:
        for _, url in servers.values():  # warm-up: lazy set-up, the first batches' allocations
            for load in args.loads:
                run(url, load, texts, 1)
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(reversed(servers))
            for load in args.loads:
                row: dict[str, Any] = {"round": round_, "load": load, "load_average_1m": os.getloadavg()[0]}
                for name in order:
                    row[name] = run(servers[name][1], load, texts, args.repeat)
                row["after / before"] = round(row["after"]["texts_per_s"] / row["before"]["texts_per_s"], 3)
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        for proc, _ in servers.values():
            _stop(proc)
    cpu = cpu_features()
    amx = any(f.startswith("amx") for f in cpu["flags"])
    print(f"CPU: {cpu['model']} (avx2 {'avx2' in cpu['flags']}, avx512_vnni {'avx512_vnni' in cpu['flags']}, "
          f"amx {amx}); {args.threads} threads; engine {args.engine}")  # fmt: skip
    print("| load | before texts/s | after texts/s | after ÷ before, per round | median | load average |")
    print("|---|---:|---:|---|---:|---|")
    for load in args.loads:
        of = [r for r in rows if r["load"] == load]
        before = statistics.median(r["before"]["texts_per_s"] for r in of)
        after = statistics.median(r["after"]["texts_per_s"] for r in of)
        ratios = [r["after / before"] for r in of]
        loads = [r["load_average_1m"] for r in of]
        print(f"| {load} | {before:.0f} | {after:.0f} | {', '.join(f'{x:.2f}' for x in ratios)} | "
              f"**{statistics.median(ratios):.2f}** | {min(loads):.1f}-{max(loads):.1f} |")  # fmt: skip
    write_report(args.out, {"cpu": cpu, "threads": args.threads, "engine": args.engine, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
