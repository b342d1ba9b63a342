"""Which engine runs a bundle on this CPU: chosen by measurement at load, like the int8 graph before it.

A candidate is an engine × precision over one of the bundle's graphs (`ENGINES`): onnxruntime's int8 and fp32
graphs as exported, and OpenVINO compiling the same fp32 ``model.onnx`` for this CPU — at bf16 where the CPU has
bf16 units (AMX or AVX-512 BF16: OpenVINO's own default there), and at f32. Which is fastest depends on the CPU's
matrix units (on a Xeon with AMX, OpenVINO's bf16 ran MiniLM paragraphs ~2x faster than onnxruntime's int8; on
an AVX2-only CPU there is no bf16 to run), and so does what its reduced precision does to the vectors, so both
are measured here, where the bundle is served:

1. parity — every candidate embeds the bundle's probe texts and is held against their fp32 (torch) reference
   embeddings (``probes.npz``) with the int8 bars of `ParityBars`; a candidate below them is never served;
2. speed — the candidates that pass embed batches shaped like the served load (32 short texts; 4 texts at
   ``max_seq_length``; and 1, 4 and 16 short texts): a warm-up and then `TIMING_ROUNDS` rounds, the candidates taking
   turns on each batch in an order that alternates, each one's time per batch being the median of its rounds (a
   round disturbed by the rest of a shared machine moves a median less than a best or a mean). After each round, a
   candidate that can no longer win (`can_win`: too slow to be served on either deciding batch, or on one text) is
   not timed again and its graph is freed;
3. choice — `pick`: onnxruntime's int8 graph (the default setting) unless another engine is faster by
   `CHALLENGER_MARGIN` on each of the 32-short and 4-long batches (the fastest such by their geometric mean,
   preferring `ENGINES`' order within `SPEED_TOLERANCE`): where candidates are close on either batch the default
   wins, so the same CPU gets the same engine from one load to the next; then `pick_small`: a second engine runs the
   small batches only where it is clearly faster than the main one on one text (OpenVINO pays a larger fixed cost per
   call: on one short text it ran 1.3-3x slower than onnxruntime int8 on a busy 2-core Xeon with AMX).

A setting pins one engine instead (checked for parity, never timed); when the pinned engine or every candidate
misses the bars, the fp32 graph on onnxruntime — checked against torch at export — is served, and the
`EngineChoice` says why.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.registry import read_manifest
from core.runtime import PROBES_FILE, OnnxBundle, ParityBars, cosines, cpu_features, int8_failures, read_probes

log = logging.getLogger(__name__)

SPEED_TOLERANCE = 0.05  # a challenger this much slower than the fastest one still wins if it comes first in ENGINES
# Another engine replaces onnxruntime int8 only when this much faster on each deciding batch: ten loads on a busy
# 2-core Xeon with AMX timed OpenVINO bf16 at 0.42-1.55x of onnxruntime int8's speed on 32 short texts (1.08x in
# process, docs/BENCHMARKS.md), so "no slower" alone flipped the choice from one load to the next.
CHALLENGER_MARGIN = 1.15
TIMING_ROUNDS = 5  # timed rounds after the warm-up; each time is the median of the rounds
SHORT_BATCH = 32  # texts of the short timing batch (probe sentences)
# Texts of the long timing batch (probes cut at max_seq_length): 4, not 8 — the long batch took ~80% of the timing
# (38 s of a 49 s load of minilm-l6 on a busy 2-core Xeon), and 4 x max_seq_length is as compute-bound as 8.
LONG_BATCH = 4
SMALL_BATCHES = (1, 4, 16)  # texts of the small timing batches (probe sentences): where a second engine may serve
# A second engine runs small batches only when this much faster than the main one on one text, and keeps each larger
# small batch size unless the main engine is this much faster there: OpenVINO's 1.18x win on 16 short texts at load
# became a 0.85-0.88x loss at 1 text x 32 clients served (docs/BENCHMARKS.md).
SMALL_BATCH_MARGIN = 1.3
BATCH_SHAPES = ("short", "long")  # the batches that decide the main engine
OUT_OF_RACE = 1.3  # how far behind (ratio of medians) a candidate may be and still be timed on: the rounds' noise


@dataclass(frozen=True)
class Engine:
    """One candidate: a runtime, the bundle graph it reads and the precision it computes in."""

    name: str
    runtime: str  # core.runtime.RUNTIMES
    graph: str  # the manifest's variant: int8 or fp32
    precision: str  # what the arithmetic runs in
    why: str


# In order of preference at equal speed: the baseline first, the reference graph last.
ENGINES = (
    Engine("onnxruntime-int8", "onnxruntime", "int8", "int8", "the exported int8 graph (u8×s8 matmuls)"),
    Engine("openvino-bf16", "openvino", "fp32", "bf16", "OpenVINO on bf16 units (AMX, AVX-512 BF16)"),
    Engine("openvino-f32", "openvino", "fp32", "f32", "OpenVINO at f32: its own kernels and fusions"),
    Engine("onnxruntime-fp32", "onnxruntime", "fp32", "fp32", "the fp32 reference graph, checked against torch"),
)
BY_NAME = {engine.name: engine for engine in ENGINES}
BASELINE = "onnxruntime-int8"  # nothing slower than it is served where it passes
FALLBACK = "onnxruntime-fp32"  # served when nothing else passes
AUTO = "auto"
ENGINE_SETTINGS = (AUTO, *BY_NAME)


@dataclass
class Trial:
    """What one candidate did on this CPU. ``status``: ``passed``, ``failed`` (below the parity bars),
    ``unavailable`` (could not load here), ``disabled`` (int8 serving is off), ``no-int8`` (the bundle has no
    int8 graph), ``no-references`` (no probes to check against), ``not-tried`` (another engine is pinned)."""

    engine: str
    status: str
    reason: str = ""
    mean_cosine: float | None = None
    min_cosine: float | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # median time per timing batch (short, long, 1, 4, 16)


@dataclass(frozen=True)
class EngineChoice:
    """The engine served, the setting that asked for it, why, every candidate's trial, the CPU and how long the
    choice took (parity checks and timing, graph compilation included)."""

    engine: str
    setting: str
    reason: str
    trials: list[Trial]
    seconds: float = 0.0
    cpu: dict[str, Any] = field(default_factory=cpu_features)
    small_batch_engine: str | None = None  # runs batches of at most small_batch_tokens padded tokens, when faster
    small_batch_tokens: int = 0

    @property
    def graph(self) -> str:
        return BY_NAME[self.engine].graph

    @property
    def precision(self) -> str:
        return BY_NAME[self.engine].precision

    def trial(self, name: str) -> Trial | None:
        return next((t for t in self.trials if t.engine == name), None)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"precision": self.precision}


def _score(seconds: Mapping[str, float]) -> float:
    """Geometric mean of the main batches' times: each shape counts alike, whatever its length."""
    return math.exp(sum(math.log(seconds[shape]) for shape in BATCH_SHAPES) / len(BATCH_SHAPES))


def pick(
    trials: Sequence[Trial], margin: float = CHALLENGER_MARGIN, tolerance: float = SPEED_TOLERANCE
) -> tuple[str, str]:
    """The engine to serve among timed trials, and why (pure: the choice logic, apart from loading and timing).

    Only a ``passed`` trial is eligible. Where the baseline (onnxruntime int8, the default setting) passed, it is
    served unless a challenger is faster by ``margin`` on each deciding batch: close timings — a tie within the noise
    of a shared machine — go to the default, and nothing slower than it on either batch is ever served. Among the
    challengers that qualify (or, without a passing baseline, among every timed passing engine), the first in
    `ENGINES` order within ``tolerance`` of the fastest (geometric mean of the deciding batches) wins.
    """
    passed = [t for t in trials if t.status == "passed"]
    if not passed:
        return FALLBACK, "no candidate kept the parity bars on this CPU: serving the fp32 reference graph"
    if len(passed) == 1:
        return passed[0].engine, "the only candidate that kept the parity bars on this CPU"
    timed = [t for t in passed if t.seconds]
    times = ", ".join(f"{t.engine} {_score(t.seconds) * 1e3:.1f} ms" for t in timed)
    baseline = next((t for t in timed if t.engine == BASELINE), None)
    pool = timed
    if baseline is not None:
        pool = [
            t for t in timed
            if t is not baseline and all(t.seconds[k] * margin <= baseline.seconds[k] for k in BATCH_SHAPES)
        ]  # fmt: skip
        if not pool:
            return BASELINE, (
                f"no candidate that kept the parity bars beat the default by {margin:g}x on both deciding batches "
                f"(median geometric mean per batch: {times})"
            )
    if not pool:  # passed but never timed: nothing to rank them by
        return passed[0].engine, "the first candidate that kept the parity bars (none were timed)"
    fastest = min(_score(t.seconds) for t in pool)
    order = [engine.name for engine in ENGINES]
    near = [t for t in pool if _score(t.seconds) <= fastest * (1 + tolerance)]
    winner = min(near, key=lambda t: order.index(t.engine))
    beat = f", {margin:g}x faster than the default on both deciding batches" if baseline is not None else ""
    return winner.engine, f"fastest of the candidates that kept the parity bars{beat} (median geometric mean: {times})"


def pick_small(trials: Sequence[Trial], main: str, tokens: Mapping[str, int]) -> tuple[str | None, int]:
    """A second engine for small batches, and up to how many padded tokens it runs them: (None, 0) unless the
    passing engine fastest on one text beats ``main`` there by `SMALL_BATCH_MARGIN` — one engine serves everything
    unless another is clearly faster on small batches. That engine then runs every small timing batch on which
    ``main`` does not beat it by as much (`SMALL_BATCHES` in ascending order, stopping at the first it does), up to
    that batch's padded tokens (``tokens``): an engine built for large matrices can lose several times over on one
    text, and its thin wins on mid-sized batches did not hold under a crowded machine."""
    timed = {t.engine: t.seconds for t in trials if t.status == "passed" and t.seconds}
    if main not in timed or len(timed) < 2:
        return None, 0
    small = min((engine for engine in timed if engine != main), key=lambda engine: timed[engine]["1"])
    if timed[small]["1"] * SMALL_BATCH_MARGIN > timed[main]["1"]:
        return None, 0
    limit = 0
    for size in map(str, SMALL_BATCHES):
        if timed[main][size] * SMALL_BATCH_MARGIN <= timed[small][size]:
            break
        limit = tokens[size]
    return small, limit


def can_win(engine: str, seconds: Mapping[str, Mapping[str, float]], slack: float = OUT_OF_RACE) -> bool:
    """Whether ``engine`` may still be served, as main or small-batch engine, given the median ``seconds`` so far
    of every engine still timed (pure): the baseline always (the reference every challenger is held against); another
    engine while within ``slack`` of the baseline on both deciding batches (of the fastest, without a baseline) or
    within ``slack`` of the fastest on one text."""
    if engine == BASELINE:
        return True
    mine = seconds[engine]
    best = {k: min(s[k] for s in seconds.values()) for k in mine}
    main_bar = seconds.get(BASELINE, best)
    as_main = all(mine[k] <= slack * main_bar[k] for k in BATCH_SHAPES)
    return as_main or mine["1"] <= slack * best["1"]


def _timing_batches(bundle: OnnxBundle, texts: Sequence[str]) -> dict[str, list[str]]:
    """Batches of short probe texts (1, 4, 16 and 32) and one of texts cut at ``max_seq_length``, like the
    served load's two ends."""
    lengths = [len(e.ids) for e in bundle.tokenize(texts)]
    by_length = sorted(range(len(texts)), key=lambda i: lengths[i])
    short = [texts[i] for i in by_length if 8 <= lengths[i] <= 32] or [texts[i] for i in by_length]
    long = [texts[i] for i in by_length if lengths[i] >= bundle.max_seq_length] or [texts[by_length[-1]]]
    cycle = lambda pool, n: [pool[i % len(pool)] for i in range(n)]  # noqa: E731
    small = {str(n): cycle(short[len(short) // 2 :], n) for n in SMALL_BATCHES}
    return {"short": cycle(short, SHORT_BATCH), "long": cycle(long, LONG_BATCH), **small}


def time_engines(
    bundles: dict[str, OnnxBundle], texts: Sequence[str], rounds: int = TIMING_ROUNDS
) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Median seconds per engine and timing batch, and each batch's padded tokens: a warm-up pass, then ``rounds``
    rounds, each running one batch on every candidate in turn (alternating their order from round to round) before
    the next batch, so a drift of a shared machine hits the candidates alike where they are compared. A small
    batch's time in a round is the best of three runs (short enough for one scheduler hiccup to double them). An
    engine that cannot win after a round (`can_win`) is timed no more and removed from ``bundles`` (memory freed)."""
    first = next(iter(bundles.values()))
    feeds = {name: first.pad(first.tokenize(batch)) for name, batch in _timing_batches(first, texts).items()}
    samples: dict[str, dict[str, list[float]]] = {engine: {shape: [] for shape in feeds} for engine in bundles}
    names = list(bundles)
    for round_ in range(rounds + 1):
        for shape, feed in feeds.items():  # the candidates in turn on one batch: close in time, alike in conditions
            for engine in names if round_ % 2 else reversed(names):
                best = math.inf
                for _ in range(1 if shape in BATCH_SHAPES else 3):
                    started = time.perf_counter()
                    bundles[engine].run(feed)
                    best = min(best, time.perf_counter() - started)
                if round_:  # round 0 warms up (OpenVINO compiles each new shape on first use)
                    samples[engine][shape].append(best)
        if round_:
            medians = {e: medians_of(samples[e]) for e in names}
            out = [e for e in names if not can_win(e, medians)]
            for engine in out:
                names.remove(engine)
                del bundles[engine]
                log.info("engine %s: out of the race after %d timed rounds", engine, round_)
    return (
        {engine: medians_of(by_shape) for engine, by_shape in samples.items()},
        {shape: int(feed["input_ids"].size) for shape, feed in feeds.items()},
    )


def medians_of(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each batch's timed rounds."""
    return {shape: float(np.median(values)) for shape, values in samples.items()}


def check_parity(
    bundle: OnnxBundle, engine: str, texts: Sequence[str], reference: np.ndarray, bars: ParityBars
) -> Trial:
    """Embed the probes with ``bundle`` and hold them against the references with the int8 bars."""
    cos = cosines(bundle.encode(texts, batch_size=16), reference)
    failures = int8_failures(cos, bars, texts, label=engine)
    figures = {"mean_cosine": float(np.mean(cos)), "min_cosine": float(np.min(cos))}
    return Trial(engine, "failed" if failures else "passed", "; ".join(failures), **figures)


def _unavailable_here(engine: Engine) -> str:
    """Why ``engine`` cannot run on this machine, or '' when it can be tried."""
    if engine.runtime != "openvino":
        return ""
    try:
        import openvino as ov  # optional dependency: a missing or broken install skips its engines
    except ImportError as error:
        return f"openvino is not importable: {error}"
    if engine.precision == "bf16":
        capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        if "BF16" not in capabilities:
            return f"this CPU has no bf16 units (OpenVINO's CPU capabilities: {', '.join(capabilities)})"
    return ""


def _open(path: Path, engine: Engine, **session: Any) -> OnnxBundle:
    return OnnxBundle(path, variant=engine.graph, runtime=engine.runtime, precision=engine.precision, **session)


def load_engine(
    path: str | Path, *, engine: str = AUTO, serve_int8: bool = True, bars: ParityBars = ParityBars(), **session: Any
) -> tuple[OnnxBundle, EngineChoice]:
    """Load ``path`` with the engine chosen for this CPU (``engine="auto"``) or the one pinned by ``engine``.

    ``session`` are `OnnxBundle`'s keyword arguments (threads, spinning). Never silently worse vectors: a
    candidate that misses the bars or fails to load is skipped, logged with its reason and kept in the choice.
    """
    if engine not in ENGINE_SETTINGS:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINE_SETTINGS)}")
    started = time.perf_counter()
    path = Path(path)
    has_int8 = "int8" in read_manifest(path).get("onnx", {})
    probes = read_probes(path)
    trials: list[Trial] = []
    bundles: dict[str, OnnxBundle] = {}
    for candidate in ENGINES:
        trial = _skip_reason(candidate, engine, serve_int8, has_int8, probes is not None, path)
        if trial is None:
            trial, bundle = _try(path, candidate, probes, bars, session)
            if bundle is not None:
                bundles[candidate.name] = bundle
        if trial.status not in ("passed", "not-tried"):
            log.info("bundle %s: engine %s %s: %s", path, trial.engine, trial.status, trial.reason)
        trials.append(trial)
    small, small_tokens = None, 0
    if engine != AUTO and engine in bundles:
        served, reason = engine, "pinned by the engine setting; kept the parity bars on this CPU"
    elif engine != AUTO:
        pinned = next(t for t in trials if t.engine == engine)
        served = FALLBACK
        reason = f"{engine} is pinned but did not pass here ({pinned.status}): serving the fp32 reference graph"
    else:
        timed, tokens = time_engines(bundles, probes[0]) if len(bundles) > 1 and probes is not None else ({}, {})
        for trial in trials:
            trial.seconds = {shape: round(s, 6) for shape, s in timed.get(trial.engine, {}).items()}
        served, reason = pick(trials)
        small, small_tokens = pick_small(trials, served, tokens)
    bundle = bundles.pop(served, None) or _open(path, BY_NAME[served], **session)
    if small is not None:
        bundle.route_small_batches(bundles.get(small) or _open(path, BY_NAME[small], **session), small_tokens)
        reason += f"; batches of at most {small_tokens} padded tokens run on {small}, faster there"
    bundles.clear()  # free the candidates not served
    choice = EngineChoice(
        served, engine, reason, trials, round(time.perf_counter() - started, 2), small_batch_engine=small,
        small_batch_tokens=small_tokens,
    )  # fmt: skip
    missed = any(t.status in ("failed", "unavailable") for t in trials)  # something that should run here did not
    log_level = logging.WARNING if served == FALLBACK and missed else logging.INFO
    log.log(
        log_level, "bundle %s: serving %s on this CPU (%s; %s), chosen in %.1f s: %s",
        path, served, choice.cpu["model"], ",".join(choice.cpu["flags"]) or "no int8/bf16 extensions",
        choice.seconds, reason,
    )  # fmt: skip
    return bundle, choice


def _skip_reason(
    candidate: Engine, setting: str, serve_int8: bool, has_int8: bool, has_probes: bool, path: Path
) -> Trial | None:
    """A trial for a candidate that is not tried at all, or None when it is."""
    name = candidate.name
    if setting not in (AUTO, name):
        return Trial(name, "not-tried", f"the engine setting pins {setting}")
    if candidate.graph == "int8" and not has_int8:
        return Trial(name, "no-int8", "the bundle has no int8 graph")
    if candidate.graph == "int8" and not serve_int8:
        return Trial(name, "disabled", "int8 serving is off")
    if not has_probes and name != FALLBACK:
        return Trial(name, "no-references", f"{path} stores no {PROBES_FILE}; re-export it to check other engines")
    return None


def _try(
    path: Path, candidate: Engine, probes: tuple[list[str], np.ndarray] | None, bars: ParityBars, session: dict
) -> tuple[Trial, OnnxBundle | None]:
    """Load ``candidate`` and check its parity; the bundle is kept only when it passed."""
    reason = _unavailable_here(candidate)
    if reason:
        return Trial(candidate.name, "unavailable", reason), None
    try:
        bundle = _open(path, candidate, **session)
    except Exception as error:  # a runtime that cannot read or compile this graph: skip it, say why
        return Trial(candidate.name, "unavailable", f"{type(error).__name__}: {str(error)[:300]}"), None
    if probes is None:  # only the reference graph gets here: there is nothing to check it against
        return Trial(candidate.name, "passed", "no probes: the reference graph, unchecked here"), bundle
    trial = check_parity(bundle, candidate.name, *probes, bars)
    return trial, bundle if trial.status == "passed" else None
