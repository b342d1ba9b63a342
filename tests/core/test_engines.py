"""The engine choice: `pick` on made-up trials (the rules, whatever this CPU is), and `load_engine` on a real
small bundle (parity checks against its probes, pinning, fallbacks, a candidate that cannot load)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from core import engines, runtime
from core.engines import BASELINE, ENGINES, FALLBACK, Trial, load_engine, pick


def _passed(engine: str, short: float, long: float, *small: float) -> Trial:
    seconds = {"short": short, "long": long} | dict(zip(("1", "4", "16"), small or (0.002, 0.006, 0.02), strict=True))
    return Trial(engine, "passed", mean_cosine=0.995, min_cosine=0.98, seconds=seconds)


TOKENS = {"1": 20, "4": 80, "16": 320, "short": 640, "long": 2048}


# --- pick: the rules ---------------------------------------------------------------------------------------------


def test_the_fastest_passing_engine_is_served() -> None:
    trials = [_passed(BASELINE, 0.040, 0.200), _passed("openvino-bf16", 0.030, 0.100), _passed(FALLBACK, 0.1, 0.5)]
    assert pick(trials)[0] == "openvino-bf16"


def test_an_engine_below_the_parity_bars_is_never_served_however_fast() -> None:
    failed = Trial("openvino-bf16", "failed", "openvino-bf16: min cosine to torch 0.9 < 0.97", 0.98, 0.9)
    failed.seconds = {"short": 0.001, "long": 0.001}
    assert pick([_passed(BASELINE, 0.04, 0.2), failed, _passed(FALLBACK, 0.1, 0.5)])[0] == BASELINE
    assert pick([failed, Trial(BASELINE, "failed"), Trial(FALLBACK, "failed")])[0] == FALLBACK


def test_an_engine_slower_than_onnxruntime_int8_on_either_batch_is_never_served() -> None:
    # Faster overall (geometric mean), but slower than the baseline on short texts: not served.
    trials = [_passed(BASELINE, 0.040, 0.200), _passed("openvino-bf16", 0.045, 0.050)]
    assert pick(trials)[0] == BASELINE
    # Without a passing baseline, the fastest passing engine is served.
    trials[0] = Trial(BASELINE, "failed", "int8: mean cosine to torch 0.95 < 0.99")
    assert pick([*trials, _passed(FALLBACK, 0.1, 0.5)])[0] == "openvino-bf16"


def test_ties_go_to_the_default_and_a_challenger_must_beat_it_by_the_margin_on_each_batch() -> None:
    under = engines.CHALLENGER_MARGIN * 0.97  # faster on both batches, but by less than the margin
    trials = [_passed(BASELINE, 0.040, 0.200), _passed("openvino-bf16", 0.040 / under, 0.200 / under)]
    engine, reason = pick(trials)
    assert engine == BASELINE and "openvino-bf16" in reason and "beat the default" in reason
    over = engines.CHALLENGER_MARGIN * 1.03
    trials[1] = _passed("openvino-bf16", 0.040 / over, 0.200 / over)
    engine, reason = pick(trials)
    assert engine == "openvino-bf16" and "openvino-bf16" in reason and BASELINE in reason
    # A large lead on one batch does not buy a loss on the other: never slower than the default on either ...
    trials[1] = _passed("openvino-bf16", 0.0401, 0.020)
    assert pick(trials)[0] == BASELINE
    # ... nor a tie: twice as fast on long texts, within the margin on short ones, and the default stays.
    trials[1] = _passed("openvino-bf16", 0.040 / under, 0.100)
    assert pick(trials)[0] == BASELINE


def test_among_challengers_within_the_tolerance_the_earlier_engine_wins() -> None:
    near = 1 + engines.SPEED_TOLERANCE / 2
    trials = [
        _passed(BASELINE, 0.080, 0.400),
        _passed("openvino-f32", 0.040 / near, 0.200 / near),
        _passed("openvino-bf16", 0.040, 0.200),
    ]
    assert pick(trials)[0] == "openvino-bf16"  # comes first in ENGINES, within the tolerance of the fastest
    far = 1 + engines.SPEED_TOLERANCE * 2
    trials[1] = _passed("openvino-f32", 0.040 / far, 0.200 / far)
    assert pick(trials)[0] == "openvino-f32"


def test_the_choice_reads_medians_so_one_disturbed_round_does_not_flip_it() -> None:
    # Five rounds; in one the machine stalled the baseline threefold. Its best is untouched either way, its mean is
    # not; the median keeps the steady figure, and the default keeps its place.
    baseline = {"short": [0.040, 0.041, 0.120, 0.040, 0.042], "long": [0.20, 0.21, 0.60, 0.20, 0.20]}
    challenger = {"short": [0.038, 0.039, 0.039, 0.040, 0.038], "long": [0.19, 0.20, 0.19, 0.19, 0.20]}
    small = {size: [0.002] for size in ("1", "4", "16")}
    medians = {e: engines.medians_of(s | small) for e, s in ((BASELINE, baseline), ("openvino-bf16", challenger))}
    assert medians[BASELINE] == {"short": 0.041, "long": 0.20, "1": 0.002, "4": 0.002, "16": 0.002}
    trials = [Trial(e, "passed", seconds=s) for e, s in medians.items()]
    assert pick(trials)[0] == BASELINE
    assert engines.pick_small(trials, BASELINE, TOKENS) == (None, 0)


def test_only_engines_that_can_still_win_are_timed_on() -> None:
    small = {"1": 0.002, "4": 0.006, "16": 0.02}
    seconds = {
        BASELINE: {"short": 0.04, "long": 0.2, **small},
        "openvino-bf16": {"short": 0.05, "long": 0.1, **small, "1": 0.008},  # within reach on short texts
        "openvino-f32": {"short": 0.2, "long": 0.8, **small, "1": 0.009},  # far behind everywhere
        FALLBACK: {"short": 0.13, "long": 0.9, **small, "1": 0.0021},  # behind, but close on one text
    }
    assert [e for e in seconds if engines.can_win(e, seconds)] == [BASELINE, "openvino-bf16", FALLBACK]
    seconds["openvino-bf16"]["short"] = 0.04 * engines.OUT_OF_RACE * 1.01  # out of reach on one deciding batch
    assert not engines.can_win("openvino-bf16", seconds)
    assert engines.can_win(BASELINE, {**seconds, BASELINE: {"short": 9.0, "long": 9.0, **small}})


def test_a_second_engine_runs_small_batches_only_when_clearly_faster_there() -> None:
    # The default serves; OpenVINO is a little faster on one text: one engine for everything.
    trials = [
        _passed(BASELINE, 0.04, 0.2, 0.002, 0.006, 0.02),
        _passed("openvino-bf16", 0.05, 0.3, 0.0019, 0.006, 0.02),
    ]
    assert engines.pick_small(trials, BASELINE, TOKENS) == (None, 0)
    # Clearly faster on one text (and four), clearly slower on sixteen: those two sizes move to it.
    trials[1] = _passed("openvino-bf16", 0.05, 0.3, 0.001, 0.004, 0.03)
    assert engines.pick_small(trials, BASELINE, TOKENS) == ("openvino-bf16", TOKENS["4"])


def test_the_baseline_comes_first_and_the_reference_graph_last() -> None:
    assert [ENGINES[0].name, ENGINES[-1].name] == [BASELINE, FALLBACK]
    assert set(engines.ENGINE_SETTINGS) == {"auto", *(e.name for e in ENGINES)}


def test_the_setting_lists_exactly_the_engines() -> None:
    import typing

    from service.settings import ServiceSettings

    allowed = typing.get_args(ServiceSettings.model_fields["engine"].annotation)
    assert allowed == engines.ENGINE_SETTINGS


# --- load_engine on a real bundle --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def int8_bundle(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """The tiny random BERT exported with an int8 graph and its probes (fp32 references)."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("engines-registry")
    return export_bundle(tiny_bert_path, root, "tiny", quantize="int8")


@pytest.fixture()
def copy(int8_bundle: Path, tmp_path: Path) -> Path:
    target = tmp_path / "bundle"
    shutil.copytree(int8_bundle, target)
    return target


def test_auto_serves_a_passing_engine_no_slower_than_onnxruntime_int8(int8_bundle: Path) -> None:
    bundle, choice = load_engine(int8_bundle, intra_op_threads=1)
    trials = {t.engine: t for t in choice.trials}
    assert list(trials) == [e.name for e in ENGINES] and choice.setting == "auto"
    served = trials[choice.engine]
    assert served.status == "passed" and served.mean_cosine >= 0.99 and served.min_cosine >= 0.97
    assert (bundle.runtime, bundle.variant) == (engines.BY_NAME[choice.engine].runtime, choice.graph)
    assert trials["openvino-f32"].status == "passed"  # every x86 CPU has OpenVINO's f32 kernels
    import openvino as ov

    bf16 = trials["openvino-bf16"]
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert bf16.status in ("passed", "failed") and bf16.mean_cosine is not None
    else:  # an AVX2-only CPU: skipped, and says why
        assert bf16.status == "unavailable" and "no bf16 units" in bf16.reason
    baseline = trials[BASELINE]
    if baseline.status == "passed":
        assert all(served.seconds[k] <= baseline.seconds[k] for k in engines.BATCH_SHAPES)
    for trial in trials.values():  # timed exactly when it passed, on every batch
        assert set(trial.seconds) == ({"short", "long", "1", "4", "16"} if trial.status == "passed" else set())
    if choice.small_batch_engine is not None:
        small = trials[choice.small_batch_engine]
        assert small.status == "passed" and small.seconds["1"] < served.seconds["1"]
        assert choice.small_batch_tokens > 0 and bundle.run(bundle.pad(bundle.tokenize(["a text"]))).shape[0] == 1
    assert choice.cpu == runtime.cpu_features() and choice.seconds > 0
    texts, reference = runtime.read_probes(int8_bundle)
    assert runtime.cosines(bundle.encode(texts), reference).min() >= 0.97


def test_a_pinned_engine_wins_and_others_are_not_tried(int8_bundle: Path) -> None:
    for pinned in ("openvino-f32", FALLBACK, BASELINE):
        _, choice = load_engine(int8_bundle, engine=pinned)
        assert (choice.engine, choice.setting) == (pinned, pinned)
        assert {t.engine: t.status for t in choice.trials if t.engine != pinned} == dict.fromkeys(
            [e.name for e in ENGINES if e.name != pinned], "not-tried"
        )
        assert choice.trial(pinned).seconds == {}  # a pinned engine is checked, never timed


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
    _, choice = load_engine(tiny_registry / "tiny" / "current")  # exported without int8
    assert choice.trial(BASELINE).status == "no-int8" and choice.trial("openvino-f32").status == "passed"
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
