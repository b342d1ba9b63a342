"""Which label-free in-domain check moves with a domain's real task on every student pair?

For each domain the checkpoints `student_levers.py` trained (``--workdir``, job seed 0) are scored on the job's
in-domain checks, built as the job builds them — the same document draw and seeded split, the held-out documents, a
seeded sample of `MAX_PIECE_DISTRACTORS` training documents as distractors — and on candidate checks built from the
same documents alone (no labels, no titles). Student pairs are the base student and the students `student_levers.py`
made of it (``default``, ``adapted-distil``, ``adapted-distil-only`` — kept as ``adapted-distil-distil``); the teacher
pair is the unadapted teacher and its crop fine-tune (``adapted``); ``--also ROLE=MODEL`` adds a model compared with the
base student (e.g. ``l3=minilm-l3``, a model not made from the teacher). The checks:

- ``pieces``: the job's short pieces (`evaluation.domain_checks.piece_retrieval`, the mean of lead, title, summary);
- ``keyphrase``: a document's most distinctive content words (TF-IDF against the customer's documents, in the order
  they appear) retrieve the document — the shape of a name that is not a sentence of it;
- ``stripped``: the lead and summary pieces with every word shared with the rest of the document dropped, retrieving
  the rest (no content word of the query is in its document: the document's own phrasing cannot match);
- ``agree-T`` / ``rank-T``: how well a model's retrieval of the short pieces agrees with the reference model T's
  (``teacher``: the unadapted teacher every student job scores; ``adapted``: the teacher's crop fine-tune on the job's
  training documents): nDCG@10 with T's ten nearest documents as the relevant set, and the mean Spearman correlation
  of each query's similarity row with T's; ``agree-T-lt`` the lead and title pieces only; ``doc-T``: each held-out
  document's ten nearest documents by T, as the relevant set of that document as the query.

The real task is `domain_checks.real_task` (what `domain_checks.score` reports as ``real``). Each pair of roles is then
compared: does each check's delta have the real task's sign?

    HF_HUB_OFFLINE=1 nice -n 19 .venv/bin/python benchmarks/check_agreement.py --domains cwe,spdx,drug \\
        --workdir runs/levers --base-student runs/sct-tiny-base/best --also l3=minilm-l3 \\
        --out runs/check_agreement.json

Embeddings are kept in ``--cache`` (one file per domain and role), so a second run only computes the checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_adapt import unseen_documents
from domain_checks import real_task
from indomain_resolution import open_model
from report_file import write_report

from adapt_worker.attempt import MAX_PIECE_DISTRACTORS, split_corpus
from core.runtime import cpu_features, cpu_text
from evaluation.domain_checks import (
    PIECES,
    STOP_WORDS,
    content_words,
    ndcg_at_10,
    piece_pairs,
    retrieval_agreement,
    words,
)

KEYWORDS = 6
MIN_STRIPPED_WORDS = 3
# (earlier, later): the later is the trained one; "adapted" is the teacher's crop fine-tune
PAIRS = (
    ("base_student", "default"),
    ("base_student", "adapted-distil"),
    ("base_student", "adapted-distil-distil"),
    ("default", "adapted-distil"),
    ("adapted-distil-distil", "adapted-distil"),
    ("teacher", "adapted"),
)
TEACHER_PAIR = ("teacher", "adapted")  # minilm-l6 and its crop fine-tune: the pair a job without a student gates
REFERENCES = ("teacher", "adapted")
SHOWN = ("pieces", "keyphrase", "stripped", "agree-teacher", "agree-teacher-lt", "rank-teacher", "doc-teacher",
         "agree-adapted", "agree-adapted-lt")  # fmt: skip


def keyphrase(document: str, idf: dict[str, float]) -> str:
    """The `KEYWORDS` content words of ``document`` with the highest TF-IDF, in the order they first appear."""
    kept = [w for w in words(document) if w not in STOP_WORDS and not w.isdigit() and len(w) > 2]
    counts = Counter(kept)
    top = sorted(counts, key=lambda w: (-counts[w] * idf.get(w, 0.0), w))[:KEYWORDS]
    first = {w: i for i, w in reversed(list(enumerate(kept)))}
    return " ".join(sorted(top, key=first.__getitem__))


def document_frequencies(documents: Sequence[str]) -> dict[str, float]:
    df = Counter(w for d in documents for w in set(words(d)))
    return {w: math.log(len(documents) / n) for w, n in df.items()}


def stripped(piece: str, rest: str) -> str | None:
    """``piece`` without the words the rest of its document also has (stop words kept), or None when fewer than
    `MIN_STRIPPED_WORDS` content words are left."""
    shared = content_words(rest)
    kept = [w for w in piece.split() if not (set(words(w)) & shared)]
    return " ".join(kept) if len(content_words(" ".join(kept))) >= MIN_STRIPPED_WORDS else None


def text_lists(held_out: list[str], distractors: list[str], every: list[str]) -> dict[str, Any]:
    """The texts each model embeds, by name, and the queries of each check with their relevant corpus row."""
    lists: dict[str, list[str]] = {"distractors": distractors, "documents": held_out}
    checks: dict[str, tuple[str, str, list[int]]] = {}  # check → (queries list, corpus list, relevant row)
    for kind in PIECES:
        pairs = piece_pairs(held_out, kind)
        lists[f"{kind}-q"], lists[f"{kind}-c"] = [p.query for p in pairs], [p.document for p in pairs]
        checks[kind] = (f"{kind}-q", f"{kind}-c", list(range(len(pairs))))
    idf = document_frequencies(every)
    lists["keyphrase-q"] = [keyphrase(d, idf) for d in held_out]
    checks["keyphrase"] = ("keyphrase-q", "documents", list(range(len(held_out))))
    for kind in ("lead", "summary"):  # the stripped piece retrieves the rest, as its piece does
        found = [(s, n) for n, p in enumerate(piece_pairs(held_out, kind)) if (s := stripped(p.query, p.document))]
        lists[f"stripped-{kind}-q"] = [s for s, _ in found]
        checks[f"stripped-{kind}"] = (f"stripped-{kind}-q", f"{kind}-c", [n for _, n in found])
    return {"lists": lists, "checks": checks}


def embed_all(spec: str, lists: dict[str, list[str]], path: Path) -> dict[str, np.ndarray]:
    fingerprint = hashlib.sha256(json.dumps(lists, sort_keys=True).encode()).hexdigest()
    if path.is_file():
        with np.load(path) as cached:
            if "fingerprint" in cached.files and str(cached["fingerprint"]) == fingerprint:
                return {k: cached[k] for k in lists}
    model = open_model(spec)
    seen: dict[tuple[str, ...], np.ndarray] = {}
    out = {}
    for name, texts in lists.items():
        key = tuple(texts)
        if key not in seen:
            x = np.asarray(model.encode(list(texts)), dtype=np.float32)
            seen[key] = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
        out[name] = seen[key]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, fingerprint=np.asarray(fingerprint), **out)
    return out


def similarity(emb: dict[str, np.ndarray], queries: str, corpus: str) -> np.ndarray:
    return emb[queries] @ np.concatenate([emb[corpus], emb["distractors"]]).T


def spearman_rows(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = a.argsort(axis=1).argsort(axis=1), b.argsort(axis=1).argsort(axis=1)
    ra, rb = ra - ra.mean(axis=1, keepdims=True), rb - rb.mean(axis=1, keepdims=True)
    return float(100 * np.mean((ra * rb).sum(axis=1) / np.sqrt((ra**2).sum(axis=1) * (rb**2).sum(axis=1))))


def checks_of(emb: dict[str, np.ndarray], refs: dict[str, dict[str, np.ndarray]], checks: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, (queries, corpus, relevant) in checks.items():
        out[name] = float(ndcg_at_10(similarity(emb, queries, corpus), [[r] for r in relevant]).mean())
    out["pieces"] = float(np.mean([out[k] for k in PIECES]))
    out["stripped"] = float(np.mean([out["stripped-lead"], out["stripped-summary"]]))
    for ref, ref_emb in refs.items():
        for kind in PIECES:
            queries, corpus, _ = checks[kind]
            ours, theirs = similarity(emb, queries, corpus), similarity(ref_emb, queries, corpus)
            out[f"agree-{ref}-{kind}"] = float(retrieval_agreement(ours, theirs).mean())
            out[f"rank-{ref}-{kind}"] = spearman_rows(ours, theirs)
        out[f"agree-{ref}"] = float(np.mean([out[f"agree-{ref}-{kind}"] for kind in PIECES]))
        out[f"agree-{ref}-lt"] = float(np.mean([out[f"agree-{ref}-{kind}"] for kind in ("lead", "title")]))
        out[f"rank-{ref}"] = float(np.mean([out[f"rank-{ref}-{kind}"] for kind in PIECES]))
        ours, theirs = similarity(emb, "documents", "documents"), similarity(ref_emb, "documents", "documents")
        own = np.arange(len(ours))
        ours[own, own], theirs[own, own] = -np.inf, -np.inf  # a document is not its own neighbour
        out[f"doc-{ref}"] = float(retrieval_agreement(ours, theirs).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domains", default="cwe,spdx,drug")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--documents", type=int, default=1000)
    parser.add_argument("--workdir", type=Path, default=Path("runs/levers"), help="student_levers.py's --workdir")
    parser.add_argument("--base-student", default="runs/sct-tiny-base/best")
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--cache", type=Path, default=Path("runs/check_agreement_cache"))
    parser.add_argument(
        "--levers-report",
        default="runs/levers_{domain}_{seed}.json",
        help="student_levers.py's --out: the real-task scores it already has are not recomputed",
    )
    parser.add_argument("--also", action="append", default=[], help="ROLE=MODEL: also compare it with the base student")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"cpu": cpu_features(), "seed": args.seed, "domains": {}, "agreement": []}
    for name in args.domains.split(","):
        work = args.workdir / f"{name}-{args.seed}"
        roles = {"base_student": args.base_student, "teacher": args.teacher,
                 "default": str(work / "default-crops/best"), "adapted-distil": str(work / "adapted-distil-crops/best"),
                 "adapted-distil-distil": str(work / "adapted-distil-distil/best"),
                 "adapted": str(work / "adapted-distil/best"), **dict(m.split("=", 1) for m in args.also)}  # fmt: skip
        docs = unseen_documents(name, args.documents, 0, max_chars=20_000)  # bench_adapt's draw (its --seed 0)
        split = split_corpus([d.text for d in docs], seed=args.seed)
        distractors = random.Random(args.seed).sample(split.train, min(MAX_PIECE_DISTRACTORS, len(split.train)))
        built = text_lists(split.held_out, distractors, split.train + split.held_out)
        embeddings, seconds = {}, {}
        for role, spec in roles.items():
            tick = time.perf_counter()
            embeddings[role] = embed_all(spec, built["lists"], args.cache / f"{name}-{args.seed}-{role}.npz")
            seconds[role] = round(time.perf_counter() - tick, 1)
        report = Path(args.levers_report.format(domain=name, seed=args.seed))
        known = json.loads(report.read_text())["scores"] if report.is_file() else {}
        rows: dict[str, Any] = {}
        for role, spec in roles.items():
            refs = {r: embeddings[r] for r in REFERENCES}
            tick = time.perf_counter()
            rows[role] = {"checks": checks_of(embeddings[role], refs, built["checks"]), "embed_s": seconds[role]}
            rows[role]["checks_s"] = round(time.perf_counter() - tick, 2)  # every check, from the embeddings
            real_path = args.cache / f"{name}-{args.seed}-{role}.real"
            if role in known:
                rows[role]["real"] = known[role]["real"]
            else:
                if not real_path.is_file():
                    real_path.write_text(f"{real_task(open_model(spec), name, docs, args.seed)['real']!r}")
                rows[role]["real"] = float(real_path.read_text())
            print(f"{name} {role:>22s}: " + " ".join(f"{k} {rows[role]['checks'][k]:.2f}" for k in SHOWN)
                  + f" | real {rows[role]['real']:.2f}", flush=True)  # fmt: skip
        results["domains"][name] = {"rows": rows, "queries": {k: len(v) for k, v in built["lists"].items()}}
        for a, b in PAIRS + tuple(("base_student", m.split("=", 1)[0]) for m in args.also):
            real = rows[b]["real"] - rows[a]["real"]
            deltas = {k: rows[b]["checks"][k] - rows[a]["checks"][k] for k in rows[a]["checks"]}
            group = "teacher" if (a, b) == TEACHER_PAIR else "student" if (a, b) in PAIRS else "other"
            results["agreement"].append(
                {"domain": name, "pair": f"{b} − {a}", "group": group, "real": real, "deltas": deltas}
            )
    summary = agreement_table(results["agreement"], print)
    results["summary"] = summary
    cpu = results["cpu"]
    print(f"\nCPU: {cpu_text(cpu)}")
    write_report(args.out, results)
    return 0


def agreement_table(rows: list[dict[str, Any]], say: Callable[[str], None]) -> dict[str, dict[str, str]]:
    """Print each pair's deltas (✗: the sign is not the real task's; n/a: a check against the model itself); returns
    how many pairs of each group (``student``, ``teacher``, ``other``) each check agrees on."""
    say("\nΔ per pair (later − earlier role); ✗: the check's sign is not the real task's")
    tally: dict[str, dict[str, list[bool]]] = {}
    for row in rows:
        marks = []
        for check in SHOWN:
            delta = row["deltas"][check]
            if row["group"] == "teacher" and check.endswith(REFERENCES + tuple(f"{r}-lt" for r in REFERENCES)):
                marks.append(f"{check} n/a")
                continue
            if row["real"] == 0:  # the real task tied: no sign to agree with
                marks.append(f"{check} {delta:+.2f}")
                continue
            agrees = bool(np.sign(delta) == np.sign(row["real"]))
            marks.append(f"{check} {delta:+.2f}{'' if agrees else '✗'}")
            tally.setdefault(row["group"], {}).setdefault(check, []).append(agrees)
        say(f"{row['domain']:>5s} {row['pair']:>36s}: real {row['real']:+.2f} | " + " ".join(marks))
    summary = {g: {c: f"{sum(v)}/{len(v)}" for c, v in checks.items()} for g, checks in tally.items()}
    for group, checks in summary.items():
        say(f"\n{group} pairs in agreement: " + "; ".join(f"{c} {s}" for c, s in checks.items()))
    return summary


if __name__ == "__main__":
    sys.exit(main())
