"""The candidate engines and the choice among them, as pure functions of their trials: which engine is the default
(`pick`) and which runs each batch size (`pick_routes`). `core.engines` loads, checks and times the candidates and
calls these; its docstring tells the whole process.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.engine_timing import SMALL_BATCHES
from core.runtime import Shape, cpu_features, nearest_shape

SPEED_TOLERANCE = 0.05  # a challenger this much slower than the fastest one still wins if it comes first in ENGINES
# A challenger takes a shape class from the default only when this much faster on its timing batch: five loads on a
# busy 2-core Xeon with AMX timed OpenVINO bf16 at 0.49-1.55x of onnxruntime int8's speed on 32 short texts (1.08x
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
    """The served batches nearest in shape to the timing batches ``batches`` — ``shapes``: each one's texts and
    padded length (`core.runtime.nearest_shape`) — run on ``engine``, chosen on those batches; ``reason`` gives each
    batch's times. A lone route runs every batch."""

    engine: str
    batches: list[str]
    shapes: list[Shape]
    reason: str


@dataclass(frozen=True)
class EngineChoice:
    """The engines served and for which batches (``routes``, by their largest timing batch's padded tokens,
    ascending; ``engine`` runs the largest batches), the setting that asked for them, why, every candidate's trial,
    each timing batch's shape (texts, padded length), the CPU and how long the choice took (parity checks and timing,
    graph compilation included)."""

    engine: str
    setting: str
    reason: str
    trials: list[Trial]
    routes: list[Route]
    batch_shapes: dict[str, Shape] = field(default_factory=dict)
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


def pick(trials: Sequence[Trial], tolerance: float = SPEED_TOLERANCE, slower: Sequence[str] = ()) -> tuple[str, str]:
    """The default engine among the trials — the one that runs every shape class no challenger takes
    (`pick_routes`) — and why (pure: the choice logic, apart from loading and timing).

    Only a ``passed`` trial is eligible: onnxruntime int8 (the baseline) where it passed; else the fastest
    timed passing engine by the geometric mean of the short and long batches, the first in `ENGINES` order within
    ``tolerance`` of it; with nothing passed, the fp32 reference graph. ``slower``: engines that kept the parity bars
    too but left the timing race early, each slower than one still in it (not among ``trials``; named in the reason).
    """
    passed = [t for t in trials if t.status == "passed"]
    if not passed:
        return FALLBACK, "no candidate kept the parity bars on this CPU: serving the fp32 reference graph"
    if any(t.engine == BASELINE for t in passed):
        return BASELINE, f"{BASELINE} kept the parity bars: the default"
    left_early = f"; {', '.join(slower)} kept them too, slower: out of the timing race" if slower else ""
    if len(passed) == 1 and slower:
        return passed[0].engine, f"the fastest that kept the parity bars on this CPU; {BASELINE} did not{left_early}"
    if len(passed) == 1:
        return passed[0].engine, "the only candidate that kept the parity bars on this CPU"
    timed = {t.engine: _score(t.seconds) for t in passed if t.seconds}
    if not timed:  # passed but never timed: nothing to rank them by
        return passed[0].engine, "the first candidate that kept the parity bars (none were timed)"
    times = ", ".join(f"{engine} {score * 1e3:.1f} ms" for engine, score in timed.items())
    winner = _first_of_fastest(list(timed), timed, tolerance)
    return winner, (
        f"the fastest that kept the parity bars, or first in engine order within {tolerance:.0%} of it; {BASELINE} "
        f"did not (median geometric mean: {times}){left_early}"
    )


def pick_routes(
    trials: Sequence[Trial], default: str, batch_shapes: Mapping[str, Shape], tolerance: float = SPEED_TOLERANCE
) -> list[Route]:
    """Which engine runs which batches (pure): per timing batch (``batch_shapes``: its texts and padded length), the
    ``default`` unless a passing challenger is faster there by the margin (`SMALL_BATCH_MARGIN` on the small
    batches, else `CHALLENGER_MARGIN`; the first in `ENGINES` order within ``tolerance`` of the fastest such; timing
    batches of one shape are decided together, a challenger having to win each). A batch the default keeps between
    two (by padded tokens) one challenger took goes to that challenger where it is no slower there (`_island`). The
    timing batches of one engine make its route; a served batch runs on the route of the timing batch nearest its
    shape (`core.runtime.nearest_shape`): 64 short texts on the engine of 32 short ones, not of 4 long ones of as
    many padded tokens. The default timed alone (a new version reusing the timings of its route) holds every timing
    batch, as a race it won does; one route of no shapes when the default was not timed."""
    timed = {t.engine: t.seconds for t in trials if t.status == "passed" and t.seconds}
    if default not in timed or not batch_shapes:
        return [Route(default, [], [], "")]
    tokens = {batch: math.prod(shape) for batch, shape in batch_shapes.items()}
    sizes = []  # (engine, reasons, batches) of each shape, by padded tokens ascending
    for shape in sorted(set(batch_shapes.values()), key=lambda s: (math.prod(s), s)):
        group = [batch for batch, of in batch_shapes.items() if of == shape]
        sizes.append((*_fastest_on(group, timed, default, tokens, tolerance), group))
    by_engine: dict[str, tuple[list[str], list[str]]] = {}  # engine: (batches, reasons), by padded tokens
    for i, (engine, reasons, group) in enumerate(sizes):
        neighbours = {sizes[j][0] for j in (i - 1, i + 1)} if 0 < i < len(sizes) - 1 else set()
        if engine == default and len(neighbours) == 1 and default not in neighbours:
            engine, reasons = _island(group, timed, default, neighbours.pop(), tokens) or (engine, reasons)
        batches, why = by_engine.setdefault(engine, ([], []))
        batches.extend(group)
        why.extend(reasons)
    routes = [Route(e, b, [batch_shapes[x] for x in b], "; ".join(r)) for e, (b, r) in by_engine.items()]
    return sorted(routes, key=lambda route: tokens[route.batches[-1]])


def _fastest_on(
    group: Sequence[str],
    timed: Mapping[str, Mapping[str, float]],
    default: str,
    tokens: Mapping[str, int],
    tolerance: float,
) -> tuple[str, list[str]]:
    """The engine for timing batches of one padded size, and each batch's times: ``default`` unless another is
    faster by the margin on each batch of ``group``."""
    margin = {b: SMALL_BATCH_MARGIN if b in SMALL_BATCHES else CHALLENGER_MARGIN for b in group}
    faster = [e for e in timed if e != default and all(timed[e][b] * margin[b] <= timed[default][b] for b in group)]
    score = {e: math.prod(timed[e][b] for b in group) for e in faster}
    engine = _first_of_fastest(faster, score, tolerance) if faster else default
    return engine, _reasons(engine, default, group, timed, tokens, margin=margin)


def _island(
    group: Sequence[str],
    timed: Mapping[str, Mapping[str, float]],
    default: str,
    neighbour: str,
    tokens: Mapping[str, int],
) -> tuple[str, list[str]] | None:
    """``neighbour`` for timing batches of one padded size that the default kept but ``neighbour`` took on both
    sides, where it was no slower on each (an engine's lead follows the batch's size: a dip under the margin
    between two wins is the machine's noise), with each batch's times; else None."""
    if not all(timed[neighbour][b] <= timed[default][b] for b in group):
        return None
    why = "under the margin but between two sizes it took"
    return neighbour, _reasons(neighbour, default, group, timed, tokens, why=why)


def _reasons(
    engine: str,
    default: str,
    group: Sequence[str],
    timed: Mapping[str, Mapping[str, float]],
    tokens: Mapping[str, int],
    *,
    margin: Mapping[str, float] | None = None,
    why: str = "",
) -> list[str]:
    """Each timing batch's line of a route's reason: ``engine``'s time, how much faster than ``default`` it is and
    ``why`` (the default itself: no other faster by its ``margin``), and every other engine's time."""
    reasons = []
    for batch in group:
        ms = {e: f"{seconds[batch] * 1e3:.1f} ms" for e, seconds in timed.items()}
        if engine == default:
            verdict = f"no other {(margin or {}).get(batch, 1):g}x faster"
        else:
            verdict = f"{timed[default][batch] / timed[engine][batch]:.2f}x faster than {default}"
            verdict += f", {why}" if why else ""
        others = ", ".join(f"{e} {ms[e]}" for e in timed if e != engine)
        reasons.append(f"{batch} ({tokens[batch]} tokens): {engine} {ms[engine]}, {verdict} ({others})")
    return reasons


def can_win(engine: str, seconds: Mapping[str, Mapping[str, float]], slack: float = OUT_OF_RACE) -> bool:
    """Whether ``engine`` may still take a shape class, given the median ``seconds`` so far of every engine still
    timed (pure): the baseline always (the default every challenger is held against); another engine while within
    ``slack`` of the baseline (of the fastest, without a baseline) on some timing batch."""
    if engine == BASELINE:
        return True
    mine = seconds[engine]
    bar = seconds.get(BASELINE) or {k: min(s[k] for s in seconds.values()) for k in mine}
    return any(mine[k] <= slack * bar[k] for k in mine)


def route_for(routes: Sequence[Route], rows: int, width: int) -> Route:
    """The route that runs a batch of ``rows`` texts padded to ``width`` tokens, as `core.engines.open_routes` routes
    it: the one of the timing batch nearest it (`core.runtime.nearest_shape`); a lone route runs every batch."""
    if len(routes) == 1:
        return routes[0]
    owners = [(shape, route) for route in routes for shape in route.shapes]
    return owners[nearest_shape([shape for shape, _ in owners], rows, width)][1]


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    """Timing batches' shapes as a label: ``1x22,4x14`` (texts x padded length)."""
    return ",".join(f"{rows}x{width}" for rows, width in shapes)


def describe(routes: Sequence[Route]) -> str:
    """The routes in a line: which engine runs the batches nearest which timing batches (texts x padded length)."""
    if len(routes) == 1:
        return f"{routes[0].engine} runs every batch"
    spans = "; ".join(f"{shapes_text(route.shapes)} on {route.engine}" for route in routes)
    return f"batches nearest {spans} (texts x padded length)"
