"""Our server against infinity-emb's optimum engine and the in-process ceiling, in one run (issue 21's table).

Three servers on the same machine and model, loaded in turn (the order alternating round by round, so a drift of
the shared machine hits every arm alike):

* **ours, int8** and **ours, fp32** — ``embedder serve`` on one ``minilm-l6`` bundle, ``EMBED_SERVE_INT8`` true/false;
* **infinity** — infinity-emb's ``v2`` command with ``--engine optimum --device cpu``, installed from PyPI into its own
  venv (``pip install 'infinity-emb[optimum,server]'``, after ``torch==2.13.0`` so pip does not pull a CUDA torch)
  and pointed at an ONNX export of the same all-MiniLM-L6-v2 folder (``optimum-cli export onnx --task
  feature-extraction``, plus the folder's sentence-transformers pooling files so infinity pools by mean); infinity
  finds ONNX files by globbing its model id, so it runs from inside that folder with ``--model-id .``.

``--compare-batch-tokens N`` adds a fourth arm, our int8 server with ``EMBED_MAX_BATCH_TOKENS=N`` (e.g. TEI's 16384
against the default 4096). For our servers the run also reports the padding: padded tokens run over real tokens
(``embed_batch_tokens`` over ``embed_tokens_total``).

Loads (bench_service's seeded texts): one short text per request at concurrency 1 (p50 latency) and 32; 32 short
texts per request at concurrency 8; 32 paragraphs per request at concurrency 8. The 32-text loads also get the
in-process ceiling (`core.runtime.OnnxBundle.encode`, batch 32, same threads) of both graphs, measured once per
load and round, right before the servers' runs. Printed: the median texts/s (or p50) per arm over the rounds, and
per round the ratio of ours (int8) to infinity.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_peers.py --registry /tmp/ovl/registry --rounds 3
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
from pathlib import Path
from typing import Any

import httpx
from bench_overload import scrape, start_server
from bench_service import MODEL, ROOT, _chunks, _free_port, _load, _post_one, _stop, workloads
from report_file import write_report

from core.runtime import OnnxBundle, cpu_features
from core.settings import DEFAULT_REGISTRY_DIR

LOADS = {  # name: (kind, texts per request, concurrency, texts)
    "1 text, 1 client": ("short", 1, 1, 200),
    "1 text, 32 clients": ("short", 1, 32, 512),
    "32 short texts, 8 clients": ("short", 32, 8, 1024),
    "32 paragraphs, 8 clients": ("paragraphs", 32, 8, 384),
}


def start_infinity(executable: Path, model_dir: Path, threads: int) -> tuple[subprocess.Popen, str]:
    """infinity-emb serving ``model_dir`` with its optimum engine on the CPU, on a loopback port."""
    port = _free_port()
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1", "HF_HOME": str(ROOT / "tools" / "infinity-cache"), "OMP_NUM_THREADS": str(threads),
    }  # fmt: skip
    command = [
        str(executable), "v2", "--model-id", ".", "--served-model-name", MODEL, "--engine", "optimum",
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), "--url-prefix", "/v1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, env=env, cwd=model_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"infinity exited with {proc.returncode}; run its command by hand to see why: {command}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    _stop(proc)
    raise RuntimeError("infinity was not ready after 300 s")


def run_load(url: str, name: str, texts: list[str]) -> dict[str, Any]:
    _, per_request, concurrency, n = LOADS[name]
    if concurrency == 1:
        with httpx.Client(timeout=60) as client:
            latencies = [_post_one(url, text, client) for text in texts[:n]]
        return {"p50_ms": round(statistics.median(latencies), 2)}
    result = asyncio.run(_load(url, _chunks(texts[:n], per_request), concurrency, name))
    if result.errors:
        raise RuntimeError(f"{url} {name}: {result.errors} failed requests")
    return {"texts_per_s": result.texts_per_s, "loadgen_cpu_cores": result.loadgen_cpu_cores}


def padding(before: dict[str, float], after: dict[str, float]) -> float:
    """Padded tokens run over real tokens embedded between two scrapes of our server's /metrics."""
    padded, real = (f'{name}{{model="{MODEL}"}}' for name in ("embed_batch_tokens_sum", "embed_tokens_total"))
    return round((after[padded] - before[padded]) / (after[real] - before[real]), 3)


def ceiling(bundle: OnnxBundle, texts: list[str]) -> float:
    started = time.perf_counter()
    bundle.encode(texts, batch_size=32)
    return round(len(texts) / (time.perf_counter() - started), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--infinity", type=Path, default=ROOT / "tools" / "infinity-venv" / "bin" / "infinity_emb")
    parser.add_argument("--infinity-model", type=Path, default=ROOT / "tools" / "infinity-model" / "all-MiniLM-L6-v2")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", default=";".join(LOADS), help="semicolon-separated subset of: " + "; ".join(LOADS))
    parser.add_argument("--compare-batch-tokens", type=int, default=None, help="an extra int8 arm with this budget")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    loads = [name for name in LOADS if name in args.loads.split(";")]
    short, paragraphs = workloads()
    texts = {"short": short, "paragraphs": paragraphs}
    bundle_dir = args.registry / MODEL / "current"
    ceilings = {
        variant: OnnxBundle(bundle_dir, variant=variant, intra_op_threads=args.threads, allow_spinning=False)
        for variant in ("int8", "fp32")
    }
    servers = {
        "ours, int8": start_server(args.registry, serve_int8=True, threads=args.threads, hold=None),
        "ours, fp32": start_server(args.registry, serve_int8=False, threads=args.threads, hold=None),
        "infinity": start_infinity(args.infinity, args.infinity_model, args.threads),
    }
    if args.compare_batch_tokens:
        servers[f"ours, int8, max_batch_tokens={args.compare_batch_tokens}"] = start_server(
            args.registry, serve_int8=True, threads=args.threads, hold=None,
            env={"EMBED_MAX_BATCH_TOKENS": str(args.compare_batch_tokens)},
        )  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        for _, url in servers.values():  # warm-up
            run_load(url, "1 text, 32 clients", short[-64:])
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(reversed(servers))
            for name in loads:
                kind, per_request, _, n = LOADS[name]
                paired = {}
                if per_request > 1:
                    paired = {f"ceiling_{v}": ceiling(b, texts[kind][:n]) for v, b in ceilings.items()}
                for arm in order:
                    row: dict[str, Any] = {"round": round_, "load": name, "arm": arm,
                                           "load_average_1m": os.getloadavg()[0], **paired}  # fmt: skip
                    before = scrape(servers[arm][1]) if arm.startswith("ours") else {}
                    row |= run_load(servers[arm][1], name, texts[kind])
                    if before:
                        row["padding"] = padding(before, scrape(servers[arm][1]))
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        for proc, _ in servers.values():
            _stop(proc)
    report = {"cpu": cpu_features(), "threads": args.threads, "rounds": args.rounds, "rows": rows}
    print(f"CPU: {report['cpu']['model']} ({', '.join(report['cpu']['flags'])}), {args.threads} threads")
    print(summary(rows, loads))
    write_report(args.out, report)
    return 0


def summary(rows: list[dict[str, Any]], loads: list[str]) -> str:
    """Median per arm and load, and the per-round ratios of ours to infinity and to the ceiling."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    lines = ["| load | " + " | ".join(arms) + " | in-process int8 / fp32 | ours int8 ÷ infinity, per round "
             "| padding, ours int8 |", "|---|" + "---:|" * len(arms) + "---|---|---:|"]  # fmt: skip
    for name in loads:
        of = [r for r in rows if r["load"] == name]
        key = "p50_ms" if LOADS[name][2] == 1 else "texts_per_s"
        cells = [statistics.median(r[key] for r in of if r["arm"] == arm) for arm in arms]
        ceiling_cell = ""
        if "ceiling_int8" in of[0]:
            ceiling_cell = " / ".join(str(statistics.median(r[f"ceiling_{v}"] for r in of)) for v in ("int8", "fp32"))
        ratios = []
        for round_ in sorted({r["round"] for r in of}):
            by_arm = {r["arm"]: r[key] for r in of if r["round"] == round_}
            ours, theirs = by_arm["ours, int8"], by_arm["infinity"]
            ratios.append(f"{theirs / ours if key == 'p50_ms' else ours / theirs:.2f}")  # above 1: ours is better
        unit = " (p50 ms)" if key == "p50_ms" else ""
        cells_text = " | ".join(str(c) for c in cells)
        pad = statistics.median(r["padding"] for r in of if r["arm"] == "ours, int8")
        lines.append(f"| {name}{unit} | {cells_text} | {ceiling_cell} | {', '.join(ratios)} | {pad} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
