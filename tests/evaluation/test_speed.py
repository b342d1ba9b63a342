"""`evaluation.speed.median_speed`: several runs of one model folded into one report."""

from __future__ import annotations

import pytest

from evaluation.speed import median_speed


def _run(texts_per_s: list[float], p50: list[float]) -> dict:
    settings = [
        {"setting": name, "batch_size": 1, "texts": name.split("/")[0], "calls": 3, "p50_ms": ms, "texts_per_s": tps}
        for name, tps, ms in zip(("short/b1", "long/b1"), texts_per_s, p50, strict=True)
    ]
    return {"settings": settings, "threads": 2}


def test_each_setting_is_the_median_of_the_runs() -> None:
    runs = [_run([100.0, 10.0], [5.0, 50.0]), _run([300.0, 12.0], [3.0, 40.0]), _run([200.0, 8.0], [4.0, 60.0])]
    merged = median_speed(runs)
    assert [row["texts_per_s"] for row in merged["settings"]] == [200.0, 10.0]
    assert [row["p50_ms"] for row in merged["settings"]] == [4.0, 50.0]
    assert [row["calls"] for row in merged["settings"]] == [9, 9] and merged["rounds"] == 3
    assert merged["threads"] == 2 and median_speed(runs[:1])["settings"][0]["texts_per_s"] == 100.0


def test_runs_of_different_settings_or_none_are_refused() -> None:
    other = _run([1.0, 1.0], [1.0, 1.0])
    other["settings"][1]["setting"] = "long/b32"
    with pytest.raises(ValueError, match="different settings"):
        median_speed([_run([1.0, 1.0], [1.0, 1.0]), other])
    with pytest.raises(ValueError, match="at least one"):
        median_speed([])
