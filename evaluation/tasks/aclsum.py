"""ACLSumRetrieval: human-written summaries retrieve the abstract of their paper."""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core import corpora
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_PAPERS = 16


class ACLSumRetrieval(OfflineTask, AbsTaskRetrieval):
    """750 queries (the challenge, approach and outcome summary of each of 250 ACL papers, written by
    people) over a corpus of the 250 abstracts; one relevant abstract per query; main score nDCG@10.

    Takamura et al. (2024) ACLSum, shipped by the ``aclsum`` package. Body paragraphs of the same
    papers are the training corpus (`core.corpora.aclsum_body_paragraphs`); abstracts and
    summaries are never trained on.
    """

    metadata = offline_metadata(
        "ACLSumRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "ACLSum: 750 human-written aspect summaries retrieve their paper's abstract among 250.",
        "https://aclanthology.org/2024.naacl-long.371/",
    )
    source_corpus = corpora.CORPUS_ACLSUM

    def check_data(self) -> None:
        corpora.aclsum_papers()

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        papers = corpora.aclsum_papers()
        if self.fast:
            papers = papers[:FAST_PAPERS]
        queries = [
            {"id": f"{paper.id}/{aspect}", "text": paper.summaries[aspect]}
            for paper in papers
            for aspect in corpora.ACLSUM_ASPECTS
        ]
        corpus = [{"id": paper.id, "text": paper.abstract, "title": ""} for paper in papers]
        relevant = {q["id"]: {q["id"].split("/")[0]: 1} for q in queries}
        split = RetrievalSplitData(
            queries=Dataset.from_list(queries),
            corpus=Dataset.from_list(corpus),
            relevant_docs=relevant,
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True
