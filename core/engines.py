"""Which engine runs a bundle on this CPU, per batch size: chosen by measurement at load, like the int8 graph before it.

A candidate is an engine × precision over one of the bundle's graphs (`ENGINES`): onnxruntime's int8 and fp32
graphs as exported, OpenVINO compiling the same fp32 ``model.onnx`` for this CPU — at bf16 where the CPU has
bf16 units (AMX or AVX-512 BF16: OpenVINO's own default there), and at f32 — and OpenVINO running the bundle's
own int8 graph for it (NNCF's, built at export where OpenVINO and NNCF are installed: `export.openvino_int8`).
Which is fastest depends on the CPU's matrix units and on the batch: on a busy 2-core Xeon with AMX, OpenVINO's
bf16 ran 4 MiniLM paragraphs 1.7-2.8x faster than onnxruntime's int8, but 32 short texts at 0.7-0.94x of its
speed and one short text 1.3-3x slower (a fixed cost per call); on an AMD EPYC with AVX-512 VNNI and BF16 and no
AMX, bf16 was slower than onnxruntime's int8 and OpenVINO's int8 1.2-1.5x faster; on an AVX2-only CPU there is no
bf16 to run. What reduced precision does to the vectors depends on the CPU too. So both are measured here, where the
bundle is served:

1. parity — every candidate embeds the bundle's probe texts and is held against their fp32 (torch) reference
   embeddings (``probes.npz``) with the int8 bars of `ParityBars`; a candidate below them is never served;
2. speed — the candidates that pass are timed on batches shaped like the served load (`core.engine_timing`: 1, 4,
   16 and 32 short texts, 4 texts at ``max_seq_length``), the candidates taking turns on each batch, each time the
   median of `TIMING_ROUNDS` rounds. After each round, a candidate that can no longer win a batch (`can_win`) is
   not timed again, its graph is freed, and it no longer competes (its medians are of fewer rounds);
3. choice, per shape class — `pick` names the default engine: onnxruntime's int8 graph where it passed (the
   baseline, `BASELINE`), else the fastest that passed. Then `pick_routes`: each timing batch is the shape
   class of the served batches of about its padded tokens, and a challenger takes a class only where it is faster
   than the default by `CHALLENGER_MARGIN` on that class's batch (`SMALL_BATCH_MARGIN` on the small ones, whose
   timings are the noisiest), the fastest such preferring `ENGINES`' order within `SPEED_TOLERANCE`. Where
   candidates are close the default keeps the class (a tie within a shared machine's noise does not hand it over),
   and no class is served by an engine slower than the default on its timing batch. Neighbouring classes with one engine
   make one route; a route ends halfway (geometric mean) between the padded tokens of its last timing batch and
   the next route's first, and the bundle runs each batch on the engine of the route its padded tokens fall in
   (`OnnxBundle.route_batches`). Padded tokens, not texts: the served batcher cuts batches by a token budget, and
   what separates the engines is the size of the matrices (OpenVINO's lead grew with the batch's tokens).

The timings are kept for the process (`TIMED`): a later load of graphs of the same shapes — the next version of a
served model, as an /adapt job publishes it — checks only the engines whose routes they chose and reuses the timings,
so a registry poll does not time every candidate again on a serving replica.

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

from core.engine_timing import SMALL_BATCHES, TIMED, Timed, speed_key, time_engines
from core.registry import read_manifest
from core.runtime import (
    PROBES_FILE,
    OnnxBundle,
    ParityBars,
    cosines,
    cpu_features,
    graph_files,
    int8_failures,
    read_probes,
)

log = logging.getLogger(__name__)

SPEED_TOLERANCE = 0.05  # a challenger this much slower than the fastest one still wins if it comes first in ENGINES
# A challenger takes a shape class from the default only when this much faster on its timing batch: ten loads on a
# busy 2-core Xeon with AMX timed OpenVINO bf16 at 0.42-1.55x of onnxruntime int8's speed on 32 short texts (1.08x
# in process, docs/BENCHMARKS.md), so "no slower" alone flipped the choice from one load to the next.
CHALLENGER_MARGIN = 1.15
# The margin on the small timing batches (1, 4, 16 texts): OpenVINO's 1.18x win on 16 short texts at load became a
# 0.85-0.88x loss at 1 text x 32 clients served (docs/BENCHMARKS.md).
SMALL_BATCH_MARGIN = 1.3
BATCH_SHAPES = ("short", "long")  # the batches that rank engines overall (the default, without onnxruntime int8)
OUT_OF_RACE = 1.3  # how far behind (ratio of medians) a candidate may be and still be timed on: the rounds' noise


@dataclass(frozen=True)
class Engine:
    """One candidate: a runtime, the bundle graph it reads and the precision it computes in."""

    name: str
    runtime: str  # core.runtime.RUNTIMES
    graph: str  # the manifest's variant (core.runtime.graph_files): int8, openvino-int8 or fp32
    precision: str  # what the arithmetic runs in
    why: str
    float_precision: str = ""  # OpenVINO's precision for what an int8 graph leaves in floating point

    @property
    def inference_precision(self) -> str:
        """The precision `OnnxBundle` is opened with (OpenVINO's inference precision hint)."""
        return self.float_precision or self.precision


# In order of preference at equal speed: the baseline first, the reference graph last.
ENGINES = (
    Engine("onnxruntime-int8", "onnxruntime", "int8", "int8", "the exported int8 graph (u8×s8 matmuls)"),
    Engine("openvino-bf16", "openvino", "fp32", "bf16", "OpenVINO on bf16 units (AMX, AVX-512 BF16)"),
    Engine(
        "openvino-int8",
        "openvino",
        "openvino-int8",
        "int8",
        "NNCF's int8 graph on OpenVINO's int8 kernels (VNNI, AMX), the rest at f32",
        float_precision="f32",
    ),
    Engine("openvino-f32", "openvino", "fp32", "f32", "OpenVINO at f32: its own kernels and fusions"),
    Engine("onnxruntime-fp32", "onnxruntime", "fp32", "fp32", "the fp32 reference graph, checked against torch"),
)
BY_NAME = {engine.name: engine for engine in ENGINES}
BASELINE = "onnxruntime-int8"  # the default where it passes: nothing slower than it on a shape class runs that class
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
    seconds: dict[str, float] = field(default_factory=dict)  # median time per timing batch (1, 4, 16, short, long)


@dataclass(frozen=True)
class Route:
    """Batches of at most ``max_tokens`` padded tokens (``None``: no bound) that no earlier route takes run on
    ``engine``, chosen on the timing batches ``batches``; ``reason`` gives each batch's times."""

    engine: str
    max_tokens: int | None
    batches: list[str]
    reason: str


@dataclass(frozen=True)
class EngineChoice:
    """The engines served and for which batch sizes (``routes``, ascending; ``engine`` runs the largest batches),
    the setting that asked for them, why, every candidate's trial, each timing batch's padded tokens, the CPU and how
    long the choice took (parity checks and timing, graph compilation included)."""

    engine: str
    setting: str
    reason: str
    trials: list[Trial]
    routes: list[Route]
    batch_tokens: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    cpu: dict[str, Any] = field(default_factory=cpu_features)

    @property
    def graph(self) -> str:
        return BY_NAME[self.engine].graph

    @property
    def precision(self) -> str:
        return BY_NAME[self.engine].precision

    def trial(self, name: str) -> Trial | None:
        return next((t for t in self.trials if t.engine == name), None)

    def as_dict(self) -> dict[str, Any]:
        routes = [asdict(r) | {"precision": BY_NAME[r.engine].precision} for r in self.routes]
        return asdict(self) | {"precision": self.precision, "routes": routes}


def _score(seconds: Mapping[str, float]) -> float:
    """Geometric mean of the short and long batches' times: each shape counts alike, whatever its length."""
    return math.exp(sum(math.log(seconds[shape]) for shape in BATCH_SHAPES) / len(BATCH_SHAPES))


def _first_of_fastest(pool: Sequence[str], seconds: Mapping[str, float], tolerance: float) -> str:
    """The engine of ``pool`` first in `ENGINES` order among those within ``tolerance`` of the fastest."""
    fastest = min(seconds[engine] for engine in pool)
    order = [engine.name for engine in ENGINES]
    return min((e for e in pool if seconds[e] <= fastest * (1 + tolerance)), key=order.index)


def pick(trials: Sequence[Trial], tolerance: float = SPEED_TOLERANCE) -> tuple[str, str]:
    """The default engine among the trials — the one that runs every shape class no challenger takes
    (`pick_routes`) — and why (pure: the choice logic, apart from loading and timing).

    Only a ``passed`` trial is eligible: onnxruntime int8 (the baseline) where it passed; else the fastest
    timed passing engine by the geometric mean of the short and long batches, the first in `ENGINES` order within
    ``tolerance`` of it; with nothing passed, the fp32 reference graph.
    """
    passed = [t for t in trials if t.status == "passed"]
    if not passed:
        return FALLBACK, "no candidate kept the parity bars on this CPU: serving the fp32 reference graph"
    if any(t.engine == BASELINE for t in passed):
        return BASELINE, f"{BASELINE} kept the parity bars: the default"
    if len(passed) == 1:
        return passed[0].engine, "the only candidate that kept the parity bars on this CPU"
    timed = {t.engine: _score(t.seconds) for t in passed if t.seconds}
    if not timed:  # passed but never timed: nothing to rank them by
        return passed[0].engine, "the first candidate that kept the parity bars (none were timed)"
    times = ", ".join(f"{engine} {score * 1e3:.1f} ms" for engine, score in timed.items())
    winner = _first_of_fastest(list(timed), timed, tolerance)
    return winner, (
        f"the fastest that kept the parity bars, or first in engine order within {tolerance:.0%} of it; {BASELINE} "
        f"did not (median geometric mean: {times})"
    )


def pick_routes(
    trials: Sequence[Trial], default: str, batch_tokens: Mapping[str, int], tolerance: float = SPEED_TOLERANCE
) -> list[Route]:
    """Which engine runs which batch sizes (pure): per timing batch (``batch_tokens``: its padded tokens), the
    ``default`` unless a passing challenger is faster there by the margin (`SMALL_BATCH_MARGIN` on the small
    batches, else `CHALLENGER_MARGIN`; the first in `ENGINES` order within ``tolerance`` of the fastest such; timing
    batches of equal padded tokens are decided together, a challenger having to win each). Neighbouring batches with
    one engine make one route, which ends halfway (geometric mean) between its last batch's padded tokens and the
    next route's first. One route, the default's, when nothing was timed against it."""
    timed = {t.engine: t.seconds for t in trials if t.status == "passed" and t.seconds}
    if default not in timed or len(timed) < 2 or not batch_tokens:
        return [Route(default, None, [], "")]
    classes: list[tuple[str, list[str], list[str]]] = []  # (engine, batches, reasons) of each route
    for size in sorted(set(batch_tokens.values())):
        group = [batch for batch, tokens in batch_tokens.items() if tokens == size]
        engine, reasons = _fastest_on(group, timed, default, batch_tokens, tolerance)
        if classes and classes[-1][0] == engine:
            classes[-1][1].extend(group)
            classes[-1][2].extend(reasons)
        else:
            classes.append((engine, group, reasons))
    routes = []
    for (engine, batches, reasons), after in zip(classes, [*classes[1:], None], strict=True):
        bound = None if after is None else int(math.sqrt(batch_tokens[batches[-1]] * batch_tokens[after[1][0]]))
        routes.append(Route(engine, bound, batches, "; ".join(reasons)))
    return routes


def _fastest_on(
    group: Sequence[str],
    timed: Mapping[str, Mapping[str, float]],
    default: str,
    batch_tokens: Mapping[str, int],
    tolerance: float,
) -> tuple[str, list[str]]:
    """The engine for timing batches of one padded size, and each batch's times: ``default`` unless another is
    faster by the margin on each batch of ``group``."""
    margin = {b: SMALL_BATCH_MARGIN if b in SMALL_BATCHES else CHALLENGER_MARGIN for b in group}
    faster = [e for e in timed if e != default and all(timed[e][b] * margin[b] <= timed[default][b] for b in group)]
    score = {e: math.prod(timed[e][b] for b in group) for e in faster}
    engine = _first_of_fastest(faster, score, tolerance) if faster else default
    reasons = []
    for batch in group:
        ms = {e: f"{seconds[batch] * 1e3:.1f} ms" for e, seconds in timed.items()}
        ratio = timed[default][batch] / timed[engine][batch]
        verdict = f"{ratio:.2f}x faster than {default}" if faster else f"no other {margin[batch]:g}x faster"
        others = ", ".join(f"{e} {ms[e]}" for e in timed if e != engine)
        reasons.append(f"{batch} ({batch_tokens[batch]} tokens): {engine} {ms[engine]}, {verdict} ({others})")
    return engine, reasons


def can_win(engine: str, seconds: Mapping[str, Mapping[str, float]], slack: float = OUT_OF_RACE) -> bool:
    """Whether ``engine`` may still take a shape class, given the median ``seconds`` so far of every engine still
    timed (pure): the baseline always (the default every challenger is held against); another engine while within
    ``slack`` of the baseline (of the fastest, without a baseline) on some timing batch."""
    if engine == BASELINE:
        return True
    mine = seconds[engine]
    bar = seconds.get(BASELINE) or {k: min(s[k] for s in seconds.values()) for k in mine}
    return any(mine[k] <= slack * bar[k] for k in mine)


def describe(routes: Sequence[Route]) -> str:
    """The routes in a line: which engine runs which padded batch sizes."""
    if len(routes) == 1:
        return f"{routes[0].engine} runs every batch"
    spans, low = [], 0
    for route in routes:
        span = f"above {low}" if route.max_tokens is None else f"{low + 1}-{route.max_tokens}"
        spans.append(f"{span} padded tokens on {route.engine}")
        low = route.max_tokens or low
    return "batches of " + ", ".join(spans)


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
    return OnnxBundle(
        path, variant=engine.graph, runtime=engine.runtime, precision=engine.inference_precision, **session
    )


def load_engine(
    path: str | Path, *, engine: str = AUTO, serve_int8: bool = True, bars: ParityBars = ParityBars(), **session: Any
) -> tuple[OnnxBundle, EngineChoice]:
    """Load ``path`` with the engine chosen for this CPU (``engine="auto"``) or the one pinned by ``engine``.

    ``session`` are `OnnxBundle`'s keyword arguments (threads, spinning). Never silently worse vectors: a
    candidate that misses the bars or fails to load is skipped, logged with its reason and kept in the choice.
    Where this process already timed graphs of the same shapes (`TIMED`), those timings decide: only the engines
    that ran their routes and the baseline are loaded and checked for parity, and when one of those misses the bars
    here, or the baseline passes where it had not been timed, every candidate is checked and timed as on a first load.
    """
    if engine not in ENGINE_SETTINGS:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINE_SETTINGS)}")
    started = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    probes = read_probes(path)
    key = speed_key(path, manifest, probes[0], serve_int8, session) if engine == AUTO and probes else None
    earlier = TIMED.get(key) if key else None
    candidates = dict(setting=engine, serve_int8=serve_int8, graphs=set(graph_files(manifest)), probes=probes,
                      bars=bars, session=session)  # fmt: skip
    trials, bundles = _check(path, earlier=earlier, **candidates)
    if earlier is not None and not earlier.engines <= bundles.keys() <= earlier.seconds.keys():
        # a route's engine misses the bars here, or the baseline passes where it did not when they were timed
        bundles.clear()
        earlier = None
        trials, bundles = _check(path, earlier=None, **candidates)
    tokens: dict[str, int] = {}
    contenders = trials  # the trials the routes are chosen among
    if engine != AUTO and engine in bundles:
        default, reason = engine, "pinned by the engine setting; kept the parity bars on this CPU"
    elif engine != AUTO:
        default = FALLBACK
        status = next(t.status for t in trials if t.engine == engine)
        reason = f"{engine} is pinned but did not pass here ({status}): serving the fp32 reference graph"
    else:
        timed: dict[str, dict[str, float]] = {}
        if earlier is not None:  # the engines checked again: those of its routes
            timed, tokens = {e: s for e, s in earlier.seconds.items() if e in bundles}, earlier.tokens
        elif len(bundles) > 1 and probes is not None:
            timed, tokens = time_engines(bundles, probes[0], still_in=can_win)
        for trial in trials:
            trial.seconds = {shape: round(s, 6) for shape, s in timed.get(trial.engine, {}).items()}
        # Only the engines timed to the last round compete: an engine out of the race has medians of fewer rounds.
        contenders = [t for t in trials if t.status != "passed" or t.engine in bundles]
        default, reason = pick(contenders)
    routes = pick_routes(contenders, default, tokens)
    if len(routes) > 1 or routes[0].engine != default:  # a challenger took some batch sizes, or all of them
        reason += f"; {describe(routes)}, each faster there by the margin"
    if earlier is not None:
        reason += f"; timed on {earlier.version}, whose graphs have these shapes, earlier in this process"
    elif key is not None and tokens:
        routed = {r.engine for r in routes} | ({BASELINE} & bundles.keys())
        version = f"{manifest.get('name')} version {manifest.get('version')}"
        TIMED[key] = Timed(version, {e: timed[e] for e in bundles}, tokens, frozenset(routed))
    kept = {r.engine: bundles.pop(r.engine) for r in routes if r.engine in bundles}
    bundles.clear()  # free the candidates not served before opening what was not kept
    bundle = open_routes(path, [(r.engine, r.max_tokens) for r in routes], kept, **session)
    served = routes[-1].engine
    seconds = round(time.perf_counter() - started, 2)
    choice = EngineChoice(served, engine, reason, trials, routes, tokens, seconds)
    missed = any(t.status in ("failed", "unavailable") for t in trials)  # something that should run here did not
    log_level = logging.WARNING if served == FALLBACK and missed else logging.INFO
    log.log(
        log_level, "bundle %s: %s on this CPU (%s; %s), chosen in %.1f s: %s",
        path, describe(routes), choice.cpu["model"], ",".join(choice.cpu["flags"]) or "no int8/bf16 extensions",
        choice.seconds, reason,
    )  # fmt: skip
    return bundle, choice


def _check(
    path: Path,
    *,
    setting: str,
    serve_int8: bool,
    graphs: set[str],
    probes: tuple[list[str], np.ndarray] | None,
    bars: ParityBars,
    session: dict[str, Any],
    earlier: Timed | None,
) -> tuple[list[Trial], dict[str, OnnxBundle]]:
    """Every candidate's trial, and the bundles of those that passed; with ``earlier`` timings, only the engines
    they name and the baseline are tried."""
    trials: list[Trial] = []
    bundles: dict[str, OnnxBundle] = {}
    for candidate in ENGINES:
        trial = _skip_reason(candidate, setting, serve_int8, graphs, probes is not None, path)
        if trial is None and earlier is not None and candidate.name not in earlier.engines | {BASELINE}:
            trial = Trial(candidate.name, "not-tried", f"ran no route when {earlier.version} was timed")
        if trial is None:
            trial, bundle = _try(path, candidate, probes, bars, session)
            if bundle is not None:
                bundles[candidate.name] = bundle
        if trial.status not in ("passed", "not-tried"):
            log.info("bundle %s: engine %s %s: %s", path, trial.engine, trial.status, trial.reason)
        trials.append(trial)
    return trials, bundles


def open_routes(
    path: str | Path, routes: Sequence[tuple[str, int | None]], opened: Mapping[str, OnnxBundle] = {}, **session: Any
) -> OnnxBundle:
    """The bundle at ``path`` on the last route's engine, each batch run as ``routes`` — (engine, max padded tokens)
    in ascending order, as `EngineChoice.routes` — say; engines in ``opened`` are reused, the others opened with
    ``session`` (`OnnxBundle`'s keyword arguments)."""
    bundles = dict(opened)
    for name, _ in routes:
        bundles[name] = bundles.get(name) or _open(Path(path), BY_NAME[name], **session)
    bundle = bundles[routes[-1][0]]
    bundle.route_batches([(max_tokens or 0, bundles[name]) for name, max_tokens in routes[:-1]])
    return bundle


def _skip_reason(
    candidate: Engine, setting: str, serve_int8: bool, graphs: set[str], has_probes: bool, path: Path
) -> Trial | None:
    """A trial for a candidate that is not tried at all, or None when it is."""
    name = candidate.name
    if setting not in (AUTO, name):
        return Trial(name, "not-tried", f"the engine setting pins {setting}")
    if candidate.graph not in graphs:  # only int8 graphs are optional: fp32 is every bundle's
        return Trial(name, "no-int8", f"the bundle has no {candidate.graph} graph")
    if candidate.precision == "int8" and not serve_int8:
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
