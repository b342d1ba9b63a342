"""The engines chosen per batch size at load (`core.engines.load_engine`, ``engine="auto"``), in process, against
each engine that keeps the parity bars on this CPU alone (onnxruntime int8, and OpenVINO bf16 / f32 and
onnxruntime fp32 where they pass), on batches shaped like bench_peers' loads as the server's batcher cuts
them (length-sorted, at most ``max_batch_tokens`` padded tokens and ``max_batch_size`` texts: the defaults 4096 / 64).

The batches: 8, 16 and 32 short texts (one-text requests from 32 clients: as many as are queued), 64 short texts
(32-text requests from 8 clients) and as many paragraphs as fit 4096 padded tokens (32-paragraph requests), from
bench_service's seeded texts. The arms take turns on each batch, their order alternating between rounds. Printed: the
CPU, the routes chosen, and per batch its padded tokens, the engine its route runs it on, and each arm's median
texts/s with the ratio to onnxruntime int8 — whether routing by shape (texts and padded length) sends the served
batches to the engine fastest on them.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_routes.py --bundle runs/reg/minilm-l6/current --rounds 7
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench_service import server_spinning, workloads
from bundle_args import bundle_arguments
from report_file import write_report

from core.engine_choice import BASELINE, describe, route_for
from core.engines import load_engine, open_routes
from core.runtime import OnnxBundle

MAX_BATCH_TOKENS = 4096  # the server's defaults (service/settings.py)
MAX_BATCH_SIZE = 64


def served_batches(bundle: OnnxBundle) -> dict[str, list[str]]:
    short, paragraphs = workloads()
    by_length = sorted(paragraphs[:64], key=lambda t: len(bundle.tokenize([t])[0].ids))
    width = max(len(e.ids) for e in bundle.tokenize(by_length[:MAX_BATCH_SIZE]))
    fit = min(MAX_BATCH_SIZE, MAX_BATCH_TOKENS // width)
    batches = {f"{n} short texts": short[:n] for n in (8, 16, 32, 64)}
    return batches | {f"{fit} paragraphs": by_length[-fit:]}


def main(argv: list[str] | None = None) -> int:
    args = bundle_arguments(__doc__, 7, argv)
    session: dict[str, Any] = {"intra_op_threads": args.threads, "spinning": server_spinning()}
    routed, choice = load_engine(args.bundle, **session)
    cpu = choice.cpu
    print(f"CPU: {cpu['model']} ({', '.join(cpu['flags'])}), {args.threads} threads", flush=True)
    print(f"chosen in {choice.seconds} s: {describe(choice.routes)}", flush=True)
    for trial in choice.trials:
        checked = trial.mean_cosine is not None and trial.min_cosine is not None
        parity = f"cosine to fp32 mean {trial.mean_cosine:.4f} min {trial.min_cosine:.4f}" if checked else ""
        print(f"  {trial.engine:16s} {trial.status:11s} {parity} {trial.reason}", flush=True)
    passed = [trial.engine for trial in choice.trials if trial.status == "passed"]
    if BASELINE not in passed:
        raise SystemExit(f"{BASELINE} misses the parity bars on this CPU: nothing to compare the routes against")
    arms = {"routed": routed} | {name: open_routes(args.bundle, [(name, [])], **session) for name in passed}
    feeds = {name: routed.pad(routed.tokenize(texts)) for name, texts in served_batches(routed).items()}
    samples: dict[str, dict[str, list[float]]] = {batch: {arm: [] for arm in arms} for batch in feeds}
    for round_ in range(args.rounds + 1):
        for batch, feed in feeds.items():
            for arm in list(arms) if round_ % 2 else list(arms)[::-1]:
                started = time.perf_counter()
                arms[arm].run(feed)
                if round_:  # round 0 warms up (OpenVINO compiles each new shape on first use)
                    samples[batch][arm].append(feed["input_ids"].shape[0] / (time.perf_counter() - started))
    rows = []
    for batch, feed in feeds.items():
        tokens = int(feed["input_ids"].size)
        engine = route_for(choice.routes, *feed["input_ids"].shape).engine
        speeds = {arm: statistics.median(values) for arm, values in samples[batch].items()}
        base = speeds[BASELINE]
        rows.append({"batch": batch, "padded_tokens": tokens, "routed_to": engine, "texts_per_s": speeds})
        print(
            f"{batch:16s} {tokens:5d} tokens -> {engine:16s} "
            + "  ".join(f"{arm} {s:7.1f}/s ({s / base:.2f}x)" for arm, s in speeds.items()),
            flush=True,
        )  # fmt: skip
    write_report(args.out, {"cpu": cpu, "threads": args.threads, "choice": choice.as_dict(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
