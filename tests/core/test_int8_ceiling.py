"""bench_int8_ceiling counts a graph's multiply-adds, times int8 kernels that compute the right product, and reads
the peer's best arm from a bench_peers report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from tests.benchmark_scripts import load_script


def test_weight_macs_are_every_projection_once_per_token(tiny_registry: Path) -> None:
    script = load_script("bench_int8_ceiling")
    hidden, inner, layers = 32, 64, 4  # the tiny BERT of tests/conftest.py
    macs = script.weight_macs_per_token(tiny_registry / "tiny" / "1")
    assert macs == layers * (4 * hidden * hidden + 2 * hidden * inner)
    assert script.macs_per_text(macs, layers, hidden, width=10) == 10 * (macs + 2 * layers * 10 * hidden)


def test_int8_matmul_graph_computes_the_product() -> None:
    script = load_script("bench_int8_ceiling")
    session = ort.InferenceSession(script._int8_matmul(8, 5), providers=["CPUExecutionProvider"])
    a = np.random.default_rng(3).integers(0, 256, (4, 8), dtype=np.uint8)
    (y,) = session.run(None, {"A": a})
    b = np.random.default_rng(0).integers(-127, 128, (8, 5), dtype=np.int8)
    np.testing.assert_array_equal(y, a.astype(np.int32) @ b.astype(np.int32))
    assert script.gemm_rate(tokens=16, hidden=8, inner=12, threads=1) > 0


def test_peer_rates_take_the_faster_infinity_arm_per_round_then_the_median() -> None:
    script = load_script("bench_int8_ceiling")
    load = "32 short texts, 8 clients"

    def row(round_: int, arm: str, rate: float) -> dict:
        return {"round": round_, "load": load, "arm": arm, "texts_per_s": rate}

    rows = [row(1, "infinity, fp32", 300.0), row(1, "infinity, int8", 600.0), row(1, "ours", 900.0),
            row(2, "infinity, fp32", 700.0), row(2, "infinity, int8", 500.0),
            row(3, "infinity, fp32", 200.0), row(3, "infinity, int8", 650.0)]  # fmt: skip
    assert script.peer_rates({"rows": rows}) == {load: 650.0}


def test_openvino_profile_shares_the_run_between_operator_kinds(tiny_registry: Path) -> None:
    from core.runtime import OnnxBundle

    script = load_script("bench_int8_ceiling")
    bundle = tiny_registry / "tiny" / "1"
    reader = OnnxBundle(bundle, variant="fp32")
    feeds = [reader.pad(reader.tokenize(["a short text", "and a second, longer one of a few more words"]))]
    shares = script.openvino_profile(bundle, "openvino-f32", feeds, threads=1)
    assert abs(sum(shares.values()) - 1.0) < 1e-6
    assert any(kind.startswith(("FullyConnected", "MatMul")) for kind in shares)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
