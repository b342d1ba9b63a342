"""What BBC News clustering measures: the topics' geometry, or how one k-means run converges on it?

The offline task ``BBCNewsClustering`` scores a model with mteb's evaluator: one mini-batch k-means++ run (batch 512,
one seed) per bootstrap sample. This script embeds the 2,125 articles with each model once and clusters them
(k = 5, V-measure against the topics, × 100) five ways apart, to tell a model whose topics drifted together from
one whose topics are as separable as before but whose single k-means run now lands in a worse local optimum:

* ``minibatch``: mteb's clustering model (MiniBatchKMeans, batch 512, one k-means++ init) over seeds 0–4;
* ``single``: full k-means, one k-means++ init, seeds 0–4;
* ``best of 20``: full k-means, the lowest-inertia of 20 inits (the partition k-means is after);
* ``between-class``: the share of the embeddings' variance between the five topic means (higher: topics further
  apart relative to their spread);
* ``evaluator``: the task itself (``evaluation.tasks.BBCNewsClustering``, mteb's evaluator) at its own seed (42, the
  figure every suite reports) and at seeds 0–9, and their mean: how far the reported figure sits from the mean of
  the same evaluation seeded otherwise.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/kmeans_restarts.py \\
        runs/bench-student/registry/minilm-l6--sct-tiny/1 runs/bench-student/registry/minilm-l6-imdb-studentsct-tiny/5

Models: exported bundles (a folder holding manifest.json; served as fp32) or torch checkpoints and built-in names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from report_file import write_report
from sklearn.cluster import KMeans, MiniBatchKMeans
from sklearn.metrics import v_measure_score

from core import corpora
from core.runtime import cpu_features
from evaluation.embedding_model import EmbeddingModel, is_bundle_spec, load_model
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import run_suite
from evaluation.tasks import BBCNewsClustering
from training.torch_model import load_any

SEEDS = range(5)
EVALUATOR_SEEDS = range(10)


def load(spec: str) -> EmbeddingModel:
    return load_model(spec, variant="fp32") if is_bundle_spec(spec) else load_any(spec)


def cluster_report(x: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """The four figures of the module docstring for L2-normalised embeddings ``x`` (N, D) of topics ``labels``."""

    def v(assigned: np.ndarray) -> float:
        return round(100 * float(v_measure_score(labels, assigned)), 2)

    minibatch = [v(MiniBatchKMeans(5, batch_size=512, n_init=1, random_state=s).fit_predict(x)) for s in SEEDS]
    single = [v(KMeans(5, n_init=1, random_state=s).fit_predict(x)) for s in SEEDS]
    best = KMeans(5, n_init=20, random_state=0).fit(x)
    centred = x - x.mean(0)
    between = sum((labels == k).sum() * np.sum((x[labels == k].mean(0) - x.mean(0)) ** 2) for k in np.unique(labels))
    return {
        "minibatch": minibatch,
        "minibatch_mean": round(float(np.mean(minibatch)), 2),
        "single": single,
        "single_mean": round(float(np.mean(single)), 2),
        "best_of_20": v(best.labels_),
        "between_class_share": round(float(between / (centred**2).sum()), 4),
    }


def evaluator_report(memo: EmbeddingMemo) -> dict[str, Any]:
    """The task's own score at its default seed and at ``EVALUATOR_SEEDS`` (the memo's embeddings, not re-embedded)."""

    def score(task: BBCNewsClustering) -> float:
        return round(run_suite(memo.model, [task], progress=False, memo=memo)["scores"]["BBCNewsClustering"], 2)

    seeded = [score(BBCNewsClustering(seed=s)) for s in EVALUATOR_SEEDS]
    return {"evaluator_default": score(BBCNewsClustering()), "evaluator": seeded,
            "evaluator_mean": round(float(np.mean(seeded)), 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="bundle folders, checkpoints or built-in names")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    texts, topics = corpora.bbc_articles()
    names = sorted(set(topics))
    labels = np.array([names.index(t) for t in topics])
    report: dict[str, Any] = {"cpu": cpu_features(), "articles": len(texts), "models": {}}
    print(f"CPU: {report['cpu']}; {len(texts)} BBC articles, k = 5, V-measure × 100")
    print(f"{'model':60s} {'minibatch (mteb), seeds 0-4':>34s} {'single init, seeds 0-4':>34s} {'best/20':>8s} "
          f"{'between':>8s} {'task':>6s} {'task, seeds 0-9 mean':>20s}")  # fmt: skip
    for spec in args.models:
        memo = EmbeddingMemo(load(spec), progress=False)
        x = np.asarray(memo.embed(texts), dtype=np.float64)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        row = cluster_report(x, labels) | evaluator_report(memo)
        report["models"][spec] = row
        print(f"{spec[-60:]:60s} {' '.join(f'{s:6.2f}' for s in row['minibatch']):>34s} "
              f"{' '.join(f'{s:6.2f}' for s in row['single']):>34s} {row['best_of_20']:8.2f} "
              f"{row['between_class_share']:8.4f} {row['evaluator_default']:6.2f} "
              f"{row['evaluator_mean']:20.2f}", flush=True)  # fmt: skip
    write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
