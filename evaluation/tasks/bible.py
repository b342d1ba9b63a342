"""BibleParaphraseRetrieval: a verse in today's English retrieves the same verse in 1901 English."""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

from core import corpora
from evaluation import frozen_corpora
from evaluation.tasks.base import OfflineTask, offline_metadata

FAST_CHAPTERS = 2


class BibleParaphraseRetrieval(OfflineTask, AbsTaskRetrieval):
    """1,205 queries (verses of the Open English Bible, a 2010s translation) over a corpus of the same 1,205
    verses in the American Standard Version (1901, King-James wording: "saith", "unto", "thou hast");
    one relevant verse per query; main score nDCG@10.

    Short texts (one or two sentences) and a real paraphrase: two independent translations share the
    meaning, not the words. The verses are 64 whole chapters (`evaluation.frozen_corpora.bible_parallel_verses`), so the
    corpus holds each verse's neighbours — same people, same scene — and topic alone does not find it.
    No recipe trains on either translation.
    """

    metadata = offline_metadata(
        "BibleParaphraseRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Open English Bible verses retrieve the same verse in the American Standard Version (1901) among 64 chapters.",
        "https://openenglishbible.org/",
    )
    source_corpus = corpora.CORPUS_BIBLE

    def check_data(self) -> None:
        frozen_corpora.bible_parallel_verses()

    def verses(self) -> list[frozen_corpora.ParallelVerse]:
        """The verses this instance scores (fast: the first `FAST_CHAPTERS` chapters of the selection)."""
        verses = list(frozen_corpora.bible_parallel_verses())
        if self.fast:
            chapters = sorted({v.id // 1000 for v in verses})[:FAST_CHAPTERS]
            verses = [v for v in verses if v.id // 1000 in chapters]
        return verses

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        verses = self.verses()
        split = RetrievalSplitData(
            queries=Dataset.from_list([{"id": f"oeb-{v.id}", "text": v.modern} for v in verses]),
            corpus=Dataset.from_list([{"id": f"asv-{v.id}", "text": v.archaic, "title": ""} for v in verses]),
            relevant_docs={f"oeb-{v.id}": {f"asv-{v.id}": 1} for v in verses},
            top_ranked=None,
        )
        self.dataset = {"default": {"test": split}}
        self.data_loaded = True
