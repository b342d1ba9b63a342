"""CropPairRetrieval: a label-free retrieval task built from any corpus.

For each document with at least two crops, two distinct crops are drawn with a seeded RNG (the
crop rule is `core.text.choose_crop_rule` of the corpus, paper 000 §3.1's rule when it yields
enough pairs): one becomes a query, the other joins the corpus. A query must retrieve the crop of its
own document among the crops of every document; main score nDCG@10 (one relevant crop per query).
This is what ``/adapt`` scores on a customer corpus that has no labels.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core import corpora
from core.text import CropRule, choose_crop_rule, crop_yield
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_DOCUMENTS = 24
MIN_PAIRS = 2


class TooFewCropPairs(ValueError):
    """Fewer than `MIN_PAIRS` documents of a crop-pair task yield two crops: the corpus (or its held-out part) is
    too short or too small for the task; the message says which and what to give instead."""


class CropPairRetrieval(OfflineTask, AbsTaskRetrieval):
    """Held-out crop of each document retrieves another crop of the same document (nDCG@10).

    Build it with `from_corpus`; the default constructor uses gensim's 300 Lee background documents
    (news; disjoint from the scored ``lee.cor``), so the suite has a crop task without a customer corpus.
    """

    metadata = offline_metadata(
        "CropPairRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Self-supervised: a crop of each document retrieves another crop of the same document.",
    )
    source_corpus = corpora.CORPUS_LEE_BACKGROUND  # a task built from a corpus names it after the task

    def __init__(
        self,
        fast: bool = False,
        seed: int = 0,
        *,
        texts: Sequence[str] | None = None,
        name: str | None = None,
        max_documents: int | None = None,
        rule: CropRule | None = None,
        **kwargs: Any,
    ) -> None:
        self._texts = None if texts is None else [t for t in texts if t and t.strip()]
        if texts is not None:
            self.source_corpus = name or "CropPairRetrieval"
        self.rule = rule  # None: `choose_crop_rule` of the documents
        self.crop_seed = seed
        self.max_documents = max_documents
        if name is not None:
            self.metadata = offline_metadata(name, "Retrieval", "ndcg_at_10", self.metadata.description)
        elif texts is None:
            self.metadata = offline_metadata(
                "CropPairRetrieval-LeeBackground",
                "Retrieval",
                "ndcg_at_10",
                "Crop-pair retrieval over gensim's 300 Lee background news documents.",
            )
        super().__init__(fast=fast, **kwargs)
        self._crop_stats: dict[str, Any] = {}

    @property
    def crop_stats(self) -> dict[str, Any]:
        """Documents, pairs, crop rule and yield (computed on first use, also when results came from the cache)."""
        if not self._crop_stats:
            self.crop_pairs()
        return self._crop_stats

    @classmethod
    def from_corpus(
        cls,
        texts: Sequence[str],
        seed: int = 0,
        name: str = "CropPairRetrieval",
        *,
        fast: bool = False,
        max_documents: int | None = None,
        rule: CropRule | None = None,
    ) -> CropPairRetrieval:
        """A crop-pair task over ``texts`` (one document per string). ``name`` names it in reports; ``rule`` is
        the crop rule (default: chosen from ``texts``) — /adapt passes the rule its training used."""
        if isinstance(texts, str):
            raise TypeError("texts must be a list of documents, not one string")
        return cls(fast=fast, seed=seed, texts=list(texts), name=name, max_documents=max_documents, rule=rule)

    def _documents(self) -> list[str]:
        return list(corpora.lee_background()) if self._texts is None else self._texts

    def check_data(self) -> None:
        if self._texts is None:
            corpora.lee_background()

    @property
    def cache_key(self) -> str:
        digest = hashlib.sha256("\x00".join(self._documents()).encode()).hexdigest()[:16]
        rule = f"-{self.rule.describe()}" if self.rule else ""
        return f"{super().cache_key}-s{self.crop_seed}-n{self.max_documents}-{digest}{rule}"

    def crop_pairs(self) -> list[tuple[str, str]]:
        """(query crop, corpus crop) per usable document, in document order; stats in ``crop_stats``."""
        documents = self._documents()
        limit = FAST_DOCUMENTS if self.fast else self.max_documents
        if limit is not None:
            documents = documents[:limit]
        rule = self.rule or choose_crop_rule(documents)
        rng = random.Random(self.crop_seed)
        pairs = [p for p in (rule.sample_pair(doc, rng) for doc in documents) if p is not None]
        self._crop_stats = {
            "documents": len(documents),
            "pairs": len(pairs),
            "rule": rule.describe(),
            "yield": crop_yield(documents, rule),
        }
        if len(pairs) < MIN_PAIRS:
            raise TooFewCropPairs(
                f"{self.metadata.name}: only {len(pairs)} of {len(documents)} documents have two crops "
                f"(rule: {rule.describe()}); a crop-pair task needs at least {MIN_PAIRS} — give longer "
                "documents (several sentences each) or more of them"
            )
        return pairs

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        pairs = self.crop_pairs()
        queries = [{"id": f"q{i}", "text": query} for i, (query, _) in enumerate(pairs)]
        corpus = [{"id": f"d{i}", "text": positive, "title": ""} for i, (_, positive) in enumerate(pairs)]
        split = RetrievalSplitData(
            queries=Dataset.from_list(queries),
            corpus=Dataset.from_list(corpus),
            relevant_docs={f"q{i}": {f"d{i}": 1} for i in range(len(pairs))},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True
