"""OpenVINO int8 (NNCF post-training quantisation of the fp32 graph) against OpenVINO bf16 and onnxruntime int8,
in process: is it a candidate worth adding to the engine choice (`core/engines.py`)?

The bundle's fp32 ``model.onnx`` is quantised as the export does it (`export.openvino_int8`: NNCF, transformer model
type, calibrated on texts the probes do not hold), into a scratch copy of the bundle (symlinks to its files), and
compiled with OpenVINO at two precision hints for what NNCF left unquantised: bf16 (its default on a CPU with bf16
units) and f32 (every CPU; what the served ``openvino-int8`` engine uses).

Printed: the CPU, the quantisation's seconds, and per arm the median texts/s over the rounds on one batch of 32 short
texts and one of 32 paragraphs (bench_service's seeded texts; the arms alternate in order from round to round), and
the cosine (mean / min) to the fp32 reference on the probes (the bundle's torch references) and
on 256 held-out texts (128 short, 128 paragraphs; reference: the fp32 graph on onnxruntime).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_ov_int8.py --bundle runs/reg/minilm-l6/current --rounds 5
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_service import server_spinning, workloads
from bundle_args import bundle_arguments, bundle_probes
from report_file import write_report

from core.runtime import OnnxBundle, ParityBars, cosines, cpu_features
from export.openvino_int8 import OPENVINO_INT8_FILE as OV_INT8_FILE
from export.openvino_int8 import build_openvino_int8


def quantise(bundle_dir: Path, scratch: Path, probes: tuple[list[str], np.ndarray]) -> float:
    """The export's OpenVINO int8 graph of the bundle's fp32 graph (`export.openvino_int8`: its calibration texts,
    not the probes), built into ``scratch`` and kept whatever its parity, which this benchmark reports: seconds."""
    for file in bundle_dir.iterdir():
        if not file.name.startswith(Path(OV_INT8_FILE).stem):  # never write through a link into the registry
            (scratch / file.name).symlink_to(file.resolve())
    keep_all = ParityBars(int8_mean_cosine=-1.0, int8_min_cosine=-1.0)
    return float(build_openvino_int8(scratch, probes[1], probes[0], bars=keep_all)["seconds"])


def arms(bundle_dir: Path, scratch: Path, threads: int) -> dict[str, OnnxBundle]:
    session: dict[str, Any] = {"intra_op_threads": threads}
    return {
        "onnxruntime-int8": OnnxBundle(bundle_dir, variant="int8", spinning=server_spinning(), **session),
        "openvino-bf16": OnnxBundle(bundle_dir, variant="fp32", runtime="openvino", precision="bf16", **session),
        "openvino-int8 (rest bf16)": OnnxBundle(
            scratch, onnx_file=OV_INT8_FILE, runtime="openvino", precision="bf16", **session
        ),
        "openvino-int8 (rest f32)": OnnxBundle(
            scratch, onnx_file=OV_INT8_FILE, runtime="openvino", precision="f32", **session
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = bundle_arguments(__doc__, 5, argv)
    probes = bundle_probes(args.bundle)
    probe_texts, probe_reference = probes
    short, paragraphs = workloads()
    batches = {"32 short": short[:32], "32 paragraphs": paragraphs[:32]}
    held_out = short[1000:1128] + paragraphs[200:328]
    cpu = cpu_features()
    print(f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}), {args.threads} threads", flush=True)
    with tempfile.TemporaryDirectory(prefix="ov-int8-") as tmp:
        scratch = Path(tmp)
        seconds = quantise(args.bundle, scratch, probes)
        print(f"NNCF quantisation (the export's): {seconds:.1f} s", flush=True)
        bundles = arms(args.bundle, scratch, args.threads)
        reference = OnnxBundle(args.bundle, variant="fp32", intra_op_threads=args.threads).encode(held_out)
        report: dict[str, Any] = {"cpu": cpu, "threads": args.threads, "quantise_seconds": round(seconds, 1)}
        for name, bundle in bundles.items():
            on_probes = cosines(bundle.encode(probe_texts, batch_size=16), probe_reference)
            on_held_out = cosines(bundle.encode(held_out), reference)
            report[name] = {
                "probes": [round(float(on_probes.mean()), 5), round(float(on_probes.min()), 5)],
                "held_out": [round(float(on_held_out.mean()), 5), round(float(on_held_out.min()), 5)],
                **{batch: [] for batch in batches},
            }
        names = list(bundles)
        for round_ in range(args.rounds + 1):
            for batch, texts in batches.items():
                for name in names if round_ % 2 else reversed(names):
                    started = time.perf_counter()
                    bundles[name].encode(texts, batch_size=32)
                    if round_:  # round 0 warms up (OpenVINO compiles each new shape on first use)
                        report[name][batch].append(len(texts) / (time.perf_counter() - started))
    for name in names:
        row = report[name]
        speeds = {batch: round(statistics.median(row[batch]), 1) for batch in batches}
        ratio = {b: round(speeds[b] / statistics.median(report["onnxruntime-int8"][b]), 2) for b in batches}
        row["texts_per_s"], row["vs_onnxruntime_int8"] = speeds, ratio
        print(
            f"{name:28s} " + "  ".join(f"{b}: {speeds[b]:7.1f} texts/s ({ratio[b]:.2f}x)" for b in batches)
            + f"  cosine to fp32, probes {row['probes'][0]:.5f} / {row['probes'][1]:.5f},"
            f" held-out {row['held_out'][0]:.5f} / {row['held_out'][1]:.5f}",
            flush=True,
        )  # fmt: skip
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
