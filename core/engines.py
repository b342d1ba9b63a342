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
2. speed — the candidates that pass are timed on batches shaped like the served load (`core.engine_timing`: 1, 4, 16
   and 32 short texts, 4 texts at ``max_seq_length``; one text after the engine sat idle, as it is served), the
   candidates taking turns on each batch, each time the median of `TIMING_ROUNDS` rounds. After each round, a
   candidate that can no longer win a batch (`can_win`) is not timed again, its graph is freed, and it no longer
   competes (its medians are of fewer rounds);
3. choice, per shape class — `pick` names the default engine: onnxruntime's int8 graph where it passed (the baseline,
   `BASELINE`), else the fastest that passed. Then `pick_routes`: each timing batch is the shape class of the served
   batches nearest its shape, and a challenger takes a class only where it is faster than the default by
   `CHALLENGER_MARGIN` on that class's batch (`SMALL_BATCH_MARGIN` on the small ones, whose timings are the
   noisiest), the fastest such preferring `ENGINES`' order within `SPEED_TOLERANCE`. Where candidates are close the
   default keeps the class (a tie within a shared machine's noise does not hand it over), and no class is served by
   an engine slower than the default on its timing batch — but a class between two that one challenger took goes to
   it where it is no slower (its lead follows the batch's size; a dip under the margin between two wins is noise:
   `pick_routes`). The classes of one engine make its route, and the bundle runs each batch on the engine of the
   timing batch nearest it by texts and padded length, both on log scales (`OnnxBundle.route_batches`,
   `core.runtime.nearest_shape`). Both, not padded tokens alone: OpenVINO's lead grew with the batch's tokens, but
   on a 2-core Xeon with AMX its int8 graph was the fastest on 32 and 64 short texts and its bf16 on paragraphs,
   and a bound on padded tokens sent 64 short texts (1,472 tokens) with 4 long ones (1,024) to bf16, 1.02-1.23x
   slower on them (docs/BENCHMARKS.md).

The timings are kept for the process (`TIMED`): a later load of graphs of the same shapes — the next version of a
served model, as an /adapt job publishes it — checks only the engines whose routes they chose and reuses the timings,
so a registry poll does not time every candidate again on a serving replica.

A setting pins one engine instead (checked for parity, never timed); when the pinned engine or every candidate
misses the bars, the fp32 graph on onnxruntime — checked against torch at export — is served, and the
`EngineChoice` says why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.engine_choice import (
    AUTO,
    BASELINE,
    BY_NAME,
    ENGINE_SETTINGS,
    ENGINES,
    FALLBACK,
    Engine,
    EngineChoice,
    Trial,
    can_win,
    describe,
    pick,
    pick_routes,
)
from core.engine_timing import TIMED, Timed, speed_key, time_engines
from core.registry import read_manifest
from core.runtime import (
    PROBES_FILE,
    OnnxBundle,
    ParityBars,
    Shape,
    cosines,
    graph_files,
    int8_failures,
    probe_cosines,
    read_probes,
)

log = logging.getLogger(__name__)


def check_parity(
    bundle: OnnxBundle, engine: str, texts: Sequence[str], reference: np.ndarray, bars: ParityBars
) -> Trial:
    """Embed the probes with ``bundle`` and hold them against the references with the int8 bars. onnxruntime's
    dynamic int8 takes its scales over the whole batch, padding included, so there each probe counts at the worse
    of length-sorted and mixed-length batches (`probe_cosines`), as the export measured it; the other graphs (fp32,
    OpenVINO's static int8 and bf16) do not depend on the batch, and length-sorted batches, which pad little, check
    them at half the cost (mixed batches pad every probe to the longest: a second, slower pass per engine)."""
    if bundle.runtime == "onnxruntime" and bundle.variant == "int8":
        cos = probe_cosines(bundle, texts, reference)
    else:
        cos = cosines(bundle.encode(list(texts), batch_size=16), reference)
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
    shapes: dict[str, Shape] = {}
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
            timed, shapes = {e: s for e, s in earlier.seconds.items() if e in bundles}, earlier.shapes
        elif len(bundles) > 1 and probes is not None:
            broken: dict[str, str] = {}
            timed, shapes = time_engines(bundles, probes[0], still_in=can_win, failed=broken)
            for trial in trials:
                if trial.engine in broken:
                    trial.status, trial.reason = "unavailable", broken[trial.engine]
        for trial in trials:
            trial.seconds = {shape: round(s, 6) for shape, s in timed.get(trial.engine, {}).items()}
        # Only the engines timed to the last round compete: an engine out of the race has medians of fewer rounds.
        contenders = [t for t in trials if t.status != "passed" or t.engine in bundles]
        slower = [t.engine for t in trials if t.status == "passed" and t.engine not in bundles]
        default, reason = pick(contenders, slower=slower)
    routes = pick_routes(contenders, default, shapes)
    if len(routes) > 1 or routes[0].engine != default:  # a challenger took some batch sizes, or all of them
        reason += f"; {describe(routes)}, each faster there by the margin"
    if earlier is not None:
        reason += f"; timed on {earlier.version}, whose graphs have these shapes, earlier in this process"
    elif key is not None and shapes:
        routed = {r.engine for r in routes} | ({BASELINE} & bundles.keys())
        version = f"{manifest.get('name')} version {manifest.get('version')}"
        TIMED[key] = Timed(version, {e: timed[e] for e in bundles}, shapes, frozenset(routed))
    kept = {r.engine: bundles.pop(r.engine) for r in routes if r.engine in bundles}
    bundles.clear()  # free the candidates not served before opening what was not kept
    bundle = open_routes(path, [(r.engine, r.shapes) for r in routes], kept, **session)
    served = routes[-1].engine
    seconds = round(time.perf_counter() - started, 2)
    choice = EngineChoice(served, engine, reason, trials, routes, shapes, seconds)
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
    path: str | Path,
    routes: Sequence[tuple[str, Sequence[Sequence[int]]]],
    opened: Mapping[str, OnnxBundle] = {},
    **session: Any,
) -> OnnxBundle:
    """The bundle at ``path`` on the last route's engine, each batch run as ``routes`` — (engine, the shapes of its
    timing batches), as `EngineChoice.routes` — say; one route (its shapes may be empty) runs every batch. Engines
    in ``opened`` are reused, the others opened with ``session`` (`OnnxBundle`'s keyword arguments)."""
    bundles = dict(opened)
    for name, _ in routes:
        bundles[name] = bundles.get(name) or _open(Path(path), BY_NAME[name], **session)
    bundle = bundles[routes[-1][0]]
    if len(routes) > 1:
        bundle.route_batches([((rows, width), bundles[name]) for name, shapes in routes for rows, width in shapes])
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
    try:
        trial = check_parity(bundle, candidate.name, *probes, bars)
    except Exception as error:  # a runtime that loads the graph but fails to run it: skip it, say why
        return Trial(candidate.name, "unavailable", f"failed on the probes: {type(error).__name__}: "
                     f"{str(error)[:300]}"), None  # fmt: skip
    return trial, bundle if trial.status == "passed" else None
