"""In-domain vs out-of-domain: the corpus → domain mapping, the suite's split and averages, the gate's headline and
the report's table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core import corpora
from evaluation import data
from evaluation.gate import check
from evaluation.report import write_report
from evaluation.suite import domain_split, run_suite
from evaluation.tasks import TASKS, CropPairRetrieval

SOURCES = {name: cls.source_corpus for name, cls in TASKS.items()}


def _in_domain(trained_on: list[str]) -> set[str]:
    return {name for name, source in SOURCES.items() if data.is_in_domain(source, trained_on)}


def test_every_task_draws_from_a_corpus_with_a_domain() -> None:
    unmapped = {name: source for name, source in SOURCES.items() if source not in corpora.CORPUS_DOMAINS}
    assert not unmapped, f"add these corpora to evaluation.corpora.CORPUS_DOMAINS: {unmapped}"


def test_domains_are_judged_by_the_collection_not_the_file() -> None:
    # lee_background.cor holds other documents than the scored lee.cor, but the same collection: in-domain;
    # BBC News is another news collection: out-of-domain (the project's reading)
    assert _in_domain(["lee_background"]) == {"LeeDocSTS", "CropPairRetrieval-LeeBackground"}
    assert _in_domain(["bbc"]) == {"BBCNewsClustering", "BBCNewsClassification", "BBCNewsKNN"}
    # ACLSum's body paragraphs (trained on) and its abstracts and summaries (scored) are the same papers
    assert _in_domain(["aclsum"]) == {"ACLSumRetrieval"}
    assert _in_domain(["enwiki"]) == set()


@pytest.mark.parametrize("trained_on", [[], [corpora.CUSTOM_CORPUS], ["adapt:support-tickets"]])
def test_unknown_or_customer_corpora_leave_every_task_out_of_domain(trained_on: list[str]) -> None:
    assert _in_domain(trained_on) == set()


def test_a_crop_task_built_from_a_corpus_is_a_domain_of_its_own() -> None:
    task = CropPairRetrieval.from_corpus(["One. Two. Three. Four."] * 3, name="adapt:tickets")
    assert data.is_in_domain(task.source_corpus, ["adapt:tickets"])
    assert not data.is_in_domain(task.source_corpus, ["aclsum", "lee_background"])


def test_domain_split_averages_each_part() -> None:
    sources = {"A": "aclsum", "L": "lee", "P": corpora.CORPUS_PYDOC}
    split = domain_split(["aclsum"], sources, {"A": 90.0, "L": 40.0, "P": 60.0})
    assert split["declared"] and split["trained_on"] == ["aclsum"]
    assert split["in_domain"] == {"tasks": ["A"], "average": 90.0}
    assert split["out_of_domain"] == {"tasks": ["L", "P"], "average": 50.0}
    unknown = domain_split([], sources, {"A": 90.0, "L": 40.0, "P": 60.0})
    assert not unknown["declared"] and unknown["in_domain"] == {"tasks": [], "average": None}
    assert unknown["out_of_domain"]["average"] == pytest.approx(190 / 3, abs=1e-4)


class _Trained:
    """Mixin giving a fake model declared training corpora."""

    def __init__(self, *args: Any, trained_on: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trained_on = trained_on

    @property
    def trained_on(self) -> tuple[str, ...]:
        return self._trained_on


def _fake(fake_model_factory: Any, name: str, trained_on: tuple[str, ...]) -> Any:
    cls = type("TrainedFake", (_Trained, fake_model_factory), {})
    return cls(name, lambda t: [len(t) % 7 + 1.0, len(t) % 3 + 1.0, 1.0], 3, trained_on=trained_on)


def test_run_suite_marks_each_task_and_averages_the_parts(fake_model_factory: Any) -> None:
    model = _fake(fake_model_factory, "news-trained", ("lee_background",))
    report = run_suite(model, ["LeeDocSTS", "PyDocModuleClustering"], fast=True, progress=False)
    assert report["model"]["trained_on"] == ["lee_background"]
    assert report["tasks"]["LeeDocSTS"]["in_domain"] and report["tasks"]["LeeDocSTS"]["source_corpus"] == "lee"
    assert not report["tasks"]["PyDocModuleClustering"]["in_domain"]
    domains = report["domains"]
    assert domains["in_domain"] == {"tasks": ["LeeDocSTS"], "average": pytest.approx(report["scores"]["LeeDocSTS"])}
    assert domains["out_of_domain"]["tasks"] == ["PyDocModuleClustering"]


def _suite_report(scores: dict[str, float], trained_on: list[str]) -> dict[str, Any]:
    sources = {"ACLSumRetrieval": "aclsum", "LeeDocSTS": "lee", "PyDocSummaryRetrieval": corpora.CORPUS_PYDOC}
    return {"scores": scores, "skipped": {}, "domains": domain_split(trained_on, sources, scores)}


def test_gate_headline_is_the_candidates_out_of_domain_average() -> None:
    candidate = _suite_report({"ACLSumRetrieval": 90.0, "LeeDocSTS": 50.0, "PyDocSummaryRetrieval": 70.0}, ["aclsum"])
    baseline = _suite_report({"ACLSumRetrieval": 60.0, "LeeDocSTS": 51.0, "PyDocSummaryRetrieval": 69.5}, [])
    result = check(candidate, baseline, max_drop=1.0)
    # ACLSumRetrieval is in-domain for the candidate: its +30 stays out of the headline
    assert result.headline == {
        "tasks": ["LeeDocSTS", "PyDocSummaryRetrieval"],
        "candidate": 60.0,
        "baseline": 60.25,
        "delta": -0.25,
    }
    assert result.table[0]["task"] == "out-of-domain average (2 tasks)" and result.table[0]["status"] == "headline"
    assert result.passed and "out-of-domain average" in result.format_table()
    # the per-task drop check still covers every task, in-domain ones too
    worse = _suite_report({"ACLSumRetrieval": 50.0, "LeeDocSTS": 51.0, "PyDocSummaryRetrieval": 70.0}, ["aclsum"])
    failed = check(worse, baseline, max_drop=1.0)
    assert not failed.passed and failed.failures[0].startswith("ACLSumRetrieval:")


def test_plain_score_mappings_have_no_headline() -> None:
    assert check({"A": 1.0}, {"A": 1.0}).headline is None


def test_report_shows_both_averages_and_says_when_nothing_is_declared(tmp_path: Path) -> None:
    def model(name: str, trained_on: list[str], scores: dict[str, float]) -> dict[str, Any]:
        info = {"name": name, "kind": "fake", "hash": "0" * 64, "dim": 3, "max_seq_length": 8, "num_layers": None}
        tasks = {t: {"score": s, "main_metric": "m"} for t, s in scores.items()}
        return {**_suite_report(scores, trained_on), "model": info | {"trained_on": trained_on}, "tasks": tasks}

    candidate = model("tuned", ["aclsum"], {"ACLSumRetrieval": 90.0, "LeeDocSTS": 50.0, "PyDocSummaryRetrieval": 70.0})
    baseline = model("pretrained", [], {"ACLSumRetrieval": 60.0, "LeeDocSTS": 51.0, "PyDocSummaryRetrieval": 69.5})
    gate = check(candidate, baseline)
    report = {
        "created_at": "now", "command": "test", "fast": True, "max_drop": 1.0, "min_speedup": None,
        "candidate": candidate, "baseline": baseline, "gate": gate.as_dict(),
    }  # fmt: skip
    written = write_report(report, tmp_path)
    markdown = written["report.md"].read_text()
    assert "headline, the out-of-domain average over the candidate's 2 out-of-domain tasks: **60.00** vs 60.25" in (
        markdown
    )
    assert "| candidate `tuned` | aclsum | 60.00 | LeeDocSTS, PyDocSummaryRetrieval | 90.00 | ACLSumRetrieval |" in (
        markdown
    )
    assert "| baseline `pretrained` | none declared (training data unknown" in markdown
    saved = json.loads(written["report.json"].read_text())
    assert saved["candidate"]["domains"]["out_of_domain"]["average"] == 60.0
    assert saved["gate"]["headline"]["delta"] == -0.25
