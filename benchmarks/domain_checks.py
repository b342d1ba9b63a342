"""Do /adapt's in-domain checks agree with a real task of the domain?

For each unseen domain (`core.corpora.UNSEEN_DOMAINS`) rebuilds what a `bench_adapt.py` job over it sees — the same
1,000-document draw, the job's seeded train/held-out split and crop rule — and scores each model on

- the job's checks, on the held-out documents: crop pairs (what the gate decides on today) and the short-piece checks
  of `evaluation.domain_checks` (lead sentence, title-like words, summary-like sentence → the rest of the document,
  the training documents as distractors);
- the domain's real task, which the job never sees: the publisher's titles retrieving their documents (CWE weakness
  names among all 839 weaknesses, HPO term names among 5,000 terms — the job's 1,000 and 4,000 more —, SPDX licence
  names among the 322 licences), or kNN accuracy of the drug reviews' condition (conditions with ≥ 10 reviews, k = 10,
  10-fold cross-validation repeated ten times, each fit a 9:1 split; and every review classified once by its 10
  nearest others).

Every pair of models is then compared: does each check move in the same direction as the real task?

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/domain_checks.py --domains cwe,hpo,drug,spdx \\
        teacher=minilm-l6 l3=minilm-l3 student=runs/bench-student/registry/minilm-l6--sct-tiny/1/checkpoint \\
        --out runs/domain_checks.json

Models are built-in names, torch checkpoints or exported bundles (scored in fp32).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from bench_adapt import UNSEEN, draw, unseen_documents
from indomain_resolution import open_model, per_query_ndcg
from report_file import write_report

from adapt_worker.attempt import split_corpus
from core.corpora import UNSEEN_DOMAINS
from core.runtime import cpu_features, cpu_text
from core.text import choose_crop_rule
from evaluation.diagnostics import knn_cross_validated_accuracy, knn_leave_one_out_accuracy
from evaluation.domain_checks import piece_retrieval, title_retrieval
from evaluation.embedding_model import EmbeddingModel
from evaluation.gate import IN_DOMAIN_TASK
from evaluation.tasks import CropPairRetrieval

TITLE_POOL = 5000
MIN_LABEL_DOCUMENTS = 10


def real_task(model: EmbeddingModel, name: str, job_docs: list[Any], seed: int) -> dict[str, Any]:
    """The domain's real task: its description (``real_task``) and score in points (``real``); for the reviews also
    ``real_leave_one_out``, the same kNN with every review classified once by its 10 nearest others."""
    if name == "drug":
        counts = Counter(d.label for d in job_docs)
        kept = [d for d in job_docs if counts[d.label] >= MIN_LABEL_DOCUMENTS]
        emb = model.encode([d.text for d in kept])
        labels = [d.label for d in kept]
        return {
            "real_task": f"kNN condition ({len(kept)} reviews, {len(set(labels))} conditions)",
            "real": 100 * knn_cross_validated_accuracy(emb, labels, k=10),
            "real_leave_one_out": 100 * knn_leave_one_out_accuracy(emb, labels, k=10),
        }
    every = UNSEEN_DOMAINS[UNSEEN[name]]()
    if len(every) > TITLE_POOL:  # the job's documents and a seeded draw of the others
        chosen = {d.text for d in job_docs}
        others = [d for d in every if d.text not in chosen]
        pool = job_docs + [others[i] for i in draw(len(others), TITLE_POOL - len(job_docs), seed)]
    else:
        pool = list(every)
    scores = title_retrieval(model, [d.title for d in pool], [d.text for d in pool])
    return {"real_task": f"title → document among {len(pool)}", "real": float(scores.mean())}


def real_text(scored: dict[str, Any]) -> str:
    """One model's real-task figures (`real_task`'s) as a log line says them."""
    fine = f", leave-one-out {scored['real_leave_one_out']:.2f}" if "real_leave_one_out" in scored else ""
    return f"real {scored['real']:.2f} ({scored['real_task']}){fine}"


def score(spec: str, name: str, docs: list[Any], split: Any, crops: list[tuple[str, str]], seed: int) -> dict:
    """One model on one domain's split: the crop-pair check, the short-piece checks and the real task."""
    model = open_model(spec)
    checks = {"crops": float(per_query_ndcg(model, crops).mean())}
    pieces = piece_retrieval(model, split.held_out, split.train)
    checks.update({k: float(v.mean()) for k, v in pieces.items()})
    checks["pieces"] = float(np.mean([checks[k] for k in pieces]))
    return {"checks": checks, **real_task(model, name, docs, seed)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="ROLE=MODEL, e.g. teacher=minilm-l6")
    parser.add_argument("--domains", default="cwe,hpo,drug,spdx", help=f"comma-separated of {', '.join(UNSEEN)}")
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--seeds", default="0", help="job seeds (splits), comma-separated")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    models = dict(m.split("=", 1) for m in args.models)
    rows: list[dict[str, Any]] = []
    for name in args.domains.split(","):
        docs = unseen_documents(name, args.documents, 0, max_chars=20_000)  # bench_adapt's draw (its --seed 0)
        texts = [d.text for d in docs]
        for seed in (int(s) for s in args.seeds.split(",")):
            split = split_corpus(texts, seed=seed)
            rule = choose_crop_rule(split.train)
            task = CropPairRetrieval.from_corpus(split.held_out, seed=seed, name=IN_DOMAIN_TASK, rule=rule)
            crops = task.crop_pairs()
            for role, spec in models.items():
                tick = time.perf_counter()
                scored = score(spec, name, docs, split, crops, seed)
                seconds = round(time.perf_counter() - tick, 1)
                rows.append({"domain": name, "seed": seed, "role": role, "model": spec, **scored, "seconds": seconds})
                checks = " ".join(f"{k} {v:.2f}" for k, v in scored["checks"].items())
                print(f"{name} s{seed} {role:>10s}: {checks} | {real_text(scored)} [{seconds} s]", flush=True)
    agreement = []
    for (name, seed), group in itertools.groupby(rows, key=lambda r: (r["domain"], r["seed"])):
        for a, b in itertools.combinations(list(group), 2):
            real = b["real"] - a["real"]
            deltas = {k: round(b["checks"][k] - a["checks"][k], 2) for k in a["checks"]}
            pair = f"{b['role']} − {a['role']}"
            agreement.append({"domain": name, "seed": seed, "pair": pair, "real": round(real, 2), **deltas})
    print("\nΔ per pair (later − earlier role); a check agrees when its sign is the real task's")
    for row in agreement:
        signs = " ".join(f"{k} {row[k]:+.2f}{'' if np.sign(row[k]) == np.sign(row['real']) else '✗'}"
                         for k in row if k not in ("domain", "seed", "pair", "real"))  # fmt: skip
        print(f"{row['domain']:>5s} s{row['seed']} {row['pair']:>22s}: real {row['real']:+.2f} | {signs}")
    cpu = cpu_features()
    print(f"\nCPU: {cpu_text(cpu)}")
    write_report(args.out, {"cpu": cpu, "rows": rows, "agreement": agreement, "seeds": args.seeds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
