"""Tasks load offline, have the right shape, and score known embeddings to known values."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest
from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core import corpora
from evaluation import data
from evaluation.mteb_bridge import EmbeddingMemo
from evaluation.suite import score_task
from evaluation.tasks import (
    ACLSumRetrieval,
    BBCNewsClassification,
    BBCNewsClustering,
    BBCNewsKNN,
    CropPairRetrieval,
    LeeDocSTS,
    OfflineTask,
    resolve_task,
)
from evaluation.tasks.base import offline_metadata


def _loaded(task: OfflineTask) -> OfflineTask:
    task.load_data()
    return task


def test_lee_sts_shapes() -> None:
    assert len(_loaded(LeeDocSTS()).dataset["test"]) == 1225
    fast = _loaded(LeeDocSTS(fast=True)).dataset["test"]
    assert len(fast) == 66
    assert set(fast.column_names) == {"sentence1", "sentence2", "score"}


def test_bbc_shapes_and_split() -> None:
    assert len(_loaded(BBCNewsClustering()).dataset["test"]) == 2125
    assert len(_loaded(BBCNewsClustering(fast=True)).dataset["test"]) == 45
    full = _loaded(BBCNewsClassification()).dataset
    assert len(full["train"]) + len(full["test"]) == 2125
    assert not set(full["train"]["text"]) & set(full["test"]["text"])
    knn = _loaded(BBCNewsKNN(fast=True)).dataset
    assert (len(knn["train"]), len(knn["test"])) == (30, 15)
    assert set(knn["test"]["text"]) <= set(corpora.bbc_split("test")[0])  # fast mode keeps the split


def test_aclsum_shapes() -> None:
    split = _loaded(ACLSumRetrieval()).dataset["default"]["test"]
    assert (len(split["queries"]), len(split["corpus"])) == (750, 250)
    fast = _loaded(ACLSumRetrieval(fast=True)).dataset["default"]["test"]
    assert (len(fast["queries"]), len(fast["corpus"])) == (48, 16)
    assert all(len(rel) == 1 for rel in fast["relevant_docs"].values())


def test_crop_pair_task_from_a_corpus() -> None:
    docs = list(corpora.lee_background()[:10])
    task = _loaded(CropPairRetrieval.from_corpus(docs, seed=0, name="CropPairRetrieval-mine"))
    assert task.metadata.name == "CropPairRetrieval-mine"
    split = task.dataset["default"]["test"]
    assert len(split["queries"]) == len(split["corpus"]) == task.crop_stats["pairs"] >= 5
    for query, doc in zip(split["queries"]["text"], split["corpus"]["text"], strict=True):
        assert query != doc
    assert task.cache_key != CropPairRetrieval.from_corpus(docs[:9], name="CropPairRetrieval-mine").cache_key
    with pytest.raises(ValueError, match="a crop-pair task needs at least 2"):
        CropPairRetrieval.from_corpus(["Too short to crop."]).load_data()
    with pytest.raises(TypeError, match="list of documents"):
        CropPairRetrieval.from_corpus("one string")


def test_resolve_task() -> None:
    assert isinstance(resolve_task("leedocsts"), LeeDocSTS)
    assert resolve_task(BBCNewsKNN, fast=True).fast
    with pytest.raises(ValueError, match="unknown task 'STSBenchmark'; known tasks: LeeDocSTS"):
        resolve_task("STSBenchmark")


def _label_model(fake_model_factory: Any):
    texts, labels = corpora.bbc_articles()
    by_text = dict(zip(texts, labels, strict=True))
    index = {label: i for i, label in enumerate(corpora.BBC_CLASSES)}

    def one_hot(text: str) -> list[float]:
        row = [0.0] * 6
        row[index[by_text[text]]] = 1.0
        return row

    return fake_model_factory("one-hot-labels", one_hot, 6)


@pytest.mark.parametrize("task_class", [BBCNewsClustering, BBCNewsClassification, BBCNewsKNN])
def test_bbc_metrics_wiring_with_label_embeddings(fake_model_factory: Any, task_class: type[OfflineTask]) -> None:
    # Embeddings that are the class one-hot: V-measure, probe and kNN accuracy must all be perfect.
    result = score_task(EmbeddingMemo(_label_model(fake_model_factory), progress=False), task_class(fast=True))
    assert result["score"] == pytest.approx(100.0)


class _ToyRetrieval(OfflineTask, AbsTaskRetrieval):
    metadata = offline_metadata("ToyRetrieval", "Retrieval", "ndcg_at_10", "toy")

    def check_data(self) -> None:
        return None

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": "q", "text": "query"}]),
            corpus=Dataset.from_list([{"id": d, "text": d, "title": ""} for d in ("closest", "relevant", "far")]),
            relevant_docs={"q": {"relevant": 1}},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True


def test_ndcg_of_a_toy_ranking(fake_model_factory: Any) -> None:
    vectors = {"query": [1.0, 0.0], "closest": [1.0, 0.1], "relevant": [1.0, 0.5], "far": [0.0, 1.0]}
    model = fake_model_factory("toy", vectors.__getitem__, 2)
    result = score_task(EmbeddingMemo(model, progress=False), _ToyRetrieval())
    # the relevant document is ranked 2nd: nDCG@10 = (1 / log2(3)) / (1 / log2(2))
    assert result["score"] == pytest.approx(100 / math.log2(3), abs=1e-3)
    assert result["details"]["recall_at_1"] == 0.0
    assert result["details"]["recall_at_3"] == 1.0


def test_sts_is_spearman_of_cosine(fake_model_factory: Any) -> None:
    # Embed each Lee document so cosine similarity orders pairs exactly like the human scores of
    # document 0's pairs: with only pairs (0, j), Spearman must be 1 for a monotone embedding.
    class FirstRowSTS(LeeDocSTS):
        def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
            super().load_data()
            self.dataset["test"] = self.dataset["test"].filter(lambda row: row["sentence1"] == docs[0])

    docs = data.lee_documents()
    sims = data.lee_similarity_matrix()

    def embed(text: str) -> list[float]:
        j = docs.index(text)
        if j == 0:
            return [1.0, 0.0]
        angle = (1.0 - sims[0][j]) * math.pi / 2  # higher human score -> smaller angle to document 0
        return [math.cos(angle), math.sin(angle)]

    result = score_task(EmbeddingMemo(fake_model_factory("lee", embed, 2), progress=False), FirstRowSTS())
    assert result["score"] == pytest.approx(100.0)


def test_crop_stats_are_available_without_loading(fake_model_factory: Any) -> None:
    task = CropPairRetrieval.from_corpus(list(corpora.lee_background()[:8]), name="CropPairRetrieval-stats")
    assert task.crop_stats["documents"] == 8 and task.crop_stats["pairs"] >= 2
    assert task.crop_stats["rule"]


def test_a_task_scores_the_same_model_the_same_way_every_time(fake_model_factory: Any) -> None:
    # mteb draws clustering's bootstrap samples from a task-level RNG; without a reseed per evaluation the
    # second model scored by one task instance (validate's baseline, a compare table's next row) saw other samples
    def noisy(text: str) -> list[float]:
        digest = hashlib.sha256(text.encode()).digest()
        return [b / 255 for b in digest[:8]]

    model = fake_model_factory("noisy", noisy, 8)
    task = BBCNewsClustering(fast=True)
    first = score_task(EmbeddingMemo(model, progress=False), task)["score"]
    assert score_task(EmbeddingMemo(model, progress=False), task)["score"] == first
