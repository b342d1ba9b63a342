"""int8 chosen by measurement: try optimum's CPU-target presets, keep the fastest that passes parity here.

onnxruntime's dynamic int8 MatMul multiplies u8 activations by s8 weights. Without VNNI (AVX2 and
plain AVX-512) the 16-bit intermediate sums of that kernel saturate, so a graph with full 8-bit
weights can lose precision on one CPU and not on another: measured on an AMD EPYC (AVX2), minilm-l3
per-channel int8 kept mean / min cosine 0.985 / 0.965 to torch with 8-bit weights and 0.996 / 0.993
with optimum's ``reduce_range`` (7-bit weights, no saturation). Each candidate below is an
``optimum.onnxruntime.AutoQuantizationConfig`` preset; all are per-channel (per-tensor scales miss
the bars on MiniLM, min cosine ≈ 0.92).

Where none of those keeps the bars, mixed-precision candidates are tried before giving up on int8 (an fp32-only
bundle runs at about half the int8 speed): the same first preset with the feed-forward output projections — the
matmuls after GELU, whose inputs carry the outlier values per-tensor activation scales handle worst — left in fp32,
the first layer's alone, then every layer's. On minilm-l6 the first layer's in fp32 lifted the mean cosine on
random-word texts from 0.987-0.988 to 0.991 at 0.92-0.97x the speed, every layer's to 0.994-0.995 at 0.69-0.79x
(docs/BENCHMARKS.md, "int8 that keeps the bars beyond the probes").

Dynamic int8 quantises each activation with one scale over the whole batch, padding included, so a text's vector
depends on what it is batched with: each candidate is held to the bars on the probes in length-sorted and in
mixed-length batches, each probe at its worse (`core.runtime.probe_cosines`). On minilm-l6 (AMD EPYC, AVX-512 VNNI)
the three presets kept min cosine 0.973-0.975 in sorted batches and 0.960-0.970 in mixed ones; the first fallback
0.976 / 0.971.

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

from core.runtime import OnnxBundle, ParityBars, cpu_features, int8_failures, probe_cosines

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
    fp32_ffn_outputs: int | None = 0  # feed-forward output matmuls left in fp32: the first n, or every one (None)

    @property
    def fallback(self) -> bool:
        """Tried only when no full-int8 candidate before it passed: it gives up speed for precision."""
        return self.fp32_ffn_outputs != 0

    def config(self) -> QuantizationConfig:
        make = getattr(AutoQuantizationConfig, self.preset)
        kwargs: dict[str, Any] = {"is_static": False, "per_channel": True}
        if self.preset != "avx512_vnni":  # VNNI has no saturation to avoid: its preset takes no reduce_range
            kwargs["reduce_range"] = self.reduce_range
        return make(**kwargs)

    def fp32_nodes(self, model: onnx.ModelProto) -> list[str]:
        """The nodes of ``model`` this candidate leaves in fp32."""
        outputs = ffn_output_matmuls(model)
        return outputs if self.fp32_ffn_outputs is None else outputs[: self.fp32_ffn_outputs]


# In order of preference: the first one is right on every x86 CPU, the next two may be faster on some; the last two,
# the first with more of the graph in fp32, are fallbacks (tried only when none of the three passes).
CANDIDATES = (
    Candidate("avx512-reduce-range", "avx512", True, "u8×s8 with 7-bit weights: no saturation without VNNI"),
    Candidate("avx512-vnni", "avx512_vnni", False, "u8×s8 with 8-bit weights: exact on VNNI, saturates without"),
    Candidate("avx2", "avx2", False, "u8×u8 with 8-bit weights (optimum's AVX2 preset)"),
    Candidate("first-ffn-fp32", "avx512", True, "the first, its first feed-forward output in fp32", 1),
    Candidate("ffn-fp32", "avx512", True, "the first, every feed-forward output in fp32", None),
)


def ffn_output_matmuls(model: onnx.ModelProto) -> list[str]:
    """The feed-forward output projections of ``model`` in graph order: the MatMul nodes whose weight (an
    initializer) maps a wider input to a narrower output, (intermediate, hidden) — found by shape, not by name, so
    any exported architecture (BERT, MPNet, ELECTRA…) has them. Attention's projections are square or fused."""
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    found = []
    for node in model.graph.node:
        weight = shapes.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is not None and len(weight) == 2 and weight[0] > weight[1]:
            found.append(node.name)
    return found


def quantize(src: Path, dst: Path, config: QuantizationConfig, fp32_nodes: Sequence[str] = ()) -> Path:
    """Dynamic int8 quantisation of ``src`` with an optimum preset's settings, ``fp32_nodes`` left unquantised.

    optimum's ``ORTQuantizer.quantize`` makes the same onnxruntime call but cannot pass
    ``DefaultTensorType``, which the quantiser needs to type the outputs of the fused contrib ops
    (Attention, SkipLayerNormalization) that ONNX shape inference cannot ("Unable to find data type
    for weight_name=..."); so the preset's fields are handed to onnxruntime here.
    """
    hint = _QuietPreprocessHint()
    logging.getLogger().addFilter(hint)
    try:
        _quantize_dynamic(src, dst, config, fp32_nodes)
    finally:
        logging.getLogger().removeFilter(hint)
    return Path(dst)


def _quantize_dynamic(src: Path, dst: Path, config: QuantizationConfig, fp32_nodes: Sequence[str]) -> None:
    quantize_dynamic(
        str(src),
        str(dst),
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        weight_type=config.weights_dtype,
        op_types_to_quantize=[getattr(op, "value", op) for op in config.operators_to_quantize],
        nodes_to_exclude=list(fp32_nodes),
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
    keep the chosen one as ``bundle_dir / target``. A `Candidate.fallback` is tried only when no candidate before it
    passed.

    Returns the manifest's ``int8`` record: ``chosen`` (a candidate name, or None when none passes),
    ``checked_on`` (this CPU) and every candidate's figures and failures.
    """
    fp32 = bundle_dir / "model.onnx"
    tried: list[dict[str, Any]] = []
    passing: dict[str, OnnxBundle] = {}
    for candidate in candidates:
        if candidate.fallback and passing:
            continue
        path = bundle_dir / f"int8-{candidate.name}.onnx"
        config = candidate.config()
        # the graph is read only for a fallback: most exports never reach one
        fp32_nodes = candidate.fp32_nodes(onnx.load(str(fp32), load_external_data=False)) if candidate.fallback else []
        quantize(fp32, path, config, fp32_nodes)
        bundle = OnnxBundle(bundle_dir, variant="int8", onnx_file=path.name, intra_op_threads=threads)
        cos = probe_cosines(bundle, texts, reference)  # sorted and mixed-length batches: padding moves int8
        failures = int8_failures(cos, bars, texts)
        tried.append({
            "name": candidate.name,
            "preset": candidate.preset,
            "per_channel": config.per_channel,
            "reduce_range": config.reduce_range,
            "weights": config.weights_dtype.name,
            "activations": config.activations_dtype.name,
            "fp32_matmuls": fp32_nodes,
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
