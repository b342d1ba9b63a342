"""Our server against infinity-emb in its best CPU configurations and the in-process ceiling, in one run.

Servers on the same machine and model, loaded in turn (the order alternating round by round, so a drift of the
shared machine hits every arm alike):

* **ours** — ``embedder serve`` on one ``minilm-l6`` bundle with ``EMBED_ENGINE=auto`` (the engine chosen on this
  CPU at load; ``/v1/models`` says which), and **ours, onnxruntime int8** (the default engine);
* **infinity, fp32** and **infinity, int8** — infinity-emb's ``v2`` command with ``--engine optimum --device cpu``
  (its own onnxruntime graph optimisation on), from its own venv, on the folders `prepare_infinity.sh` builds: an
  optimum ONNX export of the same all-MiniLM-L6-v2, and beside it an int8 graph (onnxruntime's transformer
  optimisation, then dynamic int8 with optimum's avx512_vnni preset, per-channel), which infinity prefers on CPU.
  infinity finds ONNX files by globbing its model id, so it runs from inside the folder with ``--model-id .``, and
  ``--pooling-method mean``: its optimum engine pools by the CLS token unless told (its ``auto`` does not read the
  folder's pooling config), which gives vectors at cosine ~0.4 to the model's own.

Every arm's parity is measured on the same texts: cosine of what it serves to the fp32 graph run in this process by
onnxruntime (= torch within 1e-4; texts that fit both servers' token limits, so truncation does not count), sent one
text per request and 32 per request (`PARITY_REQUEST_SIZES`): a server that routes batch sizes to engines serves
each at its own engine's precision.

Loads (bench_service's seeded texts): one short text per request at concurrency 1 (p50 latency, printed beside the
in-process p50 of the same engine and graph one text at a time) and 32; 32 short texts per request at concurrency 8;
32 paragraphs per request at concurrency 8. The 32-text loads also get the in-process ceiling (batch 32, same
threads) of the engine our server chose and of onnxruntime int8, measured once per load and round, right before the
servers' runs. Printed: the median texts/s (or p50) per arm over the rounds, and per round the ratio of ours to
infinity's best arm.

    bash benchmarks/prepare_infinity.sh
    HF_HUB_OFFLINE=1 nice -n 0 .venv/bin/python benchmarks/bench_peers.py --registry /tmp/reg --rounds 3
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
import numpy as np
from bench_overload import scrape, start_server
from bench_service import MODEL, ROOT, _chunks, _free_port, _load, _post_one, _stop, server_spinning, workloads
from report_file import write_report

from core.engines import open_routes
from core.runtime import OnnxBundle, cosines, cpu_features, cpu_text
from core.settings import DEFAULT_REGISTRY_DIR

LOADS = {  # name: (kind, texts per request, concurrency, texts): every workload text of the concurrent loads, so each
    # arm runs for seconds (at ~600 texts/s 512 texts took under a second, and the arms' order swung the ratios)
    "1 text, 1 client": ("short", 1, 1, 200),
    "1 text, 32 clients": ("short", 1, 32, 2000),
    "32 short texts, 8 clients": ("short", 32, 8, 2000),
    "32 paragraphs, 8 clients": ("paragraphs", 32, 8, 500),
}


def start_infinity(executable: Path, model_dir: Path, threads: int) -> tuple[subprocess.Popen, str]:
    """infinity-emb serving ``model_dir`` with its optimum engine on the CPU, on a loopback port."""
    port = _free_port()
    cache = ROOT / "tools" / "infinity-cache" / model_dir.name  # one per folder: it caches optimised graphs by model id
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1", "HF_HOME": str(cache), "OMP_NUM_THREADS": str(threads),
    }  # fmt: skip
    command = [
        str(executable), "v2", "--model-id", ".", "--served-model-name", MODEL, "--engine", "optimum",
        "--device", "cpu", "--pooling-method", "mean", "--host", "127.0.0.1", "--port", str(port),
        "--url-prefix", "/v1",
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


# Texts per request the parity is measured at: as the one-text loads and the 32-text loads send them, since a server
# that routes batch sizes to engines serves each at its own engine's precision.
PARITY_REQUEST_SIZES = (1, 32)


def embed(url: str, texts: list[str], per_request: int = 32) -> np.ndarray:
    vectors = []
    with httpx.Client(timeout=120) as client:
        for batch in _chunks(texts, per_request):
            response = client.post(f"{url}/v1/embeddings", json={"input": batch, "model": MODEL})
            response.raise_for_status()
            vectors += [row["embedding"] for row in sorted(response.json()["data"], key=lambda r: r["index"])]
    return np.asarray(vectors, dtype=np.float32)


def cosine_figures(cos: np.ndarray) -> dict[str, float]:
    return {"mean_cosine": round(float(cos.mean()), 5), "min_cosine": round(float(cos.min()), 5)}


def parity_texts(bundle: OnnxBundle, short: list[str], paragraphs: list[str], infinity_limit: int = 512) -> list[str]:
    """128 short texts and up to 128 paragraphs that neither server cuts (ours at max_seq_length, infinity at 512)."""
    limit = min(bundle.max_seq_length, infinity_limit)
    fits = [t for t in paragraphs if len(bundle.tokenize([t])[0].ids) <= limit]
    return short[:128] + fits[:128]


def served_engine(url: str) -> dict[str, Any]:
    (card,) = [c for c in httpx.get(f"{url}/v1/models", timeout=30).json()["data"] if c["id"] == MODEL]
    return card["engine_choice"]


def in_process_p50(bundle: OnnxBundle, texts: list[str]) -> float:
    """Median milliseconds of one text through tokeniser, padding and graph in this process."""
    latencies = []
    for text in texts:
        started = time.perf_counter()
        bundle.encode([text])
        latencies.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(latencies), 2)


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


OURS, OURS_INT8, INFINITY_FP32, INFINITY_INT8 = "ours", "ours, onnxruntime int8", "infinity, fp32", "infinity, int8"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, default=ROOT / DEFAULT_REGISTRY_DIR, help="registry with minilm-l6")
    parser.add_argument("--infinity", type=Path, default=ROOT / "tools" / "infinity-venv" / "bin" / "infinity_emb")
    parser.add_argument("--infinity-model", type=Path, default=ROOT / "tools" / "infinity-model" / "all-MiniLM-L6-v2")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", default=";".join(LOADS), help="semicolon-separated subset of: " + "; ".join(LOADS))
    parser.add_argument("--compare-batch-tokens", type=int, default=None, help="an extra arm of ours with this budget")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    loads = [name for name in LOADS if name in args.loads.split(";")]
    short, paragraphs = workloads()
    texts = {"short": short, "paragraphs": paragraphs}
    bundle_dir = args.registry / MODEL / "current"
    fp32_model = args.infinity_model.with_name(args.infinity_model.name + "-fp32")
    servers = {
        OURS: start_server(
            args.registry, serve_int8=True, threads=args.threads, hold=None, env={"EMBED_ENGINE": "auto"}
        ),
        OURS_INT8: start_server(
            args.registry, serve_int8=True, threads=args.threads, hold=None, env={"EMBED_ENGINE": "onnxruntime-int8"}
        ),
        INFINITY_FP32: start_infinity(args.infinity, fp32_model, args.threads),
        INFINITY_INT8: start_infinity(args.infinity, args.infinity_model, args.threads),
    }
    if args.compare_batch_tokens:
        servers[f"ours, max_batch_tokens={args.compare_batch_tokens}"] = start_server(
            args.registry, serve_int8=True, threads=args.threads, hold=None,
            env={"EMBED_MAX_BATCH_TOKENS": str(args.compare_batch_tokens)},
        )  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        choice = served_engine(servers[OURS][1])
        print(f"ours serves {choice['engine']}: {choice['reason']} (chosen in {choice['seconds']} s)", flush=True)
        session = {"intra_op_threads": args.threads, "spinning": server_spinning()}
        in_process = {  # the served engines routed as the server routes them, and onnxruntime int8 alone
            "served": open_routes(bundle_dir, [(r["engine"], r["shapes"]) for r in choice["routes"]], **session),
            "int8": open_routes(bundle_dir, [("onnxruntime-int8", [])], **session),
        }
        reference = OnnxBundle(bundle_dir, variant="fp32", intra_op_threads=args.threads)
        same = parity_texts(reference, short, paragraphs)
        expected = reference.encode(same)
        parity: dict[str, dict[int, dict[str, float]]] = {}
        for arm, (_, url) in servers.items():
            parity[arm] = {}
            for size in PARITY_REQUEST_SIZES:
                cos = cosines(embed(url, same, size), expected)
                parity[arm][size] = cosine_figures(cos)
        print(json.dumps({"parity_texts": len(same), "parity": parity}), flush=True)
        for _, url in servers.values():  # warm-up
            run_load(url, "1 text, 32 clients", short[-64:])
        for round_ in range(1, args.rounds + 1):
            order = list(servers) if round_ % 2 else list(reversed(servers))
            for name in loads:
                kind, per_request, concurrency, n = LOADS[name]
                paired = {}
                if per_request > 1:
                    paired = {f"ceiling_{v}": ceiling(b, texts[kind][:n]) for v, b in in_process.items()}
                elif concurrency == 1:
                    paired = {"in_process_p50_ms": in_process_p50(in_process["served"], texts[kind][:n])}
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
    cpu = cpu_features()
    report = {"cpu": cpu, "threads": args.threads, "rounds": args.rounds, "engine": choice, "parity": parity,
              "rows": rows}  # fmt: skip
    print(f"CPU: {cpu_text(cpu)}, {args.threads} threads; ours serves {choice['reason']}")
    print(summary(rows, loads, parity))
    write_report(args.out, report)
    return 0


def summary(rows: list[dict[str, Any]], loads: list[str], parity: dict[str, dict[int, dict[str, float]]]) -> str:
    """Median per arm and load, the in-process figures, and per round the ratio of ours to infinity's best arm."""
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    header = " | in-process: served engine / onnxruntime int8 | ours ÷ infinity's best, per round | padding, ours |"
    lines = ["| load | " + " | ".join(arms) + header, "|---|" + "---:|" * len(arms) + "---|---|---:|"]
    for name in loads:
        of = [r for r in rows if r["load"] == name]
        key = "p50_ms" if LOADS[name][2] == 1 else "texts_per_s"
        cells = [statistics.median(r[key] for r in of if r["arm"] == arm) for arm in arms]
        in_process = ""
        if "ceiling_served" in of[0]:
            in_process = " / ".join(str(statistics.median(r[f"ceiling_{v}"] for r in of)) for v in ("served", "int8"))
        elif "in_process_p50_ms" in of[0]:
            in_process = f"p50 {statistics.median(r['in_process_p50_ms'] for r in of)} ms (served engine)"
        ratios = []
        for round_ in sorted({r["round"] for r in of}):
            by_arm = {r["arm"]: r[key] for r in of if r["round"] == round_}
            ours = by_arm[OURS]
            if key == "p50_ms":
                ratios.append(f"{min(by_arm[INFINITY_FP32], by_arm[INFINITY_INT8]) / ours:.2f}")  # above 1: ours better
            else:
                ratios.append(f"{ours / max(by_arm[INFINITY_FP32], by_arm[INFINITY_INT8]):.2f}")
        unit = " (p50 ms)" if key == "p50_ms" else ""
        cells_text = " | ".join(str(c) for c in cells)
        pad = statistics.median(r["padding"] for r in of if r["arm"] == OURS)
        lines.append(f"| {name}{unit} | {cells_text} | {in_process} | {', '.join(ratios)} | {pad} |")
    for size in PARITY_REQUEST_SIZES:
        cells = " | ".join(f"{parity[arm][size]['mean_cosine']} / {parity[arm][size]['min_cosine']}" for arm in arms)
        lines.append(f"| cosine to fp32, mean / min, {size} per request | {cells} | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
