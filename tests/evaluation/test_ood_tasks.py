"""The out-of-domain tasks (Bible paraphrases, standard-library docstrings): frozen inputs, fast mode, real scores."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from core import corpora
from evaluation import frozen_corpora
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import score_task
from evaluation.tasks import (
    TASKS,
    BibleParaphraseRetrieval,
    OfflineTask,
    PyDocModuleClustering,
    PyDocSummaryRetrieval,
)

OOD_TASKS = [BibleParaphraseRetrieval, PyDocSummaryRetrieval, PyDocModuleClustering]
READERS: list[tuple[Callable[..., tuple[Any, ...]], str]] = [
    (frozen_corpora.bible_parallel_verses, "BIBLE_SHA256"),
    (frozen_corpora.stdlib_docstrings, "PYDOC_SHA256"),
]


@pytest.fixture
def fresh_readers() -> Iterator[None]:
    """Readers cache their selection per process: re-read it inside the test, and again after it."""
    for reader, _ in READERS:
        reader.cache_clear()
    yield
    for reader, _ in READERS:
        reader.cache_clear()


def _loaded(task: OfflineTask) -> OfflineTask:
    task.load_data()
    return task


def test_bible_paraphrase_shapes() -> None:
    verses = frozen_corpora.bible_parallel_verses()
    assert len(verses) == 1205
    assert len({v.id // 1000 for v in verses}) == 64  # whole chapters
    assert [v.id for v in verses] == sorted(v.id for v in verses)
    assert all(v.modern != v.archaic and "[" not in v.modern + v.archaic for v in verses)
    assert all(not v.modern[0].isdigit() for v in verses)  # verse numbers stripped
    fast = _loaded(BibleParaphraseRetrieval(fast=True)).dataset["default"]["test"]
    assert len(fast["queries"]) == len(fast["corpus"]) == 22
    assert all(len(rel) == 1 for rel in fast["relevant_docs"].values())
    assert set(fast["corpus"]["text"]) <= {v.archaic for v in verses}


def test_pydoc_shapes() -> None:
    docstrings = frozen_corpora.stdlib_docstrings()
    assert {d.module for d in docstrings} == set(frozen_corpora.PYDOC_MODULES)
    assert len({d.summary for d in docstrings}) == len(docstrings)  # summaries are unique, so queries are
    assert all("\n" not in d.summary and ">>>" not in d.body for d in docstrings)
    split = _loaded(PyDocSummaryRetrieval()).dataset["default"]["test"]
    assert (len(split["queries"]), len(split["corpus"])) == (340, 340)
    assert all(len(body) >= frozen_corpora.PYDOC_MIN_BODY_CHARS for body in split["corpus"]["text"])
    fast = _loaded(PyDocSummaryRetrieval(fast=True)).dataset["default"]["test"]
    assert len(fast["queries"]) == 40
    clusters = _loaded(PyDocModuleClustering()).dataset["test"]
    assert len(clusters) == 710
    assert len({labels[0] for labels in clusters["labels"]}) == len(frozen_corpora.PYDOC_MODULES)
    fast_clusters = _loaded(PyDocModuleClustering(fast=True)).dataset["test"]
    assert len(fast_clusters) == 5 * len(frozen_corpora.PYDOC_MODULES)
    assert set(fast_clusters["sentences"]) <= {d.summary for d in docstrings}


@pytest.mark.usefixtures("fresh_readers")
@pytest.mark.parametrize(("reader", "constant"), READERS)
def test_inputs_are_deterministic(reader: Callable[..., tuple[Any, ...]], constant: str) -> None:
    first = reader(verify=False)
    reader.cache_clear()
    assert reader(verify=False) == first
    digest = frozen_corpora.inputs_digest([tuple(vars(item).values()) for item in first])
    assert digest == getattr(frozen_corpora, constant)


@pytest.mark.usefixtures("fresh_readers")
@pytest.mark.parametrize(
    ("task_class", "constant"),
    [
        (BibleParaphraseRetrieval, "BIBLE_SHA256"),
        (PyDocSummaryRetrieval, "PYDOC_SHA256"),
        (PyDocModuleClustering, "PYDOC_SHA256"),
    ],
)
def test_changed_inputs_refuse_to_run(
    monkeypatch: pytest.MonkeyPatch, task_class: type[OfflineTask], constant: str
) -> None:
    monkeypatch.setattr(frozen_corpora, constant, "0" * 64)
    with pytest.raises(corpora.DataUnavailableError, match="the selected inputs changed"):
        task_class(fast=True).load_data()
    assert "selected inputs changed" in (task_class().unavailable_reason() or "")  # the suite skips it, with why


def test_check_frozen_names_the_fix() -> None:
    records = [("a", "b"), ("c", "d")]
    frozen_corpora.check_frozen("toy", records, frozen_corpora.inputs_digest(records), "unused")
    with pytest.raises(corpora.DataUnavailableError, match=r"toy: the selected inputs changed .* reinstall it"):
        frozen_corpora.check_frozen("toy", records[:1], frozen_corpora.inputs_digest(records), "reinstall it")
    assert frozen_corpora.inputs_digest([("ab", "c")]) != frozen_corpora.inputs_digest([("a", "bc")])


def test_every_task_names_its_source_corpus() -> None:
    from training.data import BUILTIN_CORPORA

    sources = {name: cls.source_corpus for name, cls in TASKS.items()}
    assert all(sources.values())
    # the existing tasks' corpora carry training's names where training can read them ...
    assert {sources["CropPairRetrieval-LeeBackground"], sources["ACLSumRetrieval"], sources["BBCNewsKNN"]} <= set(
        BUILTIN_CORPORA
    )
    # ... and no built-in training corpus is the source of an out-of-domain task
    assert not {cls.source_corpus for cls in OOD_TASKS} & set(BUILTIN_CORPORA)


# fast-mode floors between noise and a trained model: random vectors score ~13 (retrieval) and ~50 (clustering:
# 115 summaries in 23 small clusters), minilm-l3 ~98, ~58 and ~70
FAST_FLOORS = {BibleParaphraseRetrieval: 50.0, PyDocSummaryRetrieval: 40.0, PyDocModuleClustering: 60.0}


@pytest.mark.slow
@pytest.mark.parametrize("task_class", OOD_TASKS)
def test_a_real_model_scores_above_noise(
    minilm_l3_path: Path, fake_model_factory: Any, task_class: type[OfflineTask]
) -> None:
    from training.torch_model import load_any

    def noise(text: str) -> list[float]:
        return [b / 255 - 0.5 for b in hashlib.sha256(text.encode()).digest()[:16]]

    floor = FAST_FLOORS[task_class]
    real = score_task(EmbeddingMemo(load_any(minilm_l3_path), progress=False), task_class(fast=True))["score"]
    assert floor <= real <= 100.0
    assert (
        0.0
        <= score_task(EmbeddingMemo(fake_model_factory("noise", noise, 16), progress=False), task_class(fast=True))[
            "score"
        ]
        < floor
    )
