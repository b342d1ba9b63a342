"""Targets from two teachers: minilm-l6 and mpnet-base mapped into minilm-l6's space, for a build of a recipe.

mpnet-base (all-mpnet-base-v2, 12 × 768; ``EMBEDDER_EXTRAS=mpnet``) and minilm-l6 disagree on unseen domains in
both directions, and the mean of two embedders is often better than either. The 2 × 384 student lives in
minilm-l6's space (it starts as two of its layers), so mpnet's embeddings are first mapped there:

- ``map`` fits a linear map from mpnet-base's embeddings to minilm-l6's on paragraphs of the recipe's corpus and
  one sentence of each (ridge least squares; 10 % held out for the cosine it prints, then refit on all), and saves
  mpnet-base with the map as a ``Dense`` layer (768 → 384, no bias) — a model folder any command reads;
- ``targets`` embeds every training text of one build of a recipe (its ``--set`` overrides decide the draw) with
  minilm-l6 and with that folder, and writes ``normalise(minilm + weight · mapped)`` per text as the file
  ``TrainConfig.teacher_vectors`` reads, so ``embedder train`` distils the pair without a teacher pass of its own.

    EMBEDDER_EXTRAS=mpnet bash scripts/bootstrap.sh
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ensemble_teacher.py map runs/mpnet-to-l6
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/ensemble_teacher.py targets runs/ens-preset-s0.npz \\
        --mapped runs/mpnet-to-l6 --set time_budget_s=none --set max_steps=300 --set max_documents=8000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from core.model_folder import DenseLayer
from core.text import split_sentences
from training.config import load_config
from training.data import load_corpus
from training.encoder import Encoder, OutputLayer
from training.inputs import load_training_data
from training.targets import text_key, write_vectors

CORPUS = "enwiki+aclsum+lee_background"  # the sct-tiny recipe's


def fit_texts(documents: int, seed: int) -> list[str]:
    """``documents`` paragraphs of the recipe's corpus (a seeded draw), each followed by one of its sentences."""
    docs = load_corpus(CORPUS, max_documents=15000, seed=seed)
    rng = np.random.default_rng(seed)
    texts = []
    for i in rng.choice(len(docs), size=documents, replace=False):
        texts.append(docs[i])
        sentences = split_sentences(docs[i])
        if sentences:
            texts.append(sentences[int(rng.integers(len(sentences)))])
    return texts


def ridge(x: np.ndarray, y: np.ndarray, strength: float) -> np.ndarray:
    """``W`` minimising ‖xW − y‖² + λ‖W‖², λ = ``strength`` × the mean diagonal of xᵀx."""
    gram = x.T @ x
    return np.linalg.solve(gram + strength * np.trace(gram) / x.shape[1] * np.eye(x.shape[1]), x.T @ y)


def fit_map(out: Path, documents: int, seed: int, strength: float, max_length: int) -> dict[str, float]:
    texts = fit_texts(documents, seed)
    small = Encoder.from_pretrained("minilm-l6", max_seq_length=max_length)
    large = Encoder.from_pretrained("mpnet-base", max_seq_length=max_length)
    y = np.asarray(small.encode(texts, batch_size=64), dtype=np.float64)
    tick = time.perf_counter()
    x = np.asarray(large.encode(texts, batch_size=32), dtype=np.float64)
    seconds = time.perf_counter() - tick
    cut = int(0.9 * len(texts))
    mapped = x[cut:] @ ridge(x[:cut], y[:cut], strength)
    mapped /= np.linalg.norm(mapped, axis=1, keepdims=True)
    held_out = float((mapped * y[cut:]).sum(axis=1).mean())
    weights = ridge(x, y, strength)
    large.output = OutputLayer(DenseLayer(in_features=x.shape[1], out_features=y.shape[1], bias=False))
    with torch.no_grad():
        large.output.linear.weight.copy_(torch.tensor(weights.T, dtype=torch.float32))
    large.save(out)
    return {"texts": len(texts), "held_out_cosine": round(held_out, 4), "mpnet_seconds": round(seconds, 1)}


def write_targets(out: Path, mapped: str, weight: float, recipe: str, overrides: list[str]) -> dict[str, float]:
    config = load_config(recipe, overrides)
    texts = sorted(load_training_data(config).documents, key=len, reverse=True)  # like lengths batch together
    small = Encoder.from_pretrained("minilm-l6", max_seq_length=config.max_seq_length)
    large = Encoder.from_pretrained(mapped, max_seq_length=config.max_seq_length)
    a = np.asarray(small.encode(texts, batch_size=64))
    tick = time.perf_counter()
    b = np.asarray(large.encode(texts, batch_size=32))
    seconds = time.perf_counter() - tick
    both = a + weight * b
    both /= np.linalg.norm(both, axis=1, keepdims=True)
    write_vectors(out, {text_key(t): torch.from_numpy(both[i].astype(np.float32)) for i, t in enumerate(texts)})
    return {
        "texts": len(texts),
        "cosine_to_minilm": round(float((both * a).sum(axis=1).mean()), 4),
        "mapped_seconds": round(seconds, 1),
    }


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("map", help="fit the map and save mpnet-base with it as a model folder")
    fit.add_argument("out", type=Path)
    fit.add_argument("--documents", type=int, default=3000)
    fit.add_argument("--seed", type=int, default=123)
    fit.add_argument("--ridge", type=float, default=1e-3)
    fit.add_argument("--max-length", type=int, default=128)
    targets = sub.add_parser("targets", help="write the pair's targets for one build of a recipe")
    targets.add_argument("out", type=Path)
    targets.add_argument("--mapped", required=True, help="the folder `map` saved")
    targets.add_argument("--weight", type=float, default=1.0, help="the mapped model's weight beside minilm-l6's 1")
    targets.add_argument("--recipe", default="sct-tiny")
    targets.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the build's overrides, as `embedder train --set` takes them (repeat)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.command == "map":
        report = fit_map(args.out, args.documents, args.seed, args.ridge, args.max_length)
    else:
        report = write_targets(args.out, args.mapped, args.weight, args.recipe, args.overrides)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
