"""Served int8 vs served fp32 of the same default bundle, paired round by round (docs/BENCHMARKS.md, "int8 vs fp32,
served").

Exports ``minilm-l6`` with ``--quantize auto`` into a scratch registry (or uses ``--registry``), starts two
``embedder serve`` processes on it — ``EMBED_SERVE_INT8=true`` and ``false`` — and loads them in alternating
rounds (int8, fp32, int8, ...) so the shared machine's drift hits both alike. Loads: 32-text requests at
concurrency 8 of short sentences and of paragraphs (bench_service's seeded workloads). Prints each arm's
median texts/s, the per-round int8/fp32 ratio, which graph each server reports in ``/v1/models`` and how
close the served int8 vectors are to the fp32 ones. Names the CPU, since int8 speed and precision depend on it.
With ``--quality`` it also scores both graphs on the offline suite (`evaluation.tasks.DEFAULT_TASKS`).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_int8.py --rounds 5 --quality
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np
from bench_service import MODEL, ROOT, _chunks, _free_port, _load, _stop, _wait_ready, workloads
from report_file import write_report

from core.runtime import cosines, cpu_features


def _server(registry: Path, serve_int8: bool, threads: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {
        **os.environ, "EMBED_SERVE_INT8": str(serve_int8).lower(), "EMBED_INTRA_OP_THREADS": str(threads),
        "EMBED_ADAPT_ENABLED": "false", "EMBED_REGISTRY_POLL_SECONDS": "0", "EMBED_LOG_LEVEL": "warning",
        "EMBED_MAX_QUEUE_WAIT_SECONDS": "0",  # throughput, not admission: every request is served
    }  # fmt: skip
    command = [sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(registry), "--port", str(port)]
    return subprocess.Popen(command, env=env, cwd=ROOT), f"http://127.0.0.1:{port}"


def _embed(url: str, texts: list[str]) -> np.ndarray:
    vectors = []
    for batch in _chunks(texts, 32):
        response = httpx.post(f"{url}/v1/embeddings", json={"input": batch, "model": MODEL}, timeout=120)
        response.raise_for_status()
        vectors += [row["embedding"] for row in response.json()["data"]]
    return np.asarray(vectors, dtype=np.float32)


def _suite_scores(bundle: Path) -> dict[str, dict[str, float]]:
    """Each graph of the bundle on the offline suite, in points (the same tasks, both variants)."""
    from evaluation.embedding_model import load_model
    from evaluation.suite import run_suite

    scores = {}
    for variant in ("int8", "fp32"):
        report = run_suite(load_model(bundle, variant=variant), progress=False)
        scores[variant] = {**report["scores"], "average": statistics.mean(report["scores"].values())}
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of each server")
    parser.add_argument("--registry", type=Path, default=None, help="a registry that already serves minilm-l6")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--quality", action="store_true", help="also score both graphs on the offline suite")
    args = parser.parse_args(argv)

    registry = args.registry or Path(tempfile.mkdtemp(prefix="bench-int8-"))
    if args.registry is None:
        subprocess.run(
            [sys.executable, "-m", "embedder.cli", "export", MODEL, "--name", MODEL, "--registry", str(registry),
             "--promote", "--quantize", "auto"],
            check=True, cwd=ROOT,
        )  # fmt: skip
    short, paragraphs = workloads()
    loads = {"short": _chunks(short[:1024], 32), "paragraphs": _chunks(paragraphs[:256], 32)}
    servers = {"int8": _server(registry, True, args.threads), "fp32": _server(registry, False, args.threads)}
    try:
        for proc, url in servers.values():
            _wait_ready(url, proc)
        graphs = {arm: httpx.get(f"{url}/v1/models").json()["data"][0] for arm, (_, url) in servers.items()}
        served = {arm: _embed(url, short[:256] + paragraphs[:64]) for arm, (_, url) in servers.items()}
        rates: dict[str, dict[str, list[float]]] = {load: {arm: [] for arm in servers} for load in loads}
        for round_ in range(args.rounds):
            for load, batches in loads.items():
                for arm, (_, url) in servers.items():
                    result = asyncio.run(_load(url, batches, 8, f"{arm} {load}"))
                    assert result.errors == 0, f"{arm} {load}: {result.errors} failed requests"
                    rates[load][arm].append(result.texts_per_s)
            print(f"round {round_ + 1}/{args.rounds}: " + ", ".join(
                f"{load} int8 {r['int8'][-1]:.0f} / fp32 {r['fp32'][-1]:.0f} texts/s" for load, r in rates.items()
            ))  # fmt: skip
    finally:
        for proc, _ in servers.values():
            _stop(proc)

    cos = cosines(served["int8"], served["fp32"])
    report = {
        "cpu": cpu_features(),
        "graphs": {arm: {key: g[key] for key in ("quantization", "int8_check")} for arm, g in graphs.items()},
        "int8_vs_fp32_cosine": {"mean": float(cos.mean()), "min": float(cos.min()), "texts": len(cos)},
        "texts_per_s": {load: {arm: statistics.median(v) for arm, v in r.items()} for load, r in rates.items()},
        "paired_ratio": {
            load: statistics.median(a / b for a, b in zip(r["int8"], r["fp32"], strict=True))
            for load, r in rates.items()
        },
        "rounds": args.rounds,
        "threads": args.threads,
    }
    if args.quality:
        report["suite"] = _suite_scores(registry / MODEL / "current")
    print(json.dumps(report, indent=2))
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
