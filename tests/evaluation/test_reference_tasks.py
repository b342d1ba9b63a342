"""The widened out-of-domain suite's new tasks and the independent set: shapes, fast mode, frozen inputs, registration,
and scores that tell a model that reads the text from noise."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from core import corpora
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import score_task
from evaluation.tasks import (
    INDEPENDENT_TASKS,
    INDEPENDENT_TASKS_V1,
    INDEPENDENT_TASKS_V2,
    OOD_SUITE,
    OOD_SUITE_V1,
    OOD_SUITE_V2,
    OOD_SUITE_V3,
    OOD_SUITE_V4,
    OOD_SUITE_V5,
    TASKS,
    AnsibleModuleRetrieval,
    AWSOperationClustering,
    AWSServiceRetrieval,
    BioregistryResourceRetrieval,
    ElementDescriptionRetrieval,
    FoodKindClustering,
    FortuneSubjectClustering,
    HPODefinitionRetrieval,
    ICD10ChapterClustering,
    NAICSSectorClustering,
    OccupationDescriptionRetrieval,
    OfflineTask,
    PatentSectionClustering,
    PylintMessageRetrieval,
    RDatasetsTitleRetrieval,
    SchemaOrgTypeRetrieval,
    SimLex999STS,
    SpellSchoolClustering,
    StdnumFormatRetrieval,
    WordNetDefinitionRetrieval,
    resolve_task,
)
from evaluation.tasks.titled import per_label_subset, seeded_subset

NEW_SUITE = [SimLex999STS, RDatasetsTitleRetrieval, AWSServiceRetrieval, AWSOperationClustering,
             ElementDescriptionRetrieval, WordNetDefinitionRetrieval, OccupationDescriptionRetrieval,
             FortuneSubjectClustering, PatentSectionClustering, FoodKindClustering, PylintMessageRetrieval]  # fmt: skip
INDEPENDENT = [ICD10ChapterClustering, StdnumFormatRetrieval, HPODefinitionRetrieval, AnsibleModuleRetrieval,
               BioregistryResourceRetrieval, SpellSchoolClustering, SchemaOrgTypeRetrieval,
               NAICSSectorClustering]  # fmt: skip
# (task, full size, fast size, labels in the full task or None)
SHAPES = [
    (SimLex999STS, 999, 100, None),
    (RDatasetsTitleRetrieval, 1000, 40, None),
    (AWSServiceRetrieval, 390, 40, None),
    (AWSOperationClustering, 800, 200, 20),
    (ElementDescriptionRetrieval, 109, 40, None),
    (WordNetDefinitionRetrieval, 1500, 40, None),
    (OccupationDescriptionRetrieval, 940, 40, None),
    (FortuneSubjectClustering, 864, 220, 22),
    (PatentSectionClustering, 800, 80, 8),
    (FoodKindClustering, 556, 200, 5),
    (PylintMessageRetrieval, 415, 40, None),
    (ICD10ChapterClustering, 1192, 218, 22),
    (StdnumFormatRetrieval, 236, 40, None),
    (HPODefinitionRetrieval, 1500, 40, None),
    (AnsibleModuleRetrieval, 960, 40, None),
    (BioregistryResourceRetrieval, 1065, 40, None),
    (SpellSchoolClustering, 319, 80, 8),
    (SchemaOrgTypeRetrieval, 569, 40, None),
    (NAICSSectorClustering, 713, 193, 20),
]


def loaded(task: OfflineTask) -> OfflineTask:
    reason = task.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    task.load_data()
    return task


def size(task: OfflineTask) -> int:
    data = task.dataset
    if "default" in data:  # retrieval
        split = data["default"]["test"]
        assert len(split["queries"]) == len(split["corpus"]) == len(split["relevant_docs"])
        return len(split["queries"])
    return len(data["test"])


@pytest.mark.parametrize(("task_class", "full", "fast", "labels"), SHAPES)
def test_shapes_and_fast_mode(task_class: type[OfflineTask], full: int, fast: int, labels: int | None) -> None:
    task = loaded(task_class())
    assert size(task) == full
    quick = loaded(task_class(fast=True))
    assert size(quick) == fast
    if labels is not None:
        assert len({row[0] for row in task.dataset["test"]["labels"]}) == labels
        assert len({row[0] for row in quick.dataset["test"]["labels"]}) == labels
        assert set(quick.dataset["test"]["sentences"]) <= set(task.dataset["test"]["sentences"])
    elif "default" in task.dataset:
        split = task.dataset["default"]["test"]
        assert all(len(rel) == 1 for rel in split["relevant_docs"].values())
        assert set(quick.dataset["default"]["test"]["queries"]["text"]) <= set(split["queries"]["text"])


@pytest.mark.parametrize(
    "task_class",
    [RDatasetsTitleRetrieval, AWSOperationClustering, HPODefinitionRetrieval, FortuneSubjectClustering,
     AnsibleModuleRetrieval],
)  # fmt: skip
def test_selection_is_deterministic(task_class: type[Any]) -> None:
    first = loaded(task_class()).full_selection()
    assert task_class().full_selection() == first


@pytest.mark.parametrize("task_class", [c for c in NEW_SUITE + INDEPENDENT if c is not SimLex999STS])
def test_changed_inputs_refuse_to_run(monkeypatch: pytest.MonkeyPatch, task_class: type[Any]) -> None:
    loaded(task_class(fast=True))
    monkeypatch.setattr(task_class, "frozen_sha256", "0" * 64)
    with pytest.raises(corpora.DataUnavailableError, match="the selected inputs changed"):
        task_class(fast=True).load_data()
    assert "reinstall the pinned build" in (task_class().unavailable_reason() or "")  # the suite skips it, with why


def test_changed_simlex_refuses_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from evaluation.tasks import reference

    loaded(SimLex999STS(fast=True))
    monkeypatch.setattr(reference, "SIMLEX_SHA256", "0" * 64)
    assert "selected inputs changed" in (SimLex999STS().unavailable_reason() or "")


def test_subsets() -> None:
    assert seeded_subset(5, None) == seeded_subset(5, 9) == [0, 1, 2, 3, 4]
    drawn = seeded_subset(100, 10)
    assert drawn == sorted(drawn) == seeded_subset(100, 10) and len(set(drawn)) == 10
    labels = ["a"] * 10 + ["b"] * 3
    chosen = per_label_subset(labels, 4)
    assert chosen == sorted(chosen) and [labels[i] for i in chosen].count("a") == 4
    assert [labels[i] for i in chosen].count("b") == 3


def test_registration_and_independence() -> None:
    assert all(name in TASKS for name in OOD_SUITE)
    assert set(OOD_SUITE_V1) < set(OOD_SUITE_V2) < set(OOD_SUITE_V3) < set(OOD_SUITE_V4) < set(OOD_SUITE_V5)
    assert set(OOD_SUITE_V5) < set(OOD_SUITE)
    assert not set(INDEPENDENT_TASKS) & set(TASKS)  # not in the default suite
    assert {type(resolve_task(name)) for name in INDEPENDENT_TASKS} == set(INDEPENDENT)
    assert type(resolve_task("simlex999sts", fast=True)) is SimLex999STS
    suite_domains = {corpora.corpus_domain(TASKS[name].source_corpus) for name in TASKS}
    independent_domains = {corpora.corpus_domain(cls.source_corpus) for cls in INDEPENDENT}
    assert len(independent_domains) == 8 and not independent_domains & suite_domains
    assert set(INDEPENDENT_TASKS_V1) < set(INDEPENDENT_TASKS_V2) < set(INDEPENDENT_TASKS)
    suite_packages = {getattr(TASKS[name], "package", None) for name in TASKS} - {None}
    assert {cls.package for cls in INDEPENDENT}.isdisjoint(suite_packages | {"gensim"})
    from training.data import BUILTIN_CORPORA

    assert not {cls.source_corpus for cls in NEW_SUITE + INDEPENDENT} & set(BUILTIN_CORPORA)


# fast-mode floors between noise and a trained model: random vectors score 12-20 (retrieval among 40), ~9 (STS) and
# 30-33 (clustering of 200-218 short texts into 20-22 clusters); minilm-l3 84-88, ~68 and 51-55
FAST_FLOORS: dict[type[OfflineTask], float] = {
    SimLex999STS: 30.0,
    RDatasetsTitleRetrieval: 40.0,
    AWSServiceRetrieval: 40.0,
    AWSOperationClustering: 42.0,
    ElementDescriptionRetrieval: 40.0,
    WordNetDefinitionRetrieval: 40.0,
    ICD10ChapterClustering: 42.0,
    StdnumFormatRetrieval: 40.0,
    HPODefinitionRetrieval: 40.0,
    OccupationDescriptionRetrieval: 40.0,
    FortuneSubjectClustering: 36.5,  # noise 32.8, minilm-l3 40.6: loose subjects, 22 of them
    PatentSectionClustering: 26.0,  # noise 17.9, minilm-l3 34.8: eight broad fields
    FoodKindClustering: 6.0,  # noise 2.8, minilm-l3 11.2: bare names of five kinds, many of them proper names
    PylintMessageRetrieval: 40.0,  # noise 14.9, minilm-l3 83.6
    AnsibleModuleRetrieval: 40.0,  # noise 10.2, minilm-l3 90.2
    BioregistryResourceRetrieval: 40.0,  # noise 15.4, minilm-l3 93.5
    SpellSchoolClustering: 25.0,  # noise 19.7, minilm-l3 30.0: 80 spells, 8 schools the text rarely names
    SchemaOrgTypeRetrieval: 40.0,  # noise 10.8, minilm-l3 86.3
    NAICSSectorClustering: 45.0,  # noise 32.3, minilm-l3 62.2: 193 industry titles, 20 sectors
}


@pytest.mark.slow
@pytest.mark.parametrize("task_class", NEW_SUITE + INDEPENDENT)
def test_a_real_model_scores_above_noise(
    minilm_l3_path: Path, fake_model_factory: Any, task_class: type[OfflineTask]
) -> None:
    from training.torch_model import load_any

    def noise(text: str) -> list[float]:
        return [b / 255 - 0.5 for b in hashlib.sha256(text.encode()).digest()[:16]]

    floor = FAST_FLOORS[task_class]
    task = loaded(task_class(fast=True))
    real = score_task(EmbeddingMemo(load_any(minilm_l3_path), progress=False), task)["score"]
    assert floor <= real <= 100.0
    fake = EmbeddingMemo(fake_model_factory("noise", noise, 16), progress=False)
    assert score_task(fake, task_class(fast=True))["score"] < floor
