"""Every int8 setting the export can choose (`export.quantize.CANDIDATES`, the fallbacks with fp32 feed-forward
outputs included), in process on onnxruntime: what each keeps of the fp32 vectors beyond the probes, and its speed.

The bundle's fp32 ``model.onnx`` is quantised with each candidate into a scratch copy of the bundle (symlinks to its
files). Printed per candidate: the cosine (mean / min) to the fp32 reference on the probes (the bundle's torch
references, what the export's and the load's bars are checked on) and on held-out texts the probes do not hold
(reference: the fp32 graph on onnxruntime) — bench_service's seeded texts (128 short, 128 paragraphs within
``max_seq_length``; words drawn at random, as every server benchmark sends them) and 200 news sentences (gensim's Lee
background documents 150-249, which neither the probes nor OpenVINO's int8 calibration read) — and its speed as a
multiple of the first candidate's (the export's usual choice) on one text, 32 short texts and 20 paragraphs, the
candidates taking turns, the order alternating from round to round, medians.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_int8_precision.py --bundle runs/reg/minilm-l6/current --rounds 7
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bench_service import server_spinning, workloads
from bundle_args import bundle_arguments, bundle_probes
from report_file import write_report

from core.corpora import lee_background
from core.runtime import OnnxBundle, cosines, cpu_features
from core.text import split_sentences
from export.quantize import CANDIDATES, quantize

ONE_TEXT_RUNS = 40  # one-text runs per round (different texts): each is ~2 ms, so one alone is mostly noise


def quantised(bundle_dir: Path, scratch: Path, threads: int) -> dict[str, OnnxBundle]:
    """Each candidate's int8 graph of the bundle's fp32 graph, opened as the service opens int8 graphs."""
    for file in bundle_dir.iterdir():
        (scratch / file.name).symlink_to(file.resolve())
    fp32 = bundle_dir / "model.onnx"
    graph = onnx.load(str(fp32), load_external_data=False)
    bundles = {}
    for candidate in CANDIDATES:
        file = f"int8-{candidate.name}.onnx"
        quantize(fp32, scratch / file, candidate.config(), candidate.fp32_nodes(graph))
        bundles[candidate.name] = OnnxBundle(
            scratch, variant="int8", onnx_file=file, intra_op_threads=threads, spinning=server_spinning()
        )
    return bundles


def main(argv: list[str] | None = None) -> int:
    args = bundle_arguments(__doc__, 5, argv)
    probe_texts, probe_reference = bundle_probes(args.bundle)
    cpu = cpu_features()
    print(f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}), {args.threads} threads", flush=True)
    reference_bundle = OnnxBundle(args.bundle, variant="fp32", intra_op_threads=args.threads)
    short, paragraphs = workloads()
    fits = [t for t in paragraphs if len(reference_bundle.tokenize([t])[0].ids) <= reference_bundle.max_seq_length]
    news = [sentence for document in list(lee_background())[150:250] for sentence in split_sentences(document)]
    held_out = {"short": short[1000:1128], "paragraphs": fits[:128], "news": random.Random(0).sample(news, 200)}
    reference = {kind: reference_bundle.encode(texts) for kind, texts in held_out.items()}
    report: dict[str, Any] = {"cpu": cpu, "threads": args.threads, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="int8-precision-") as tmp:
        bundles = quantised(args.bundle, Path(tmp), args.threads)
        first = next(iter(bundles.values()))
        feeds = {
            "1 text": [first.pad(first.tokenize([text])) for text in short[:ONE_TEXT_RUNS]],
            "32 short": [first.pad(first.tokenize(sorted(short[:32], key=len)))],
            "20 paragraphs": [first.pad(first.tokenize(paragraphs[:20]))],
        }
        for name, bundle in bundles.items():
            row: dict[str, Any] = {"probes": _figures(bundle.encode(probe_texts, batch_size=16), probe_reference)}
            for kind, texts in held_out.items():
                row[kind] = _figures(bundle.encode(texts), reference[kind])
            report[name] = row | {"seconds": {shape: [] for shape in feeds}}
        names = list(bundles)
        for round_ in range(args.rounds + 1):
            for shape, runs in feeds.items():
                for name in names if round_ % 2 else reversed(names):
                    started = time.perf_counter()
                    for feed in runs:
                        bundles[name].run(feed)
                    if round_:  # round 0 warms up
                        report[name]["seconds"][shape].append((time.perf_counter() - started) / len(runs))
    base = {shape: statistics.median(report[names[0]]["seconds"][shape]) for shape in feeds}
    for name in names:
        row = report[name]
        row["speed_vs_first"] = {s: round(base[s] / statistics.median(row["seconds"][s]), 2) for s in feeds}
        cosine = "  ".join(f"{kind} {row[kind][0]:.5f} / {row[kind][1]:.5f}" for kind in ("probes", *held_out))
        speed = "  ".join(f"{shape} {ratio:.2f}x" for shape, ratio in row["speed_vs_first"].items())
        print(f"{name:20s} cosine to fp32 (mean / min): {cosine}   speed vs {names[0]}: {speed}", flush=True)
    write_report(args.out, report)
    return 0


def _figures(vectors: np.ndarray, reference: np.ndarray) -> list[float]:
    cos = cosines(vectors, reference)
    return [round(float(cos.mean()), 5), round(float(cos.min()), 5)]


if __name__ == "__main__":
    raise SystemExit(main())
