"""What `benchmarks/ood_suite_check.py` computes from two models' scores: each set's % and how far its tasks let
that % move."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import load_script

check = load_script("ood_suite_check")


def test_one_ratio_on_every_task_has_no_error() -> None:
    baseline = {"a": 80.0, "b": 40.0, "c": 60.0}
    candidate = {t: 0.9 * v for t, v in baseline.items()}
    assert check.percent_error(baseline, candidate, ["a", "b", "c"]) == pytest.approx(0.0, abs=1e-9)
    assert check.percent_error(baseline, {"a": 10.0}, ["a"]) == pytest.approx(0.0, abs=1e-9)


def test_the_error_falls_as_tasks_of_the_same_spread_are_added() -> None:
    baseline = {f"t{i}": 50.0 for i in range(24)}
    candidate = {f"t{i}": (40.0, 45.0, 50.0)[i % 3] for i in range(24)}
    few = check.percent_error(baseline, candidate, ["t0", "t1", "t2"])
    many = check.percent_error(baseline, candidate, list(baseline))
    assert few == check.percent_error(baseline, candidate, ["t0", "t1", "t2"])  # seeded: the same every run
    assert 4.0 < few < 7.0  # the three ratios 80, 90, 100 %: sd 8.2 / √3 ≈ 4.7 (bootstrap: a little less)
    assert many == pytest.approx(few / 8**0.5, rel=0.2)  # eight times the tasks: √8 times finer


def test_set_means_carry_each_sets_error() -> None:
    tasks = [*check.SETS["ood-suite"], *check.SETS["independent"]]
    baseline = {t: 50.0 for t in tasks}
    candidate = {t: 45.0 if t in check.SETS["independent-v1"] else 50.0 for t in tasks}
    means = check.set_means(baseline, candidate)
    assert means["ood-suite"]["percent"] == pytest.approx(100.0) and means["ood-suite"]["percent_error"] == 0.0
    assert means["independent-v1"]["percent"] == pytest.approx(90.0)
    assert means["independent-v2"]["percent"] == pytest.approx(95.0)  # three of six tasks at 90 %
    assert means["independent"]["percent"] == pytest.approx(96.25) and means["independent"]["percent_error"] > 1.0
    assert len(means["independent-v2-only"]["tasks"]) == 3 and len(means["independent-v3-only"]["tasks"]) == 2
    assert len(means["independent"]["tasks"]) == 8


def test_a_rivals_lead_is_paired_over_the_same_tasks() -> None:
    tasks = [*check.SETS["ood-suite"], *check.SETS["independent"]]
    baseline = {t: 40.0 + i for i, t in enumerate(tasks)}
    rival = {t: 0.8 * v for t, v in baseline.items()}
    candidate = {t: rival[t] + 0.05 * baseline[t] for t in tasks}  # five points of the baseline's % ahead on each
    leads = check.set_leads(baseline, candidate, rival)
    assert leads["ood-suite"]["points"] == pytest.approx(5.0) and leads["ood-suite"]["error"] == pytest.approx(0.0)
    assert leads["independent"]["ahead"] == len(check.SETS["independent"])
    behind = {t: rival[t] - (0.1 * baseline[t] if t in check.SETS["independent-v1"] else 0.0) for t in tasks}
    split = check.set_leads(baseline, behind, rival)["independent"]
    assert split["points"] < 0 < split["error"] and split["ahead"] == 0
