"""An int8 graph for OpenVINO: NNCF's post-training quantisation of the bundle's fp32 graph, saved as OpenVINO IR.

onnxruntime cannot hand its int8 graph to OpenVINO (``QAttention``, ``QEmbedLayerNormalization`` are onnxruntime's
own ops), so OpenVINO's int8 kernels (VNNI, AMX) need a graph of their own. ``nncf.quantize`` (transformer model
type: int8 matmuls, activations' ranges from a calibration set) makes it from ``model.onnx``; what NNCF leaves in
floating point runs at f32 (`OPENVINO_INT8_FLOAT_PRECISION`), the same on every CPU.

Calibration is static: the activations' ranges are fixed from `calibration_texts`, which share nothing with the
probe set the graph is then held against (`export.probes`) — gensim's Lee background news (sentences and whole
documents, a dependency's data) and single words and punctuation from it, because a text of one or two tokens has
activations far outside a sentence's (calibrated on sentences alone, the probe ``?`` fell to cosine 0.90). The graph
is kept only where it keeps the int8 parity bars here; each serving CPU checks it again at load (`core.engines`).

Measured on minilm-l6 (AMD EPYC, AVX-512 VNNI and BF16, no AMX; docs/BENCHMARKS.md): 8-11 s to build; cosine
to torch 0.996 / 0.975-0.977 (mean / min) on the probes, 0.996 / 0.991 on 256 texts of neither set (onnxruntime's
int8 graph: 0.990 / 0.975 and 0.988 / 0.978).
"""

from __future__ import annotations

import contextlib
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.corpora import lee_background
from core.runtime import OnnxBundle, ParityBars, cpu_features, int8_failures, probe_cosines
from core.text import split_sentences

log = logging.getLogger(__name__)

OPENVINO_INT8_VARIANT = "openvino-int8"  # its name among the bundle's graphs (core.runtime.graph_files)
OPENVINO_INT8_FILE = "model_openvino_int8.xml"  # with its weights beside it in model_openvino_int8.bin
OPENVINO_INT8_FLOAT_PRECISION = "f32"  # what NNCF leaves in floating point runs at (core.engines' openvino-int8)
CALIBRATION_SIZES = {"fragments": 32, "sentences": 32, "documents": 32}
# SmoothQuant's migration strength for the matmuls (NNCF's transformer default: 0.95). On minilm-l6, three
# calibration draws each: 0.75 kept the probes at min cosine 0.975-0.977 and 256 texts of neither set at 0.991-0.992;
# 0.95 0.967-0.971 / 0.991; 0.5 0.965-0.972 / 0.976-0.979; SmoothQuant off 0.969-0.973 / 0.975-0.979.
SMOOTH_QUANT_ALPHA = 0.75


def calibration_texts(seed: int = 0) -> list[str]:
    """96 texts, fixed: punctuation marks, one- to three-word fragments, sentences and whole news documents of
    gensim's Lee background corpus (see the module docstring for why each)."""
    rng = random.Random(seed)
    documents = list(lee_background())
    words = [word for document in documents[:50] for word in document.split()]
    marks = list("!.,;:-'\"")  # no "?": a probe text
    n_fragments = CALIBRATION_SIZES["fragments"] - len(marks)
    fragments = [" ".join(words[i : i + 1 + i % 3]) for i in rng.sample(range(len(words) - 3), n_fragments)]
    sentences = [s for document in documents[:100] for s in split_sentences(document)]
    picked = rng.sample(sentences, CALIBRATION_SIZES["sentences"])
    return marks + fragments + picked + documents[100 : 100 + CALIBRATION_SIZES["documents"]]


def openvino_int8_missing() -> str:
    """Why this machine cannot build the graph ('' when it can): OpenVINO and NNCF must both import."""
    try:
        import nncf  # noqa: F401
        import openvino  # noqa: F401
    except ImportError as error:
        return f"OpenVINO's int8 graph needs openvino and nncf: {error}"
    return ""


def remove_openvino_int8(bundle_dir: Path) -> None:
    """Delete the graph's files (`OPENVINO_INT8_FILE` and its weights) from ``bundle_dir``, where there are any."""
    target = bundle_dir / OPENVINO_INT8_FILE
    for file in (target, target.with_suffix(".bin")):
        file.unlink(missing_ok=True)


def build_openvino_int8(
    bundle_dir: Path,
    reference: np.ndarray,
    texts: Sequence[str],
    *,
    bars: ParityBars = ParityBars(),
    threads: int = 2,
) -> dict[str, Any]:
    """Quantise ``bundle_dir``'s ``model.onnx`` with NNCF into `OPENVINO_INT8_FILE` and hold it against
    ``reference`` (the fp32 torch embeddings of ``texts``, the probes) with the int8 bars on this CPU; the files
    are removed when it misses them.

    Returns the manifest's ``openvino_int8`` record: ``kept``, the cosines, ``failures``, the calibration's size,
    the seconds it took and ``checked_on`` (this CPU).
    """
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    started = time.perf_counter()
    fp32 = OnnxBundle(bundle_dir, variant="fp32")
    calibration = calibration_texts()
    samples = [fp32.pad(fp32.tokenize([text])) for text in calibration]
    model = ov.Core().read_model(str(bundle_dir / "model.onnx"))
    smoothing = AdvancedSmoothQuantParameters(matmul=SMOOTH_QUANT_ALPHA)
    with contextlib.redirect_stdout(sys.stderr):  # NNCF's progress bars: stdout is the export command's answer
        quantised = nncf.quantize(
            model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(samples),
            advanced_parameters=AdvancedQuantizationParameters(smooth_quant_alphas=smoothing),
        )  # fmt: skip
    target = bundle_dir / OPENVINO_INT8_FILE
    ov.save_model(quantised, str(target))
    bundle = OnnxBundle(
        bundle_dir, onnx_file=target.name, runtime="openvino", precision=OPENVINO_INT8_FLOAT_PRECISION,
        intra_op_threads=threads,
    )  # fmt: skip
    cos = probe_cosines(bundle, texts, reference)  # static scales: the same in any batch, checked as every graph
    failures = int8_failures(cos, bars, texts, label=OPENVINO_INT8_VARIANT)
    if failures:
        remove_openvino_int8(bundle_dir)
    record = {
        "kept": not failures,
        "file": OPENVINO_INT8_FILE if not failures else None,
        "mean_cosine": float(np.mean(cos)),
        "min_cosine": float(np.min(cos)),
        "failures": failures,
        "calibration_texts": len(calibration),
        "seconds": round(time.perf_counter() - started, 1),
        "checked_on": cpu_features(),
    }
    log.info("OpenVINO int8 graph: %s", record)
    return record
