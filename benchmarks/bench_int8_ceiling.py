"""How close the served engine runs to this CPU's int8 matrix units, and whether a multiple of a peer's rate fits.

A batch of a BERT-like encoder is mostly matrix products: each token meets every weight matrix once (the Q/K/V,
output and feed-forward projections, read from the fp32 graph's 2-D weights) and, per layer, the attention scores
and their mix (2 x padded length x hidden multiply-adds: `macs_per_text`). For each of bench_peers' loads of 32-text
requests, this script runs the load's texts in length-sorted batches of 32 (as bench_peers' in-process ceiling does)
on the engine the server would choose here (`core.engines.load_engine`), counts their multiply-adds, and times this
CPU's own int8 kernels on the model's feed-forward shapes at a batch's token count (onnxruntime's ``MatMulInteger``,
the VNNI/AMX kernels its int8 graphs run: `gemm_rate`). Printed per load: texts/s, multiply-adds per second, and
their share of the kernels' rate — what the whole graph, with its attention, layer norms, GELUs and quantisation
steps, does of what its largest matmuls alone could. With ``--peers`` (a `bench_peers.py --out` report of the same
CPU), the texts/s ``--times`` infinity's best arm would take on that load, as a share of the kernels' rate: near or
above 1, no engine running the same model at int8 reaches it on this CPU; far below 1, the graph is what to work on.
Both shares are of in-process rates: a server carries less than its engine's in-process rate, so a served target
asks the graph for more than the share printed.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_int8_ceiling.py --bundle state/registry/minilm-l6/current \
        --peers /tmp/peers.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from bench_peers import INFINITY_FP32, INFINITY_INT8, LOADS
from bench_service import server_spinning, workloads
from onnx import TensorProto, helper, numpy_helper
from report_file import write_report

from core.engine_choice import BY_NAME
from core.engines import load_engine
from core.registry import read_manifest
from core.runtime import cpu_features, cpu_text, graph_files, session_options

WEIGHT_OPS = ("MatMul", "Gemm", "Attention", "MatMulInteger", "FusedMatMul")
BATCH_LOADS = ("32 short texts, 8 clients", "32 paragraphs, 8 clients")  # bench_peers' loads of 32-text requests
MIN_SECONDS = 0.5  # each kernel timing runs at least this long; the median of the rounds is printed
BATCH = 32  # texts per batch, as bench_peers' in-process ceiling runs its loads


def weight_macs_per_token(bundle: Path) -> int:
    """Multiply-adds one token costs in the fp32 graph's weight matrices (each 2-D initializer a matmul reads)."""
    graph = onnx.load(str(bundle / graph_files(read_manifest(bundle))["fp32"])).graph
    weights = {init.name: tuple(init.dims) for init in graph.initializer if len(init.dims) == 2}
    total = 0
    for node in graph.node:
        if node.op_type in WEIGHT_OPS:
            shapes = [weights[name] for name in node.input if name in weights]
            if shapes:
                rows, cols = shapes[0]
                total += rows * cols
    return total


def macs_per_text(weight_macs: int, layers: int, hidden: int, width: int) -> int:
    """Multiply-adds of one text padded to ``width`` tokens: the weights once per token, and per layer the attention
    scores and their mix (Q·Kᵀ and A·V: 2 x width x hidden per token)."""
    return width * (weight_macs + 2 * layers * width * hidden)


def _int8_matmul(k: int, n: int) -> bytes:
    """An ONNX graph ``A (M x k, uint8) x B (k x n, int8 constant) -> int32``, as a dynamic-int8 graph runs it."""
    b = numpy_helper.from_array(np.random.default_rng(0).integers(-127, 128, (k, n), dtype=np.int8), "B")
    node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
    graph = helper.make_graph(
        [node], "int8_matmul", [helper.make_tensor_value_info("A", TensorProto.UINT8, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, ["M", n])], initializer=[b],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime this project pins reads
    return model.SerializeToString()


def gemm_rate(tokens: int, hidden: int, inner: int, threads: int, seconds: float = MIN_SECONDS) -> float:
    """Multiply-adds per second of onnxruntime's int8 kernels on a batch's two feed-forward products
    (``tokens x hidden x inner`` and ``tokens x inner x hidden``), run back to back as the graph runs them, for at
    least ``seconds``."""
    options = session_options(threads, spinning=server_spinning())
    sessions = [ort.InferenceSession(_int8_matmul(k, n), options, providers=["CPUExecutionProvider"])
                for k, n in ((hidden, inner), (inner, hidden))]  # fmt: skip
    rng = np.random.default_rng(1)
    feeds = [{"A": rng.integers(0, 256, (tokens, k), dtype=np.uint8)} for k in (hidden, inner)]
    for session, feed in zip(sessions, feeds, strict=True):
        session.run(None, feed)
    runs, started = 0, time.perf_counter()
    while runs == 0 or time.perf_counter() - started < seconds:
        for session, feed in zip(sessions, feeds, strict=True):
            session.run(None, feed)
        runs += 1
    return runs * 2 * tokens * hidden * inner / (time.perf_counter() - started)


def openvino_profile(bundle: Path, engine: str, feeds: list[dict[str, np.ndarray]], threads: int) -> dict[str, float]:
    """Each OpenVINO operator kind's share of the time ``engine`` (an OpenVINO candidate, compiled as the server
    compiles it) spends running ``feeds`` once, from OpenVINO's own performance counters: what is matmul and what is
    everything else."""
    import openvino as ov

    candidate = BY_NAME[engine]
    file = bundle / graph_files(read_manifest(bundle))[candidate.graph]
    config = {"INFERENCE_PRECISION_HINT": candidate.inference_precision, "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": True}  # fmt: skip
    request = ov.Core().compile_model(str(file), "CPU", config).create_infer_request()
    seconds: Counter[str] = Counter()
    request.infer(feeds[0])
    for feed in feeds:
        request.infer(feed)
        for op in request.profiling_info:
            seconds[f"{op.node_type} ({op.exec_type})"] += op.real_time.total_seconds()
    total = sum(seconds.values())
    return {kind: spent / total for kind, spent in seconds.most_common()}


def peer_rates(report: dict[str, Any]) -> dict[str, float]:
    """Infinity's best arm per batch load of a bench_peers report: the median over rounds of the faster arm's
    texts/s."""
    best: dict[str, list[float]] = {}
    for round_ in sorted({row["round"] for row in report["rows"]}):
        for load in BATCH_LOADS:
            rates = [row["texts_per_s"] for row in report["rows"] if row["round"] == round_ and row["load"] == load
                     and row["arm"] in (INFINITY_FP32, INFINITY_INT8)]  # fmt: skip
            if rates:
                best.setdefault(load, []).append(max(rates))
    return {load: statistics.median(rates) for load, rates in best.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True, help="a bundle folder (its fp32 graph is counted)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="inference threads")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peers", type=Path, default=None, help="a bench_peers.py --out report of this CPU")
    parser.add_argument("--times", type=float, default=2.0, help="the multiple of the peer's rate to test")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 20:
        parser.error("keep it bounded: 1-20 rounds")
    if args.peers is not None and not set(LOADS) >= set(BATCH_LOADS):
        parser.error("bench_peers no longer has the batch loads this script reads")
    manifest = read_manifest(args.bundle)
    layers, hidden = int(manifest["layers"]), int(manifest["dim"])
    weight_macs = weight_macs_per_token(args.bundle)
    inner = (weight_macs // layers - 4 * hidden * hidden) // (2 * hidden)  # per layer: Q, K, V, O, then up and down
    engine, choice = load_engine(args.bundle, intra_op_threads=args.threads, spinning=server_spinning())
    cpu = cpu_features()
    print(f"CPU: {cpu_text(cpu)}, {args.threads} threads; served here: {choice.reason}", flush=True)
    print(f"{weight_macs / 1e6:.2f} M multiply-adds per token in the weights ({layers} layers, hidden {hidden}, "
          f"feed-forward {inner})", flush=True)  # fmt: skip
    short, paragraphs = workloads()
    texts = {"short": short, "paragraphs": paragraphs}
    batches: dict[str, list[dict[str, np.ndarray]]] = {}
    for load in BATCH_LOADS:  # the load's texts in length-sorted batches of 32, as `OnnxBundle.encode` runs them
        kind, _per_request, _concurrency, n = LOADS[load]
        encodings = sorted(engine.tokenize(texts[kind][:n]), key=lambda e: -len(e.ids))
        batches[load] = [engine.pad(encodings[i : i + BATCH]) for i in range(0, n, BATCH)]
    shapes = {load: [feed["input_ids"].shape for feed in feeds] for load, feeds in batches.items()}
    counts = {load: sum(rows for rows, _ in shapes[load]) for load in batches}
    samples: dict[str, dict[str, list[float]]] = {load: {"texts_per_s": [], "kernels": []} for load in batches}
    for _ in range(args.rounds):
        for load, feeds in batches.items():
            started = time.perf_counter()
            for feed in feeds:
                engine.run(feed)
            samples[load]["texts_per_s"].append(counts[load] / (time.perf_counter() - started))
            tokens = round(statistics.mean(rows * width for rows, width in shapes[load]))
            samples[load]["kernels"].append(gemm_rate(tokens, hidden, inner, args.threads))
    peers = peer_rates(json.loads(args.peers.read_text())) if args.peers else {}
    results = {}
    print("| load (its texts in batches of 32) | texts/s | G multiply-adds/s | int8 kernels alone, G/s | share |"
          + (f" {args.times:g}x infinity's best, texts/s | its share |" if peers else ""))  # fmt: skip
    for load in batches:
        n = counts[load]
        per_text = sum(rows * macs_per_text(weight_macs, layers, hidden, width) for rows, width in shapes[load]) / n
        rate = statistics.median(samples[load]["texts_per_s"])
        kernels = statistics.median(samples[load]["kernels"])
        result = {"texts": n, "macs_per_text": per_text, "texts_per_s": rate, "macs_per_s": rate * per_text,
                  "int8_kernel_macs_per_s": kernels, "share": rate * per_text / kernels}  # fmt: skip
        line = (f"| {load} | {rate:.1f} | {rate * per_text / 1e9:.1f} | {kernels / 1e9:.1f} | "
                f"{result['share']:.2f} |")  # fmt: skip
        if load in peers:
            wanted = args.times * peers[load]
            result |= {"peer_texts_per_s": peers[load], "wanted_texts_per_s": wanted,
                       "wanted_share": wanted * per_text / kernels}  # fmt: skip
            line += f" {wanted:.1f} | {result['wanted_share']:.2f} |"
        elif peers:
            line += " | |"
        print(line, flush=True)
        results[load] = result
    report = {"cpu": cpu, "threads": args.threads, "rounds": args.rounds, "engine": choice.as_dict(),
              "weight_macs_per_token": weight_macs, "loads": results}  # fmt: skip
    largest = max(choice.routes, key=lambda route: max((r * w for r, w in route.shapes), default=0)).engine
    if BY_NAME[largest].runtime == "openvino":
        profile = {load: openvino_profile(args.bundle, largest, feeds, args.threads) for load, feeds in batches.items()}
        for load, shares in profile.items():
            top = ", ".join(f"{kind} {share:.1%}" for kind, share in list(shares.items())[:6])
            print(f"{largest} on {load}, share of its operators' time: {top}", flush=True)
        report["openvino_profile"] = {"engine": largest, "shares": profile}
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
