"""Parity of an exported bundle against the torch encoder it came from.

Like optimum's exporter validation, every check runs and every failure is collected; one
`ParityError` then lists them all, so a broken export is diagnosed in one go.

Bars: fp32 min cosine ≥ 0.9999; int8 mean cosine ≥ 0.99 and min ≥ 0.97; every output
finite and unit-norm (normalisation is in the graph); and the bundle's ``tokenizers`` tokenizer
gives the same ids as the torch side's tokenizer, so serving sees what parity measured. Each probe's cosine is the
lower of two batchings, length-sorted and mixed (`core.runtime.probe_outputs`): served batches pad short texts to
long ones, and dynamic int8 depends on that padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from core.runtime import OnnxBundle, ParityBars, cosines, cpu_features, int8_failures, probe_outputs
from export.quantize import CANDIDATES
from export.tokenizer_files import plain_ids
from training.encoder import Encoder

# How the figures were measured (the manifest's parity.batches).
BATCHINGS = "each probe at its worst of length-sorted and mixed-length batches (core.runtime.probe_outputs)"


class ParityError(ValueError):
    """An export whose ONNX output disagrees with torch; ``failures`` lists every failed check."""

    def __init__(self, failures: Sequence[str], figures: dict[str, Any]) -> None:
        self.failures = list(failures)
        self.figures = figures
        lines = "\n".join(f"  - {f}" for f in self.failures)
        super().__init__(
            f"export parity failed ({len(self.failures)} check(s)); nothing was published:\n{lines}\n"
            + _advice(self.failures)
        )


def _advice(failures: Sequence[str]) -> str:
    """What to do next: when only int8 settings missed (fp32 kept the bars), export without requiring int8."""
    settings = {candidate.name for candidate in CANDIDATES}
    if failures and all(failure.split(":", 1)[0] in settings for failure in failures):
        return (
            "fp32 kept the parity bars but no int8 setting did on this CPU: export with --quantize auto "
            '(quantize="auto": keeps fp32 when int8 misses) or --quantize none.'
        )
    return (
        "Check the source model loads and runs in torch, and that its architecture traces to ONNX "
        "(see docs/BENCHMARKS.md, Export)."
    )


def _tokenizer_mismatches(encoder: Encoder, bundle: OnnxBundle, texts: Sequence[str]) -> list[int]:
    """The probes whose ids differ from torch's, as the service tokenises them or as ``tokenizer.json`` does read
    on its own (`export.tokenizer_files`: how a user outside this project reads it)."""
    torch_ids = encoder.tokenizer(list(texts), truncation=True, max_length=encoder.max_seq_length)["input_ids"]
    served = [enc.ids for enc in bundle.tokenize(texts)]
    plain = plain_ids(bundle.path, list(texts))
    return [i for i, ids in enumerate(torch_ids) if served[i] != ids or plain[i] != ids]


def check_parity(
    encoder: Encoder,
    bundle_dir: Path,
    texts: Sequence[str],
    variants: Sequence[str],
    *,
    reference: np.ndarray | None = None,
    bars: ParityBars = ParityBars(),
    batch_size: int = 16,
) -> dict[str, Any]:
    """Compare each ONNX ``variant`` of the bundle with ``encoder`` on ``texts``.

    ``reference``: the torch encoder's ``(N, dim)`` embeddings of ``texts`` when already computed.
    Returns the figures (per variant: min/mean cosine, max abs difference, max norm error, plus the probe count,
    the bars, and the CPU and onnxruntime version that measured them). Raises `ParityError` listing every failed
    check.
    """
    if reference is None:
        reference = encoder.encode(list(texts), batch_size=batch_size)  # (N, dim)
    figures: dict[str, Any] = {
        "probes": len(texts), "batches": BATCHINGS, "bars": dict(vars(bars)), "checked_on": cpu_features(),
        "onnxruntime": ort.__version__,
    }  # fmt: skip
    failures: list[str] = []
    for variant in variants:
        bundle = OnnxBundle(bundle_dir, variant=variant, intra_op_threads=2)
        if variant == variants[0]:
            mismatched = _tokenizer_mismatches(encoder, bundle, texts)
            figures["tokenizer_mismatches"] = len(mismatched)
            if mismatched:
                failures.append(
                    f"tokenizer: the bundle's tokenizer.json (as served or read on its own) gives different ids than "
                    f"the model's tokenizer on {len(mismatched)} probe(s), e.g. {texts[mismatched[0]][:60]!r}"
                )
        try:
            sorted_out, mixed_out = probe_outputs(bundle, texts, batch_size)
        except Exception as err:  # an unrunnable graph is one more failure to list, not a crash
            failures.append(f"{variant}: onnxruntime failed to run the graph: {type(err).__name__}: {err}")
            continue
        if sorted_out.shape != reference.shape:
            failures.append(f"{variant}: output shape {sorted_out.shape} != torch {reference.shape}")
            continue
        outs = np.stack([sorted_out, mixed_out])  # (2, N, dim): each probe in both batchings
        finite = bool(np.isfinite(outs).all())
        cos = cosines(sorted_out, reference) if finite else np.full(len(texts), np.nan)
        cos = np.minimum(cos, cosines(mixed_out, reference)) if finite else cos
        norm_error = float(np.abs(np.linalg.norm(outs, axis=2) - 1.0).max()) if finite else float("nan")
        stats = {
            "min_cosine": float(np.min(cos)),
            "mean_cosine": float(np.mean(cos)),
            "max_abs_diff": float(np.abs(outs - reference).max()),
            "max_norm_error": norm_error,
            "worst_probe": int(np.nanargmin(cos)) if finite else None,
        }
        figures[variant] = stats
        if not finite:
            failures.append(f"{variant}: output has NaN or infinite values")
            continue
        if norm_error > bars.norm_tolerance:
            failures.append(f"{variant}: outputs are not unit-norm (max |norm - 1| = {norm_error:.2e})")
        worst = repr(texts[stats["worst_probe"]][:60])
        if variant == "int8":
            failures += int8_failures(cos, bars, texts)
        elif stats["min_cosine"] < bars.fp32_min_cosine:
            failures.append(
                f"{variant}: min cosine to torch {stats['min_cosine']:.6f} < {bars.fp32_min_cosine} (probe {worst})"
            )
    if failures:
        raise ParityError(failures, figures)
    return figures
