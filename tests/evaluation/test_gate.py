"""The rollout gate on constructed reports."""

from __future__ import annotations

import pytest

from evaluation.gate import adapt_gate, check, throughput_speedup


def _report(scores: dict[str, float], speed: dict[str, float] | None = None, skipped: dict[str, str] | None = None):
    report = {"scores": scores, "skipped": skipped or {}}
    if speed is not None:
        report["speed"] = {"settings": [{"setting": k, "texts_per_s": v} for k, v in speed.items()]}
    return report


BASE = _report({"A": 80.0, "B": 60.0}, speed={"short/b1": 100.0, "long/b32": 10.0})


def test_passes_when_no_task_drops_more_than_allowed() -> None:
    result = check(_report({"A": 79.0, "B": 65.0}), BASE, max_drop=1.0)
    assert result.passed and bool(result)
    assert result.failures == []
    assert [row["status"] for row in result.table] == ["ok", "ok"]
    assert result.table[0]["delta"] == pytest.approx(-1.0)


def test_fails_and_names_each_task_that_drops_too_far() -> None:
    result = check(_report({"A": 78.5, "B": 50.0}), BASE, max_drop=1.0)
    assert not result.passed
    assert len(result.failures) == 2
    assert result.failures[0].startswith("A: 78.50 vs 80.00 (-1.50 points")
    assert result.failures[1].startswith("B:")
    assert "FAILED" in result.format_table()


def test_a_task_the_candidate_did_not_run_fails() -> None:
    result = check(_report({"A": 80.0}, skipped={"B": "aclsum not installed"}), BASE)
    assert not result.passed
    assert "B: baseline scored 60.00 but the candidate has no score (aclsum not installed)" in result.failures


def test_new_tasks_do_not_fail() -> None:
    result = check(_report({"A": 80.0, "N": 10.0}), _report({"A": 80.0}))
    assert result.passed and result.unchecked == {}
    assert {row["task"]: row["status"] for row in result.table} == {"A": "ok", "N": "new"}


MISSING = "the package 'mimesis' is not installed; install it with `pip install mimesis==22.2.0`"


def test_a_task_neither_model_scored_fails_as_not_checked_and_is_listed_with_its_reason() -> None:
    result = check(_report({}, skipped={"Food": MISSING}), _report({}, skipped={"Food": MISSING}))
    assert not result.passed and result.could_not_check
    assert result.unchecked == {"Food": MISSING}
    assert result.failures == [f"Food: scored by neither model, so not compared ({MISSING})"]
    assert result.table == [
        {"task": "Food", "candidate": None, "baseline": None, "delta": None, "status": "skipped", "reason": MISSING}
    ]
    text = result.format_table()
    assert f"skipped: {MISSING}" in text and text.splitlines()[-1].startswith("FAILED: Food: scored by neither")
    # one side skipping a task the other never ran is not a comparison either
    assert not check(_report({"A": 80.0}, skipped={"C": "missing"}), _report({"A": 80.0})).passed
    assert not check(_report({"A": 80.0}), _report({"A": 80.0}, skipped={"C": "missing"})).passed


def test_a_drop_beside_an_unchecked_task_is_a_failure_not_only_a_gap() -> None:
    result = check(_report({"A": 70.0}, skipped={"C": "missing"}), _report({"A": 80.0}, skipped={"C": "missing"}))
    assert not result.passed and not result.could_not_check
    assert len(result.failures) == 2


def test_allow_skipped_passes_but_still_lists_the_tasks() -> None:
    base = _report({"A": 80.0}, skipped={"C": "missing"})
    result = check(_report({"A": 80.0}, skipped={"C": "missing"}), base, allow_skipped=True)
    assert result.passed and not result.could_not_check and result.failures == []
    assert result.unchecked == {"C": "missing"}
    assert {row["task"]: row["status"] for row in result.table} == {"A": "ok", "C": "skipped"}
    assert result.as_dict()["unchecked"] == {"C": "missing"}
    assert "leaving out 1 task(s) neither model scored" in result.format_table()
    nothing = check(_report({}, skipped={"C": "missing"}), _report({}, skipped={"C": "missing"}), allow_skipped=True)
    assert not nothing.passed and nothing.could_not_check  # never a pass on no comparison at all
    assert nothing.failures == ["no task was compared: every task was scored by neither model"]


def test_speed_floor() -> None:
    fast = _report({"A": 80.0, "B": 60.0}, speed={"short/b1": 400.0, "long/b32": 10.0})
    assert throughput_speedup(fast, BASE) == pytest.approx(2.0)  # sqrt(4 * 1)
    assert check(fast, BASE, min_speedup=1.5).passed
    slow = check(fast, BASE, min_speedup=2.5)
    assert not slow.passed
    assert slow.failures == ["speed: 2.00x the baseline's throughput, required 2.5x"]
    no_speed = check(_report({"A": 80.0, "B": 60.0}), BASE, min_speedup=1.0)
    assert not no_speed.passed and "no shared speed measurements" in no_speed.failures[0]


def test_must_improve() -> None:
    base = _report({"A": 80.0, "crop": 50.0})
    assert check(_report({"A": 79.5, "crop": 60.0}), base, must_improve=["crop"]).passed
    result = check(_report({"A": 80.0, "crop": 50.0}), base, must_improve=["crop"])
    assert result.failures == ["crop: must improve on the baseline (50.00 vs 50.00)"]


def test_plain_score_mappings_are_accepted() -> None:
    assert check({"A": 80.0}, {"A": 80.5}).passed
    assert not check({"A": 70.0}, {"A": 80.5}).passed


def test_bad_arguments_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="max_drop must be a finite number of points >= 0"):
        check(BASE, BASE, max_drop=-1)
    with pytest.raises(ValueError, match="min_speedup must be a finite positive ratio"):
        check(BASE, BASE, min_speedup=0)
    with pytest.raises(ValueError, match="scores must be numbers in points"):
        check({"scores": {"A": "high"}}, BASE)


@pytest.mark.parametrize("bound", [float("nan"), float("inf")])
def test_non_finite_bounds_are_refused(bound: float) -> None:
    dropped = _report({"A": 0.0, "B": 0.0})
    with pytest.raises(ValueError, match=f"max_drop must be a finite number of points >= 0, got {bound}"):
        check(dropped, BASE, max_drop=bound)
    with pytest.raises(ValueError, match=f"min_speedup must be a finite positive ratio such as 1.5, got {bound}"):
        check(BASE, BASE, min_speedup=bound)
    with pytest.raises(ValueError, match="max_drop must be a finite number"):
        adapt_gate({"base": 50.0, "adapted": 55.0}, None, None, margin=bound)


def test_adapt_gate_is_two_sided() -> None:
    general = {"base": {"LeeDocSTS": 60.0, "ACL": 40.0}, "adapted": {"LeeDocSTS": 58.5, "ACL": 41.0}}
    passed = adapt_gate({"base": 50.0, "adapted": 55.0}, general, {"base": 70.0, "adapted": 69.0}, margin=2)
    assert passed["passed"] and passed["reasons"] == [] and passed["margin"] == 2
    assert {row["task"]: row["delta"] for row in passed["table"]}["LeeDocSTS"] == -1.5
    no_gain = adapt_gate({"base": 50.0, "adapted": 50.0}, None, None, margin=2)
    assert not no_gain["passed"]
    assert no_gain["reasons"] == ["CropPairRetrieval-heldout: must improve on the baseline (50.00 vs 50.00)"]
    forgot = {"base": {"LeeDocSTS": 60.0}, "adapted": {"LeeDocSTS": 57.5}}
    result = adapt_gate({"base": 50.0, "adapted": 56.0}, forgot, None, margin=2)
    assert not result["passed"] and result["reasons"][0].startswith("LeeDocSTS: 57.50 vs 60.00 (-2.50 points")
    knn = adapt_gate({"base": 50.0, "adapted": 56.0}, None, {"base": 70.0, "adapted": 67.0}, margin=2)
    assert not knn["passed"] and knn["reasons"][0].startswith("kNN-accuracy-labels")
