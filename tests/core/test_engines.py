"""The engine choice: `pick` and `pick_routes` on made-up trials (the rules, whatever this CPU is), and `load_engine`
on a real small bundle (parity checks against its probes, routing by batch size, pinning, fallbacks, a candidate
that cannot load)."""

from __future__ import annotations

import itertools
import json
import logging
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from core import engine_choice, engine_timing, engines, registry, runtime
from core.engine_choice import BASELINE, ENGINES, FALLBACK, Trial, pick, pick_routes, route_for
from core.engines import load_engine
from tests.padded_int8 import padding_moves_int8

BATCHES = engine_timing.BATCHES
SHAPES = {"1": (1, 20), "4": (4, 20), "16": (16, 20), "short": (32, 20), "long": (8, 256)}  # texts x padded length


def _passed(engine: str, short: float, long: float, *small: float) -> Trial:
    seconds = {"short": short, "long": long} | dict(zip(("1", "4", "16"), small or (0.002, 0.006, 0.02), strict=True))
    return Trial(engine, "passed", mean_cosine=0.995, min_cosine=0.98, seconds=seconds)


def _routes(trials: list[Trial]) -> list[tuple[str, list[str]]]:
    return [(r.engine, r.batches) for r in pick_routes(trials, pick(trials)[0], SHAPES)]


# --- pick and pick_routes: the rules ---------------------------------------------------------------------------


def test_a_challenger_takes_only_the_batch_sizes_it_is_clearly_faster_on() -> None:
    # OpenVINO twice as fast on long texts, slower on short ones: it takes the long batches only, the default the rest.
    trials = [_passed(BASELINE, 0.040, 0.200), _passed("openvino-bf16", 0.045, 0.100), _passed(FALLBACK, 0.1, 0.5)]
    assert pick(trials)[0] == BASELINE
    assert _routes(trials) == [(BASELINE, ["1", "4", "16", "short"]), ("openvino-bf16", ["long"])]
    routes = pick_routes(trials, BASELINE, SHAPES)
    assert [r.shapes for r in routes] == [[(1, 20), (4, 20), (16, 20), (32, 20)], [(8, 256)]]
    assert "long (2048 tokens): openvino-bf16 100.0 ms, 2.00x faster than onnxruntime-int8" in routes[1].reason
    assert "no other 1.15x faster" in routes[0].reason
    assert engine_choice.describe(routes) == (
        f"batches nearest 1x20,4x20,16x20,32x20 on {BASELINE}; 8x256 on openvino-bf16 (texts x padded length)"
    )
    # Served batches go by shape, not padded tokens: 64 short texts (1,280 tokens) run with the 32 short ones, not
    # with the long batch they outnumber in tokens; one long text runs with the long batch.
    assert route_for(routes, 64, 20).engine == BASELINE and route_for(routes, 128, 24).engine == BASELINE
    assert route_for(routes, 1, 256).engine == route_for(routes, 16, 200).engine == "openvino-bf16"
    # Faster on every batch by the margins: one route, the challenger's.
    trials[1] = _passed("openvino-bf16", 0.030, 0.100, 0.001, 0.004, 0.01)
    assert _routes(trials) == [("openvino-bf16", list(SHAPES))]
    assert engine_choice.describe(pick_routes(trials, BASELINE, SHAPES)) == "openvino-bf16 runs every batch"


def test_the_default_timed_alone_holds_every_shape_as_a_won_race_does() -> None:
    # A new version of the same graphs re-checks only the routed engines: with the default the one left, its lone
    # route is the one the race gave it (every timing batch), not the "nothing timed" route of no shapes.
    won = pick_routes([_passed(BASELINE, 0.040, 0.200), _passed(FALLBACK, 0.1, 0.5)], BASELINE, SHAPES)
    alone = pick_routes([_passed(BASELINE, 0.040, 0.200)], BASELINE, SHAPES)
    assert [(r.engine, r.batches, r.shapes) for r in alone] == [(r.engine, r.batches, r.shapes) for r in won]
    assert alone[0].shapes == list(SHAPES.values())
    assert pick_routes([_passed(BASELINE, 0.040, 0.200)], BASELINE, {})[0].shapes == []


def test_an_engine_below_the_parity_bars_is_never_served_however_fast() -> None:
    failed = Trial("openvino-bf16", "failed", "openvino-bf16: min cosine to torch 0.9 < 0.97", 0.98, 0.9)
    failed.seconds = dict.fromkeys(BATCHES, 0.0001)
    trials = [_passed(BASELINE, 0.04, 0.2), failed, _passed(FALLBACK, 0.1, 0.5)]
    assert _routes(trials) == [(BASELINE, list(SHAPES))]
    assert pick([failed, Trial(BASELINE, "failed"), Trial(FALLBACK, "failed")])[0] == FALLBACK


def test_without_onnxruntime_int8_the_fastest_passing_engine_is_the_default() -> None:
    trials = [Trial(BASELINE, "failed", "int8: mean cosine to torch 0.95 < 0.99"), _passed("openvino-bf16", 0.04, 0.05)]
    trials.append(_passed(FALLBACK, 0.1, 0.5, 0.001, 0.003, 0.01))
    engine, reason = pick(trials)
    assert engine == "openvino-bf16" and "did not" in reason
    # The fp32 graph is twice as fast on the small batches: it takes them from that default.
    assert _routes(trials) == [(FALLBACK, ["1", "4", "16"]), ("openvino-bf16", ["short", "long"])]


def test_engines_that_kept_the_bars_but_lost_the_race_are_named_not_called_failed() -> None:
    """With onnxruntime int8 below the bars and the others out of the timing race, the one left is the fastest of
    several that kept the bars, not "the only candidate" that did."""
    trials = [Trial(BASELINE, "failed", "int8: min cosine to torch 0.96 < 0.97"), _passed("openvino-int8", 0.02, 0.1)]
    engine, reason = pick(trials, slower=[FALLBACK, "openvino-bf16"])
    assert engine == "openvino-int8" and "only candidate" not in reason
    assert reason == (
        f"the fastest that kept the parity bars on this CPU; {BASELINE} did not; "
        f"{FALLBACK}, openvino-bf16 kept them too, slower: out of the timing race"
    )
    assert pick(trials)[1] == "the only candidate that kept the parity bars on this CPU"


def test_ties_go_to_the_default_and_a_challenger_must_beat_it_by_the_margin() -> None:
    under = engine_choice.CHALLENGER_MARGIN * 0.97  # faster on both batches, but by less than the margin
    trials = [_passed(BASELINE, 0.040, 0.200), _passed("openvino-bf16", 0.040 / under, 0.200 / under)]
    assert _routes(trials) == [(BASELINE, list(SHAPES))]
    over = engine_choice.CHALLENGER_MARGIN * 1.03
    trials[1] = _passed("openvino-bf16", 0.040 / over, 0.200 / over)
    assert [e for e, _ in _routes(trials)] == [BASELINE, "openvino-bf16"]  # short and long; not the small ones
    # The small batches ask for the larger margin: 1.2x faster on one text is not enough, 1.35x is.
    trials[1] = _passed("openvino-bf16", 0.05, 0.3, 0.002 / 1.2, 0.006, 0.02)
    assert _routes(trials) == [(BASELINE, list(SHAPES))]
    trials[1] = _passed("openvino-bf16", 0.05, 0.3, 0.002 / 1.35, 0.006, 0.02)
    assert _routes(trials) == [("openvino-bf16", ["1"]), (BASELINE, ["4", "16", "short", "long"])]


def test_a_size_kept_under_the_margin_between_two_a_challenger_took_goes_to_it_where_no_slower() -> None:
    # OpenVINO int8 clearly faster on 16 texts and on long ones, 1.06x on 32 short texts between them (the machine's
    # noise under the 1.15x margin): one route from 16 texts up, not an island of the default in between.
    def trials(short_ratio: float) -> list[Trial]:
        return [
            _passed(BASELINE, 0.027, 0.076, 0.002, 0.006, 0.020),
            _passed("openvino-int8", 0.027 / short_ratio, 0.050, 0.003, 0.006, 0.015),
        ]

    routes = pick_routes(trials(1.06), BASELINE, SHAPES)
    assert [(r.engine, r.batches) for r in routes] == [
        (BASELINE, ["1", "4"]),
        ("openvino-int8", ["16", "short", "long"]),
    ]
    assert "under the margin but between two sizes it took" in routes[1].reason
    # slower there: the default keeps it, whatever its neighbours (one route per engine)
    assert [(r.engine, r.batches) for r in pick_routes(trials(0.97), BASELINE, SHAPES)] == [
        (BASELINE, ["1", "4", "short"]),
        ("openvino-int8", ["16", "long"]),
    ]
    # the largest and smallest sizes have one neighbour: never an island
    edge = [
        _passed(BASELINE, 0.027, 0.076, 0.002, 0.006, 0.020),
        _passed("openvino-int8", 0.020, 0.072, 0.003, 0.006, 0.015),
    ]
    assert [(r.engine, r.batches) for r in pick_routes(edge, BASELINE, SHAPES)] == [
        ("openvino-int8", ["16", "short"]),
        (BASELINE, ["1", "4", "long"]),
    ]


def test_among_challengers_within_the_tolerance_the_earlier_engine_wins() -> None:
    near = 1 + engine_choice.SPEED_TOLERANCE / 2
    trials = [
        _passed(BASELINE, 0.080, 0.400),
        _passed("openvino-f32", 0.040 / near, 0.200 / near),
        _passed("openvino-bf16", 0.040, 0.200),
    ]
    assert [e for e, _ in _routes(trials)][-1] == "openvino-bf16"  # first in ENGINES, within the tolerance
    far = 1 + engine_choice.SPEED_TOLERANCE * 2
    trials[1] = _passed("openvino-f32", 0.040 / far, 0.200 / far)
    assert [e for e, _ in _routes(trials)][-1] == "openvino-f32"


def test_an_avx2_only_cpu_routes_among_the_engines_it_has() -> None:
    # No bf16 units: OpenVINO bf16 is unavailable (never timed); OpenVINO f32 wins the long batch there.
    trials = [
        _passed(BASELINE, 0.040, 0.400),
        Trial("openvino-bf16", "unavailable", "this CPU has no bf16 units"),
        _passed("openvino-f32", 0.060, 0.300),
        _passed(FALLBACK, 0.080, 0.500),
    ]
    assert [e for e, _ in _routes(trials)] == [BASELINE, "openvino-f32"]
    assert all(r.engine != "openvino-bf16" for r in pick_routes(trials, BASELINE, SHAPES))


def test_on_any_timings_each_batch_runs_on_a_passing_engine_no_slower_than_the_default() -> None:
    rng = random.Random(0)
    for _ in range(500):
        trials = [
            Trial(e.name, rng.choice(["passed", "passed", "failed", "unavailable"]))
            for e in ENGINES
        ]  # fmt: skip
        for trial in trials:
            if trial.status == "passed":
                trial.seconds = {b: rng.uniform(0.5, 2.0) * SHAPES[b][0] * SHAPES[b][1] / 1e4 for b in BATCHES}
        shapes = {b: (rng.choice([1, 4, 32]), rng.choice([8, 20, 256])) for b in BATCHES}  # any order, ties included
        default, _ = pick(trials)
        routes = pick_routes(trials, default, shapes)
        status = {t.engine: t.status for t in trials}
        assert default == BASELINE if status[BASELINE] == "passed" else default != BASELINE
        timed = len(routes) > 1 or routes[0].batches
        assert sorted(b for r in routes for b in r.batches) == sorted(shapes if timed else [])
        assert len({r.engine for r in routes}) == len(routes)  # one route per engine
        if timed:  # routes ascending by their largest timing batch: the last route runs the largest
            largest = [max(shapes[b][0] * shapes[b][1] for b in r.batches) for r in routes]
            assert largest == sorted(largest)
        seconds = {t.engine: t.seconds for t in trials}
        for route in routes:
            assert status[route.engine] == "passed" or route.engine == FALLBACK == default
            assert route.shapes == [shapes[b] for b in route.batches]
            for batch in route.batches:  # no slower than the default on its timing batch ...
                assert seconds[route.engine][batch] <= seconds[default][batch]
                assert route_for(routes, *shapes[batch]).engine == route.engine  # ... and its shape runs there


def test_the_choice_reads_medians_so_one_disturbed_round_does_not_flip_it() -> None:
    # Five rounds; in one the machine stalled the baseline threefold. Its best is untouched either way, its mean is
    # not; the median keeps the steady figure, and the default keeps every batch.
    baseline = {"short": [0.040, 0.041, 0.120, 0.040, 0.042], "long": [0.20, 0.21, 0.60, 0.20, 0.20]}
    challenger = {"short": [0.038, 0.039, 0.039, 0.040, 0.038], "long": [0.19, 0.20, 0.19, 0.19, 0.20]}
    small = {size: [0.002] for size in ("1", "4", "16")}
    medians_of = engine_timing.medians_of
    medians = {e: medians_of(s | small) for e, s in ((BASELINE, baseline), ("openvino-bf16", challenger))}
    assert medians[BASELINE] == {"short": 0.041, "long": 0.20, "1": 0.002, "4": 0.002, "16": 0.002}
    trials = [Trial(e, "passed", seconds=s) for e, s in medians.items()]
    assert _routes(trials) == [(BASELINE, list(SHAPES))]


def test_only_engines_that_can_still_win_a_batch_are_timed_on() -> None:
    small = {"1": 0.002, "4": 0.006, "16": 0.02}
    seconds = {
        BASELINE: {"short": 0.04, "long": 0.2, **small},
        "openvino-bf16": {"short": 0.2, "long": 0.1, **small, "1": 0.008},  # within reach on long texts
        "openvino-f32": {"short": 0.2, "long": 0.8, **small, "1": 0.009, "4": 0.1, "16": 0.1},  # far behind
        FALLBACK: {"short": 0.13, "long": 0.9, **small, "1": 0.0021, "4": 0.1, "16": 0.1},  # close on one text
    }
    assert [e for e in seconds if engine_choice.can_win(e, seconds)] == [BASELINE, "openvino-bf16", FALLBACK]
    seconds[FALLBACK]["1"] = 0.002 * engine_choice.OUT_OF_RACE * 1.01  # out of reach on every batch
    assert not engine_choice.can_win(FALLBACK, seconds)
    assert engine_choice.can_win(BASELINE, {**seconds, BASELINE: {"short": 9.0, "long": 9.0, **small}})


def test_the_baseline_comes_first_and_the_reference_graph_last() -> None:
    assert [ENGINES[0].name, ENGINES[-1].name] == [BASELINE, FALLBACK]
    assert set(engine_choice.ENGINE_SETTINGS) == {"auto", *(e.name for e in ENGINES)}


def test_the_setting_lists_exactly_the_engines() -> None:
    import typing

    from service.settings import ServiceSettings

    allowed = typing.get_args(ServiceSettings.model_fields["engine"].annotation)
    assert allowed == engine_choice.ENGINE_SETTINGS


# --- load_engine on a real bundle --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """The tiny random BERT exported with an int8 graph and its probes (fp32 references)."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("engines-registry")
    return export_bundle(tiny_bert_path, root, "tiny", quantize="int8")


@pytest.fixture(autouse=True)
def first_loads() -> None:
    """Each test's loads time their candidates afresh: no timings kept from another test's bundle."""
    engine_timing.TIMED.clear()


@pytest.fixture()
def copy(int8_bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(int8_bundle, target)
    return target


def test_auto_serves_passing_engines_no_slower_than_onnxruntime_int8_on_their_batches(int8_bundle: Path) -> None:
    bundle, choice = load_engine(int8_bundle, intra_op_threads=1)
    trials = {t.engine: t for t in choice.trials}
    assert list(trials) == [e.name for e in ENGINES] and choice.setting == "auto"
    assert choice.engine == choice.routes[-1].engine
    assert (bundle.runtime, bundle.variant) == (engine_choice.BY_NAME[choice.engine].runtime, choice.graph)
    assert trials["openvino-f32"].status == "passed"  # every x86 CPU has OpenVINO's f32 kernels
    import openvino as ov

    bf16 = trials["openvino-bf16"]
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert bf16.status in ("passed", "failed") and bf16.mean_cosine is not None
    else:  # an AVX2-only CPU: skipped, and says why
        assert bf16.status == "unavailable" and "no bf16 units" in bf16.reason
    for trial in trials.values():  # timed exactly when it passed, on every batch
        assert set(trial.seconds) == (set(BATCHES) if trial.status == "passed" else set())
    assert set(choice.batch_shapes) == set(BATCHES)
    texts = [1, 4, 16, engine_timing.SHORT_BATCH, engine_timing.LONG_BATCH]
    assert [choice.batch_shapes[b][0] for b in BATCHES] == texts
    assert choice.batch_shapes["short"][1] < choice.batch_shapes["long"][1]
    baseline = trials[BASELINE]
    for route in choice.routes:
        served = trials[route.engine]
        assert served.status == "passed" and served.mean_cosine >= 0.99 and served.min_cosine >= 0.97
        for batch in route.batches:  # each timing batch runs on an engine no slower there than onnxruntime int8
            assert served.seconds[batch] <= baseline.seconds[batch]
            assert route_for(choice.routes, *choice.batch_shapes[batch]).engine == route.engine
    assert sorted(b for r in choice.routes for b in r.batches) == sorted(BATCHES) or len(choice.routes) == 1
    if {r.engine for r in choice.routes} != {BASELINE}:  # the reason says what runs where, a lone challenger too
        assert engine_choice.describe(choice.routes) in choice.reason
    assert choice.cpu == runtime.cpu_features() and choice.seconds > 0
    card = choice.as_dict()
    assert [(r["engine"], r["batches"], r["precision"]) for r in card["routes"]] == [
        (r.engine, r.batches, engine_choice.BY_NAME[r.engine].precision) for r in choice.routes
    ]
    texts, reference = runtime.read_probes(int8_bundle)
    for batch_size in (1, 4, 32):  # whichever engine each batch size runs on, the vectors keep the bars
        assert runtime.cosines(bundle.encode(texts, batch_size=batch_size), reference).min() >= 0.97


class _RecordedRuns:
    """A bundle that notes when each of its runs starts and ends, and how many texts it ran."""

    def __init__(self, bundle: runtime.OnnxBundle) -> None:
        self.bundle, self.max_seq_length = bundle, bundle.max_seq_length
        self.tokenize, self.pad = bundle.tokenize, bundle.pad
        self.runs: list[tuple[float, float, int]] = []

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        started = time.perf_counter()
        out = self.bundle.run(feeds)
        self.runs.append((started, time.perf_counter(), len(feeds["input_ids"])))
        return out


def test_one_text_is_timed_as_a_sporadic_client_sends_it(int8_bundle: Path) -> None:
    # A one-text batch is served when requests come now and then: timed on different texts of rising length, each
    # after the engine sat idle (OpenVINO ran one repeated text back to back faster than it served a stream of them).
    texts, _ = runtime.read_probes(int8_bundle)
    bundle = runtime.OnnxBundle(int8_bundle, variant="int8")
    ones = engine_timing.timing_batches(bundle, texts)["1"]
    assert len(ones) == 3 and all(len(batch) == 1 for batch in ones) and len({batch[0] for batch in ones}) == 3
    lengths = [len(bundle.tokenize(batch)[0].ids) for batch in ones]
    assert lengths == sorted(lengths)
    recorded = _RecordedRuns(bundle)
    seconds, shapes = engine_timing.time_engines({"a": recorded}, texts, still_in=lambda *_: True, rounds=1)  # type: ignore[dict-item]
    assert shapes["1"] == (1, lengths[1]) and set(seconds["a"]) == set(BATCHES)
    gaps = [(start - end, rows) for (_, end, _), (start, _, rows) in itertools.pairwise(recorded.runs)]
    idle = [gap for gap, rows in gaps if rows == 1]
    assert len(idle) == 2 * 3 - 1  # the warm-up round and one timed round, three texts each, less the very first run
    assert min(idle) >= engine_timing.IDLE_BEFORE_ONE
    # the other batches run back to back (a median: a stalled machine may leave one gap long)
    assert np.median([gap for gap, rows in gaps if rows > 1]) < engine_timing.IDLE_BEFORE_ONE / 4


def test_an_engine_whose_vectors_miss_the_bars_runs_no_batch(copy: Path) -> None:
    # An int8 graph that runs fast and loads fine but computes other vectors (weights scrambled): never served.
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(copy / "model.onnx"))
    rng = np.random.default_rng(0)
    for tensor in model.graph.initializer:
        weights = numpy_helper.to_array(tensor)
        if weights.dtype == np.float32 and weights.ndim == 2:
            scrambled = rng.permutation(weights.ravel()).reshape(weights.shape)
            tensor.CopyFrom(numpy_helper.from_array(scrambled, tensor.name))
    onnx.save(model, str(copy / "model_int8.onnx"))
    bundle, choice = load_engine(copy)
    int8 = choice.trial(BASELINE)
    assert int8.status == "failed" and "onnxruntime-int8: mean cosine to torch" in int8.reason and not int8.seconds
    assert BASELINE not in {r.engine for r in choice.routes} and bundle.variant == "fp32"
    assert {choice.trial(r.engine).status for r in choice.routes} == {"passed"}


def test_a_new_version_of_the_same_shapes_reuses_the_timings_and_checks_its_routes_engines(copy: Path) -> None:
    _, first = load_engine(copy)
    routed = {r.engine for r in first.routes} | {BASELINE}
    manifest = registry.read_manifest(copy)
    (copy / registry.MANIFEST).write_text(json.dumps(manifest | {"version": "2"}))  # same graphs, same shapes
    bundle, again = load_engine(copy)
    assert [(r.engine, r.shapes) for r in again.routes] == [(r.engine, r.shapes) for r in first.routes]
    assert "timed on tiny version 1, whose graphs have these shapes" in again.reason
    for trial in again.trials:  # the engines of the routes checked for parity again, the others not loaded
        if trial.engine in routed:
            assert trial.status == "passed" and trial.seconds == first.trial(trial.engine).seconds
        else:
            assert (trial.status, trial.reason) == ("not-tried", "ran no route when tiny version 1 was timed")
    texts, reference = runtime.read_probes(copy)
    assert runtime.cosines(bundle.encode(texts, batch_size=4), reference).min() >= 0.97
    _, other_session = load_engine(copy, intra_op_threads=1)  # other threads: other speeds, timed afresh
    assert "timed on" not in other_session.reason and other_session.trial("openvino-f32").status == "passed"


def test_int8_that_padding_moves_below_the_bars_is_not_served(copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The load check holds each probe at the worse of length-sorted and mixed-length batches, as the export does:
    a server's batch pads a short text to a long one's length, which moves dynamic int8's scales."""
    texts, reference = runtime.read_probes(copy)
    int8 = runtime.OnnxBundle(copy, variant="int8")
    assert engines.check_parity(int8, BASELINE, texts, reference, runtime.ParityBars()).status == "passed"
    padding_moves_int8(monkeypatch)
    trial = engines.check_parity(int8, BASELINE, texts, reference, runtime.ParityBars())
    assert trial.status == "failed" and "min cosine" in trial.reason
    _, choice = load_engine(copy, engine="onnxruntime-int8")
    assert choice.trial(BASELINE).status == "failed" and choice.graph == "fp32"


@pytest.mark.parametrize("when", ["probes", "timing"])
def test_an_engine_that_raises_is_a_trial_not_a_failed_load(
    copy: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """OpenVINO erring at inference — on the probes, or on a shape only the timing runs — leaves it out of the
    choice, with its error as the trial's reason; the model loads on the engines that work."""
    run = runtime.OnnxBundle.run

    def openvino_errs(self: runtime.OnnxBundle, feeds: dict[str, np.ndarray]) -> np.ndarray:
        only_timed = feeds["input_ids"].shape[0] == engine_timing.SHORT_BATCH  # the probes run in batches of 16
        if self.runtime == "openvino" and (when == "probes" or only_timed):
            raise RuntimeError("Exception from src/inference/src/cpp/infer_request.cpp: boom")
        return run(self, feeds)

    monkeypatch.setattr(runtime.OnnxBundle, "run", openvino_errs)
    bundle, choice = load_engine(copy, intra_op_threads=1)
    openvino = [t for t in choice.trials if t.engine.startswith("openvino") and t.status != "no-int8"]
    assert openvino and all(t.status == "unavailable" and "boom" in t.reason for t in openvino), openvino
    assert bundle.runtime == "onnxruntime" and not choice.engine.startswith("openvino")
    assert bundle.encode(["still served"]).shape[0] == 1


def test_a_new_version_whose_routes_miss_the_bars_is_checked_and_timed_in_full(copy: Path) -> None:
    load_engine(copy)
    texts, reference = runtime.read_probes(copy)
    runtime.write_probes(copy, texts, np.roll(reference, 1, axis=1))  # the same shapes, other vectors
    bundle, choice = load_engine(copy)
    assert "timed on" not in choice.reason and "not-tried" not in {t.status for t in choice.trials}
    assert (choice.engine, bundle.variant) == (FALLBACK, "fp32")


def test_timings_taken_without_the_baseline_are_not_reused_once_it_passes(copy: Path) -> None:
    strict = runtime.ParityBars(int8_mean_cosine=0.99999, int8_min_cosine=0.99999)  # int8 misses: timed without it
    _, first = load_engine(copy, bars=strict)
    assert first.trial(BASELINE).status == "failed" and BASELINE not in {r.engine for r in first.routes}
    _, again = load_engine(copy)  # the same shapes; int8 keeps the usual bars
    assert "timed on" not in again.reason and again.trial(BASELINE).status == "passed" and again.trial(BASELINE).seconds


def test_batches_run_on_the_engine_of_their_route(int8_bundle: Path, copy: Path) -> None:
    texts = runtime.read_probes(int8_bundle)[0]
    int8 = runtime.OnnxBundle(int8_bundle, variant="int8")
    fp32 = runtime.OnnxBundle(int8_bundle, variant="fp32")
    alone = {"int8": int8.encode(texts, batch_size=1), "fp32": fp32.encode(texts, batch_size=1)}
    assert not np.allclose(alone["int8"], alone["fp32"], atol=1e-6)  # the two engines are told apart
    # fp32 runs the batches nearest one 8-token text; int8 those nearest one 64-token text or 32 of 16 tokens
    routes = [("onnxruntime-fp32", [(1, 8)]), ("onnxruntime-int8", [(1, 64), (32, 16)])]
    routed = engines.open_routes(int8_bundle, routes)
    assert routed.variant == "int8"
    short = np.array([len(e.ids) <= 22 for e in routed.tokenize(texts)])  # nearer 8 than 64 tokens: below 8 * 64
    assert 0 < short.sum() < len(texts)
    expected = np.where(short[:, None], alone["fp32"], alone["int8"])
    assert np.allclose(routed.encode(texts, batch_size=1), expected, atol=1e-6)
    whole = int8.encode(texts, batch_size=len(texts))  # every text in one batch: nearest 32 texts, on int8
    assert np.allclose(routed.encode(texts, batch_size=len(texts)), whole, atol=1e-6)
    assert engines.open_routes(int8_bundle, [("onnxruntime-fp32", [])]).variant == "fp32"  # one route: every batch
    with pytest.raises(ValueError, match="must be distinct"):
        int8.route_batches([((4, 64), fp32), ((4, 64), int8)])
    with pytest.raises(ValueError, match="routes must run the same bundle"):
        int8.route_batches([((4, 64), runtime.OnnxBundle(copy, variant="fp32"))])


def test_a_pinned_engine_wins_and_others_are_not_tried(int8_bundle: Path) -> None:
    for pinned in ("openvino-f32", FALLBACK, BASELINE):
        _, choice = load_engine(int8_bundle, engine=pinned)
        assert (choice.engine, choice.setting) == (pinned, pinned)
        assert {t.engine: t.status for t in choice.trials if t.engine != pinned} == dict.fromkeys(
            [e.name for e in ENGINES if e.name != pinned], "not-tried"
        )
        assert choice.trial(pinned).seconds == {}  # a pinned engine is checked, never timed


def test_openvino_int8_runs_the_bundles_own_int8_graph_within_the_bars(int8_bundle: Path) -> None:
    """Pinned, OpenVINO's int8 engine opens the bundle's NNCF graph, not the fp32 one, at f32 for the rest; where
    its graph misses the bars on this CPU the fp32 reference graph serves instead."""
    assert engine_choice.BY_NAME["openvino-int8"].inference_precision == "f32"
    bundle, choice = load_engine(int8_bundle, engine="openvino-int8")
    trial = choice.trial("openvino-int8")
    assert trial.status in ("passed", "failed") and trial.mean_cosine is not None
    if trial.status == "passed":
        assert (bundle.runtime, bundle.variant, choice.precision) == ("openvino", "openvino-int8", "int8")
    else:
        assert choice.engine == FALLBACK and "openvino-int8 is pinned but did not pass" in choice.reason


def test_references_no_engine_matches_serve_the_fp32_graph_and_say_why(copy: Path) -> None:
    texts, reference = runtime.read_probes(copy)
    runtime.write_probes(copy, texts, np.roll(reference, 1, axis=1))
    bundle, choice = load_engine(copy)
    assert (choice.engine, bundle.runtime, bundle.variant) == (FALLBACK, "onnxruntime", "fp32")
    statuses = {t.engine: t.status for t in choice.trials}
    assert statuses[BASELINE] == statuses["openvino-f32"] == "failed"
    assert "onnxruntime-int8: mean cosine to torch" in choice.trial(BASELINE).reason
    assert "no candidate kept the parity bars" in choice.reason
    _, pinned = load_engine(copy, engine="openvino-f32")  # pinned, but below the bars: fp32, never worse vectors
    assert pinned.engine == FALLBACK and "openvino-f32 is pinned but did not pass" in pinned.reason


def test_a_candidate_that_fails_to_load_is_skipped_with_a_logged_reason(
    copy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (copy / "model_int8.onnx").write_bytes(b"not an onnx graph")
    with caplog.at_level(logging.INFO, logger="core.engines"):
        _, choice = load_engine(copy)
    trial = choice.trial(BASELINE)
    assert trial.status == "unavailable" and trial.reason
    assert choice.engine != BASELINE and choice.trial(choice.engine).status == "passed"
    assert any(f"engine {BASELINE} unavailable" in r.getMessage() for r in caplog.records)


def test_int8_off_and_bundles_without_int8_or_references(copy: Path, tiny_registry: Path) -> None:
    _, choice = load_engine(copy, serve_int8=False)
    assert choice.trial(BASELINE).status == "disabled" and choice.engine != BASELINE
    if "openvino-int8" in runtime.graph_files(registry.read_manifest(copy)):  # both int8 graphs are off
        assert choice.trial("openvino-int8").status == "disabled"
    _, choice = load_engine(tiny_registry / "tiny" / "current")  # exported without int8
    assert choice.trial(BASELINE).status == "no-int8" and choice.trial("openvino-f32").status == "passed"
    missing = choice.trial("openvino-int8")
    assert missing.status == "no-int8" and missing.reason == "the bundle has no openvino-int8 graph"
    (copy / runtime.PROBES_FILE).unlink()  # nothing to check other engines against: the reference graph only
    bundle, choice = load_engine(copy)
    assert choice.engine == FALLBACK and bundle.variant == "fp32"
    assert {t.status for t in choice.trials if t.engine != FALLBACK} == {"no-references"}
    with pytest.raises(ValueError, match="unknown engine 'tensorrt'; use one of auto, onnxruntime-int8"):
        load_engine(copy, engine="tensorrt")


def test_openvino_and_onnxruntime_agree_on_the_same_fp32_graph(int8_bundle: Path) -> None:
    texts = runtime.read_probes(int8_bundle)[0]
    ort = runtime.OnnxBundle(int8_bundle, variant="fp32").encode(texts)
    ov = runtime.OnnxBundle(int8_bundle, variant="fp32", runtime="openvino", precision="f32").encode(texts)
    assert runtime.cosines(ort, ov).min() >= 0.9999
