"""int8 chosen by measurement: try optimum's CPU-target presets, keep the fastest that passes parity here.

onnxruntime's dynamic int8 MatMul multiplies u8 activations by s8 weights. Without VNNI (AVX2 and
plain AVX-512) the 16-bit intermediate sums of that kernel saturate, so a graph with full 8-bit
weights can lose precision on one CPU and not on another: measured on an AMD EPYC (AVX2), minilm-l3
per-channel int8 kept mean / min cosine 0.985 / 0.965 to torch with 8-bit weights and 0.996 / 0.993
with optimum's ``reduce_range`` (7-bit weights, no saturation). Each candidate below is an
``optimum.onnxruntime.AutoQuantizationConfig`` preset; all are per-channel (per-tensor scales miss
the bars on MiniLM, min cosine ≈ 0.92).

The chosen graph is recorded in the manifest with the CPU it was checked on; because the serving
CPU may differ, the service checks it again at load (`core.engines.load_engine`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import quantize_dynamic
from optimum.onnxruntime.configuration import AutoQuantizationConfig, QuantizationConfig

from core.runtime import OnnxBundle, ParityBars, cosines, cpu_features, int8_failures

log = logging.getLogger(__name__)

# A candidate no more than this much slower than the fastest passing one still wins if it comes first in
# CANDIDATES: the timing of a few probe batches is noisy, and earlier candidates are the portable ones.
SPEED_TOLERANCE = 0.10


@dataclass(frozen=True)
class Candidate:
    """One int8 setting: an optimum preset and its ``reduce_range``."""

    name: str
    preset: str
    reduce_range: bool
    why: str

    def config(self) -> QuantizationConfig:
        make = getattr(AutoQuantizationConfig, self.preset)
        kwargs: dict[str, Any] = {"is_static": False, "per_channel": True}
        if self.preset != "avx512_vnni":  # VNNI has no saturation to avoid: its preset takes no reduce_range
            kwargs["reduce_range"] = self.reduce_range
        return make(**kwargs)


# In order of preference: the first one is right on every x86 CPU, the others may be faster on some.
CANDIDATES = (
    Candidate("avx512-reduce-range", "avx512", True, "u8×s8 with 7-bit weights: no saturation without VNNI"),
    Candidate("avx512-vnni", "avx512_vnni", False, "u8×s8 with 8-bit weights: exact on VNNI, saturates without"),
    Candidate("avx2", "avx2", False, "u8×u8 with 8-bit weights (optimum's AVX2 preset)"),
)


def quantize(src: Path, dst: Path, config: QuantizationConfig) -> Path:
    """Dynamic int8 quantisation of ``src`` with an optimum preset's settings.

    optimum's ``ORTQuantizer.quantize`` makes the same onnxruntime call but cannot pass
    ``DefaultTensorType``, which the quantiser needs to type the outputs of the fused contrib ops
    (Attention, SkipLayerNormalization) that ONNX shape inference cannot ("Unable to find data type
    for weight_name=..."); so the preset's fields are handed to onnxruntime here.
    """
    hint = _QuietPreprocessHint()
    logging.getLogger().addFilter(hint)
    try:
        _quantize_dynamic(src, dst, config)
    finally:
        logging.getLogger().removeFilter(hint)
    return Path(dst)


def _quantize_dynamic(src: Path, dst: Path, config: QuantizationConfig) -> None:
    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=config.weights_dtype,
        op_types_to_quantize=[getattr(op, "value", op) for op in config.operators_to_quantize],
        extra_options={
            "WeightSymmetric": config.weights_symmetric,
            "ActivationSymmetric": config.activations_symmetric,
            "DefaultTensorType": onnx.TensorProto.FLOAT,
        },
    )


def _timings(bundles: dict[str, OnnxBundle], texts: Sequence[str], rounds: int = 5) -> dict[str, float]:
    """Best time per bundle to embed ``texts``, measured in alternating rounds so drifting load on a shared
    machine hits every candidate alike (the best is the run least disturbed by it)."""
    best = dict.fromkeys(bundles, float("inf"))
    for _ in range(rounds):
        for name, bundle in bundles.items():
            started = time.perf_counter()
            bundle.encode(texts, batch_size=16)
            best[name] = min(best[name], time.perf_counter() - started)
    return best


class _QuietPreprocessHint(logging.Filter):
    """onnxruntime's quantiser logs a hint to pre-process image models on the root logger at every call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def choose_int8(
    bundle_dir: Path,
    target: str,
    reference: np.ndarray,
    texts: Sequence[str],
    *,
    candidates: Sequence[Candidate] = CANDIDATES,
    bars: ParityBars = ParityBars(),
    threads: int = 2,
) -> dict[str, Any]:
    """Quantise ``bundle_dir``'s fp32 graph with every candidate, measure parity and speed on ``texts``, and
    keep the chosen one as ``bundle_dir / target``.

    Returns the manifest's ``int8`` record: ``chosen`` (a candidate name, or None when none passes),
    ``checked_on`` (this CPU) and every candidate's figures and failures.
    """
    fp32 = bundle_dir / "model.onnx"
    tried: list[dict[str, Any]] = []
    passing: dict[str, OnnxBundle] = {}
    for candidate in candidates:
        path = bundle_dir / f"int8-{candidate.name}.onnx"
        config = candidate.config()
        quantize(fp32, path, config)
        bundle = OnnxBundle(bundle_dir, variant="int8", onnx_file=path.name, intra_op_threads=threads)
        cos = cosines(bundle.encode(texts, batch_size=16), reference)
        failures = int8_failures(cos, bars, texts)
        tried.append({
            "name": candidate.name,
            "preset": candidate.preset,
            "per_channel": config.per_channel,
            "reduce_range": config.reduce_range,
            "weights": config.weights_dtype.name,
            "activations": config.activations_dtype.name,
            "mean_cosine": float(np.mean(cos)),
            "min_cosine": float(np.min(cos)),
            "seconds": None,
            "failures": failures,
            "file": path.name,
        })  # fmt: skip
        if not failures:
            passing[candidate.name] = bundle
    seconds = _timings(passing, texts)
    for entry in tried:
        entry["seconds"] = seconds.get(entry["name"])
        log.info("int8 candidate %s: %s", entry["name"], entry)
    chosen = _pick(tried)
    for entry in tried:
        file = bundle_dir / entry.pop("file")
        if chosen is not None and entry["name"] == chosen:
            file.rename(bundle_dir / target)
        else:
            file.unlink()
    return {"chosen": chosen, "checked_on": cpu_features(), "candidates": tried}


def _pick(tried: list[dict[str, Any]]) -> str | None:
    """The first passing candidate within `SPEED_TOLERANCE` of the fastest passing one."""
    passing = [entry for entry in tried if not entry["failures"]]
    if not passing:
        return None
    fastest = min(entry["seconds"] for entry in passing)
    return next(entry["name"] for entry in passing if entry["seconds"] <= fastest * (1 + SPEED_TOLERANCE))
