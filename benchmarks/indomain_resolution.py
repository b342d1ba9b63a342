"""How precisely does /adapt's held-out in-domain score tell two models apart?

Rebuilds the held-out task of a `bench_adapt.py` job — the same corpus draw, the job's seeded train/held-out split and
its crop rule (chosen from the training documents) — scores a reference model and the job's model on it query by
query (nDCG@10, one relevant crop per query: the figure the job reports), and bootstraps the paired difference
(10,000 resamples of the queries) for a 95 % interval: per job seed, and pooled over the queries of every seed given.
A per-seed difference inside its interval is not one the task resolves; the pooled one is the estimate to judge a
target by.

    R=runs/bench-student/registry
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/indomain_resolution.py --corpus imdb --reference minilm-l6 \\
        0=$R/minilm-l6-imdb-studentsct-tiny/10 1=$R/minilm-l6-imdb-studentsct-tiny-seed1/3 \\
        2=$R/minilm-l6-imdb-studentsct-tiny-seed2/1 3=$R/minilm-l6-imdb-studentsct-tiny-seed3/1 \\
        4=$R/minilm-l6-imdb-studentsct-tiny-seed4/1

Models are exported bundles (scored in fp32) or torch checkpoints and built-in names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from bench_adapt import load_corpus
from report_file import write_report

from adapt_worker.attempt import split_corpus
from core.runtime import cpu_features, cpu_text
from core.text import choose_crop_rule
from evaluation.embedding_model import EmbeddingModel, is_bundle_spec, load_model
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.tasks import CropPairRetrieval
from training.torch_model import load_any

RESAMPLES = 10_000


def held_out_pairs(texts: list[str], seed: int) -> list[tuple[str, str]]:
    """The (query crop, relevant crop) pairs of the held-out task a bench_adapt job over ``texts`` with job seed
    ``seed`` scores."""
    split = split_corpus(texts, seed=seed)
    rule = choose_crop_rule(split.train)
    return CropPairRetrieval.from_corpus(split.held_out, seed=seed, name=IN_DOMAIN_TASK, rule=rule).crop_pairs()


def per_query_ndcg(model: EmbeddingModel, pairs: list[tuple[str, str]]) -> np.ndarray:
    """nDCG@10 × 100 of each query: 1 / log2(rank + 2) when its own crop ranks among the first ten, else 0."""
    similarity = model.encode([q for q, _ in pairs]) @ model.encode([d for _, d in pairs]).T
    rank = (similarity > np.diag(similarity)[:, None]).sum(axis=1)
    return np.where(rank < 10, 100 / np.log2(rank + 2), 0.0)


def paired_interval(diff: np.ndarray, rng: np.random.Generator) -> tuple[float, float]:
    """95 % bootstrap interval of the mean of ``diff`` (queries resampled with replacement)."""
    means = diff[rng.integers(0, len(diff), (RESAMPLES, len(diff)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def open_model(spec: str) -> EmbeddingModel:
    return load_model(spec, variant="fp32", threads=2) if is_bundle_spec(spec) else load_any(spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="+", help="SEED=MODEL: the job seed and the model that job published")
    parser.add_argument("--reference", default="minilm-l6", help="the model every job's model is compared with")
    parser.add_argument("--corpus", default="imdb", help="bench_adapt's corpus: acl, bbc or imdb")
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    jobs = []
    for job in args.jobs:
        seed, sep, spec = job.partition("=")
        if not sep or not seed.isdigit():
            parser.error(f"{job!r}: give SEED=MODEL, e.g. 0=runs/registry/name/1")
        jobs.append((int(seed), spec))

    rng = np.random.default_rng(0)
    texts, _ = load_corpus(args.corpus, args.documents, 0, max_chars=20_000)  # bench_adapt's draw (its --seed 0)
    reference = open_model(args.reference)
    rows, diffs = [], []
    for seed, spec in jobs:
        pairs = held_out_pairs(texts, seed)
        ref, cand = per_query_ndcg(reference, pairs), per_query_ndcg(open_model(spec), pairs)
        diff = cand - ref
        diffs.append(diff)
        low, high = paired_interval(diff, rng)
        rows.append({"seed": seed, "model": spec, "queries": len(pairs), "reference": round(float(ref.mean()), 2),
                     "candidate": round(float(cand.mean()), 2), "difference": round(float(diff.mean()), 2),
                     "interval_95": [round(low, 2), round(high, 2)]})  # fmt: skip
        print(rows[-1], flush=True)
    pooled = np.concatenate(diffs)
    low, high = paired_interval(pooled, rng)
    summary = {"queries": len(pooled), "difference": round(float(pooled.mean()), 2),
               "interval_95": [round(low, 2), round(high, 2)]}  # fmt: skip
    cpu = cpu_features()
    print(f"\nCPU: {cpu_text(cpu)}")
    print(f"{'seed':>4s} {'queries':>7s} {args.reference:>12s} {'model':>8s} {'difference':>10s}  95 % interval")
    for row in rows:
        print(f"{row['seed']:4d} {row['queries']:7d} {row['reference']:12.2f} {row['candidate']:8.2f} "
              f"{row['difference']:+10.2f}  [{row['interval_95'][0]:+.2f}, {row['interval_95'][1]:+.2f}]")  # fmt: skip
    print(f"pooled {summary['queries']} queries: {summary['difference']:+.2f}  "
          f"[{summary['interval_95'][0]:+.2f}, {summary['interval_95'][1]:+.2f}]")  # fmt: skip
    write_report(args.out, {"cpu": cpu, "corpus": args.corpus, "reference": args.reference, "jobs": rows,
                            "pooled": summary})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
