"""How the candidate engines are timed at load (`core.engines`): batches shaped like the served load, the candidates
taking turns on each, medians of several rounds.

The timing batches span the batches the service forms: 1, 4, 16 and 32 short probe texts, and 4 texts at
``max_seq_length`` — each is the timing batch of one shape class, and the engine chosen for a class runs the served
batches nearest its shape, texts and padded length (`core.engine_choice.pick_routes`, `core.runtime.nearest_shape`).

A batch of one text is what a server forms when requests come now and then (under load the batcher joins them), so
it is timed that way: three different texts, each after the engine sat idle for `IDLE_BEFORE_ONE`. Timed back to
back on one repeated text, OpenVINO's int8 graph ran one text 1.3-1.4x faster than onnxruntime's on an AMD EPYC with
AVX-512 VNNI, yet served one text 5-14 % slower back to back, and with 50 ms idle before each of a stream of
different texts 4.4 against 3.3 ms in process (its threads wake slower, and a new input shape costs it a shape pass)
— docs/BENCHMARKS.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.runtime import OnnxBundle, Shape, graph_files

log = logging.getLogger(__name__)

TIMING_ROUNDS = 5  # timed rounds after the warm-up; each time is the median of the rounds
SHORT_BATCH = 32  # texts of the short timing batch (probe sentences)
# Texts of the long timing batch (probes cut at max_seq_length): 4, not 8 — the long batch took ~80% of the timing
# (38 s of a 49 s load of minilm-l6 on a busy 2-core Xeon), and 4 x max_seq_length is as compute-bound as 8.
LONG_BATCH = 4
SMALL_BATCHES = ("1", "4", "16")  # timing batches of that many short probe texts
IDLE_BEFORE_ONE = 0.02  # seconds each engine sits idle before a one-text timing run: a sporadic client's gap
BATCHES = (*SMALL_BATCHES, "short", "long")

# Whether an engine is still worth timing, given every remaining engine's median seconds per batch so far.
StillIn = Callable[[str, Mapping[str, Mapping[str, float]]], bool]


def timing_batches(bundle: OnnxBundle, texts: Sequence[str]) -> dict[str, list[list[str]]]:
    """The runs of each timing batch: batches of 1, 4, 16 and 32 short probe texts (the first of the longer half of
    the probes of 8-32 tokens, cycled) and one of texts cut at ``max_seq_length``, like the served load's two ends.
    A small batch is run three times (its time is their best): one text as three different ones, of rising length;
    4 and 16 as the same batch."""
    lengths = [len(e.ids) for e in bundle.tokenize(texts)]
    by_length = sorted(range(len(texts)), key=lambda i: lengths[i])
    short = [texts[i] for i in by_length if 8 <= lengths[i] <= 32] or [texts[i] for i in by_length]
    long = [texts[i] for i in by_length if lengths[i] >= bundle.max_seq_length] or [texts[by_length[-1]]]
    cycle = lambda pool, n: [pool[i % len(pool)] for i in range(n)]  # noqa: E731
    upper = short[len(short) // 2 :]
    ones = [[upper[(len(upper) - 1) * k // 2]] for k in range(3)]  # the upper half's first, middle and last text
    small = {size: [cycle(upper, int(size))] * 3 for size in SMALL_BATCHES[1:]}
    return {"1": ones, **small, "short": [cycle(upper, SHORT_BATCH)], "long": [cycle(long, LONG_BATCH)]}


def time_engines(
    bundles: dict[str, OnnxBundle],
    texts: Sequence[str],
    still_in: StillIn,
    rounds: int = TIMING_ROUNDS,
    failed: dict[str, str] | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, Shape]]:
    """Median seconds per engine and timing batch, and each batch's shape (texts, median padded length of its runs): a
    warm-up pass, then ``rounds`` rounds, each running one batch on every candidate in turn (alternating their order
    from round to round) before the next batch, so a drift of a shared machine hits the candidates alike where they are
    compared. A small batch's time in a round is the best of its three runs (short enough for one scheduler hiccup to
    double them), each one-text run after `IDLE_BEFORE_ONE` idle. An engine that cannot win after a round (``still_in``
    false) is timed no more and removed from ``bundles`` (memory freed); so is one that raises, its error kept in
    ``failed``."""
    first = next(iter(bundles.values()))
    runs = timing_batches(first, texts)
    padded = {id(batch): first.pad(first.tokenize(batch)) for batches in runs.values() for batch in batches}
    feeds = {name: [padded[id(batch)] for batch in batches] for name, batches in runs.items()}  # a repeat padded once
    samples: dict[str, dict[str, list[float]]] = {engine: {shape: [] for shape in feeds} for engine in bundles}
    names = list(bundles)
    for round_ in range(rounds + 1):
        for shape, feed in feeds.items():  # the candidates in turn on one batch: close in time, alike in conditions
            for engine in list(names) if round_ % 2 else list(reversed(names)):
                best = math.inf
                try:
                    for run in feed:
                        if shape == "1":
                            time.sleep(IDLE_BEFORE_ONE)
                        started = time.perf_counter()
                        bundles[engine].run(run)
                        best = min(best, time.perf_counter() - started)
                except Exception as error:  # a runtime that fails on one of these shapes: out of the race, say why
                    log.warning("engine %s: failed while timed: %s: %s", engine, type(error).__name__, error)
                    if failed is not None:
                        failed[engine] = f"failed while timed: {type(error).__name__}: {str(error)[:300]}"
                    names.remove(engine)
                    del bundles[engine], samples[engine]
                    continue
                if round_:  # round 0 warms up (OpenVINO compiles each new shape on first use)
                    samples[engine][shape].append(best)
        if round_:
            medians = {e: medians_of(samples[e]) for e in names}
            out = [e for e in names if not still_in(e, medians)]
            for engine in out:
                names.remove(engine)
                del bundles[engine]
                log.info("engine %s: out of the race after %d timed rounds", engine, round_)
    widths = {name: int(np.median([run["input_ids"].shape[1] for run in feed])) for name, feed in feeds.items()}
    return (
        {engine: medians_of(by_shape) for engine, by_shape in samples.items()},
        {name: (len(feed[0]["input_ids"]), widths[name]) for name, feed in feeds.items()},
    )


def medians_of(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each batch's timed rounds."""
    return {shape: float(np.median(values)) for shape, values in samples.items()}


@dataclass(frozen=True)
class Timed:
    """An automatic choice's timings, kept for the next load of graphs of the same shapes in this process."""

    version: str  # the bundle they were taken on: name and version
    seconds: dict[str, dict[str, float]]  # median seconds per timing batch of each engine timed to the last round
    shapes: dict[str, Shape]  # each timing batch's texts and padded length
    engines: frozenset[str]  # the engines its routes ran, and the baseline when it was timed: checked again


# What a load of this process timed, by `speed_key`: a registry poll that finds a new version of a served model (an
# /adapt job's, same architecture) checks only the engines its routes ran and the baseline, instead of timing every
# candidate again while the server is busy serving the old version.
TIMED: dict[tuple[Any, ...], Timed] = {}


def speed_key(
    path: Path, manifest: Mapping[str, Any], texts: Sequence[str], serve_int8: bool, session: Mapping[str, Any]
) -> tuple[Any, ...]:
    """What the engines' speeds on a bundle depend on, as a load can tell it without timing: the graphs' shapes (the
    sizes of their files and the manifest's architecture and int8 scheme: weights of other values, as an /adapt
    version has, run alike), the timing texts and the session (threads, spinning)."""
    graphs = sorted((variant, (path / file).stat().st_size) for variant, file in graph_files(manifest).items())
    architecture = [manifest.get(k) for k in ("layers", "dim", "max_seq_length", "pooling", "opset", "graph_optimizer")]
    scheme = (manifest.get("int8") or {}).get("chosen")
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    return repr((graphs, architecture, scheme)), digest, serve_int8, tuple(sorted(session.items()))
