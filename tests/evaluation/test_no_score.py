"""A task whose main metric comes out NaN has no score: a collapsed model (every text the same embedding) makes an
STS correlation undefined, and NaN compares false with every bound, so it used to pass the gate."""

from __future__ import annotations

import json
import math
from pathlib import Path

from evaluation.gate import adapt_gate, check
from evaluation.suite import run_suite
from evaluation.validate import validate


def test_a_nan_score_never_passes_the_gate() -> None:
    result = check({"scores": {"LeeDocSTS": math.nan, "B": 60.0}}, {"scores": {"LeeDocSTS": 75.0, "B": 60.0}})
    assert not result.passed and not result.could_not_check
    row = next(r for r in result.table if r["task"] == "LeeDocSTS")
    assert row["status"] == "FAIL" and row["candidate"] is None and "not a number" in row["reason"]
    # plain mappings too (the /adapt gate's)
    assert not check({"A": math.inf}, {"A": 50.0}).passed
    assert not adapt_gate({"base": 40.0, "adapted": 45.0}, {"base": {"A": 50.0}, "adapted": {"A": math.nan}}, None,
                          margin=1.0)["passed"]  # fmt: skip


def test_a_task_only_the_candidate_could_not_score_fails() -> None:
    candidate = {"scores": {"A": 80.0}, "failed": {"New": "cosine_spearman is NaN"}}
    result = check(candidate, {"scores": {"A": 80.0}})
    assert not result.passed and not result.could_not_check and result.unchecked == {}
    assert any(f.startswith("New: the candidate has no score (cosine_spearman is NaN") for f in result.failures)
    # the baseline's: like a task the baseline skipped, not the candidate's fault
    result = check({"scores": {"A": 80.0, "New": 50.0}}, {"scores": {"A": 80.0}, "failed": {"New": "NaN"}})
    assert result.passed and {r["task"]: r["status"] for r in result.table}["New"] == "skipped"


def test_a_collapsed_model_has_no_sts_score(fake_model_factory) -> None:
    collapsed = fake_model_factory("collapsed", lambda text: [1.0, 2.0, 3.0], dim=3)
    report = run_suite(collapsed, ["LeeDocSTS"], fast=True, progress=False)
    assert report["scores"] == {} and "LeeDocSTS" not in report["tasks"]
    assert "cosine_spearman" in report["failed"]["LeeDocSTS"]


def test_validate_of_a_collapsed_model_fails_and_writes_strict_json(fake_model_factory, tmp_path: Path) -> None:
    collapsed = fake_model_factory("collapsed", lambda text: [1.0, 2.0, 3.0], dim=3)
    sound = fake_model_factory("sound", lambda text: [len(text), text.count("e") + 1.0, text.count("a") + 1.0], dim=3)
    report, gate, written = validate(collapsed, sound, tasks=["LeeDocSTS"], fast=True, layer_tasks=(), speed=False,
                                     diagnostics=False, out_dir=tmp_path, progress=False)  # fmt: skip
    assert gate is not None and not gate.passed
    text = written["report.json"].read_text()
    json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(f"not JSON: {name}")))
    assert "LeeDocSTS" in report["candidate"]["failed"]
    assert "no score" in written["report.md"].read_text()
