"""Training corpora: the offline built-in corpora, corpus files, and the whole-text units distillation trains on.

A corpus is a list of *documents* (strings); views (crops, dropout, token augmentations) are made
from them by `core.text` and `training.views`. Built-in corpora (see docs/OFFLINE.md) never include a text that an
evaluation task scores; each has a domain in `core.corpora.CORPUS_DOMAINS`:

| name | documents |
|---|---|
| ``aclsum`` | body paragraphs of the 250 ACLSum papers (the evaluated abstracts and summaries are not used) |
| ``bbc`` | the BBC News *train* split of `core.corpora.bbc_split` (its test split is what evaluation scores) |
| ``enwiki`` | paragraphs of gensim's shortened English Wikipedia dump (106 articles) |
| ``lee_background`` | gensim's 300 Lee background news documents (not the 50 scored ``lee.cor`` documents) |

Files and folders are read by `core.corpus_files` — the reader /adapt uploads go through too, so one file is one
corpus everywhere (a ``.txt`` holds documents separated by blank lines, or one per line when it has no blank line).
"""

from __future__ import annotations

import bz2
import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core import corpora
from core.corpus_files import iter_corpus_file
from core.text import CorpusError, hold_out, split_sentences
from evaluation.domain_checks import PIECES, short_piece

MIN_PARAGRAPH_CHARS = 200
MIN_SENTENCE_CHARS = 40  # shorter "sentences" are mostly split debris ("Fig.", "et al.", list items)
SPAN_WORDS = (3, 12)  # the shortest and longest word run `query_units` cuts
# A name inside a sentence: a capitalised word, then up to four more, "of", "the", "and", "de" or "for" between them
# (never last) — "Henry Cavendish", "Principality of Andorra", "National Institute for Nuclear Physics"
_NAME = re.compile(r"\b[A-Z][\w'&-]*(?:\s+(?:(?:of|the|and|de|for)\s+)?[A-Z][\w'&-]*){0,4}")


def bbc_train_texts() -> list[str]:
    """BBC News train split (`core.corpora.bbc_split`; its test split is evaluated)."""
    texts, _labels = corpora.bbc_split("train")
    return texts


def enwiki_paragraphs() -> list[str]:
    """Plain-text paragraphs (≥ 200 characters) of gensim's shortened Wikipedia dump."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    path = corpora.gensim_test_file("enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")
    paragraphs = []
    with bz2.open(path) as handle:
        for _title, text, _page_id in extract_pages(handle):
            for block in filter_wiki(text).split("\n\n"):
                line = " ".join(block.replace("'''", "").replace("''", "").split())
                if len(line) >= MIN_PARAGRAPH_CHARS and not line.startswith(("*", "|", "{", "!")):
                    paragraphs.append(line)
    return paragraphs


BUILTIN_CORPORA: dict[str, Callable[[], list[str]]] = {
    corpora.CORPUS_ACLSUM: corpora.aclsum_body_paragraphs,
    corpora.CORPUS_BBC: bbc_train_texts,
    corpora.CORPUS_ENWIKI: enwiki_paragraphs,
    corpora.CORPUS_LEE_BACKGROUND: lambda: list(corpora.lee_background()),
}


def _builtin_names(spec: str | Path | Sequence[str]) -> list[str] | None:
    """The built-in corpora a spec names (``"enwiki+aclsum"`` → both), or None for a path or texts."""
    names = str(spec).split("+") if isinstance(spec, str | Path) else []
    return names if names and all(name in BUILTIN_CORPORA for name in names) else None


def corpus_names(spec: str | Path | Sequence[str]) -> list[str]:
    """What a model trained on ``spec`` records as ``trained_on`` (recipe.json, the bundle manifest): the
    built-in corpus names (their domains are `core.corpora.CORPUS_DOMAINS`), or ``custom`` for a path or texts."""
    return _builtin_names(spec) or [corpora.CUSTOM_CORPUS]


def load_corpus(spec: str | Path | Sequence[str], *, max_documents: int | None = None, seed: int = 0) -> list[str]:
    """Documents of a corpus: a built-in name (or several joined by ``+``), a file or folder path, or texts.

    With ``max_documents`` a seeded random subset is kept (in corpus order): `sample_indices` of the corpus's size. A
    file or folder is then read twice, one document at a time (`core.corpus_files.iter_corpus_file`): once to count
    its documents, once to keep the sampled ones, so memory holds the sample, not the file (a ``.json`` array is
    the exception: it is read whole).
    """
    names = _builtin_names(spec)
    if names:
        documents = [doc for name in names for doc in BUILTIN_CORPORA[name]()]
    elif isinstance(spec, str | Path):
        path = Path(spec).expanduser()
        if not path.exists():
            raise CorpusError(
                f"corpus {str(spec)!r} is neither a built-in corpus {sorted(BUILTIN_CORPORA)} nor an existing path"
            )
        if max_documents is None:
            documents = list(iter_corpus_file(path))
        else:
            count = sum(1 for d in iter_corpus_file(path) if d.strip())
            keep = sample_indices(count, max_documents, seed)
            documents = [d for i, d in enumerate(d for d in iter_corpus_file(path) if d.strip()) if i in keep]
    else:
        documents = [str(t) for t in spec]
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise CorpusError(f"corpus {spec if isinstance(spec, str | Path) else '(texts)'} has no non-empty documents")
    if max_documents is not None and len(documents) > max_documents:
        keep = sample_indices(len(documents), max_documents, seed)
        documents = [documents[i] for i in sorted(keep)]
    return documents


def sample_indices(count: int, max_documents: int, seed: int) -> set[int]:
    """The positions of the documents ``max_documents`` keeps of ``count`` (all of them when they fit): a seeded
    draw that depends on the count alone, so a corpus read twice one document at a time keeps what a list of it
    would."""
    if count <= max_documents:
        return set(range(count))
    return set(random.Random(seed).sample(range(count), max_documents))


@dataclass(frozen=True)
class ValidationSplit:
    train: list[str]
    validation: list[str]


def split_documents(documents: Sequence[str], fraction: float, *, seed: int, max_validation: int) -> ValidationSplit:
    """Hold out a seeded random ``fraction`` of the documents (at most ``max_validation``) for validation."""
    split = hold_out(documents, fraction, seed=seed, minimum=1, maximum=max_validation)
    if len(split.train) < 2:
        raise CorpusError(
            f"{len(documents)} documents are too few to hold out {len(documents) - len(split.train)} for validation "
            "and train on at least 2: give more documents, lower validation_fraction or set validation = 'none'"
        )
    if not split.held:
        raise CorpusError(
            "no document can be held out for validation: each one drawn is also among the training documents "
            "(the corpus repeats them); give more distinct documents, raise validation_fraction or set "
            "validation = 'none'"
        )
    return ValidationSplit(train=[documents[i] for i in split.train], validation=[documents[i] for i in split.held])


def name_phrases(text: str) -> list[str]:
    """The name-like phrases of a text, each once, in order: runs of capitalised words (`_NAME`) that do not open
    their sentence (a sentence's first word is capitalised whatever it is)."""
    return _names_in(split_sentences(text))


def _names_in(sentences: Sequence[str]) -> list[str]:
    found: dict[str, None] = {}
    for sentence in sentences:
        first = sentence.split(maxsplit=1)
        for match in _NAME.finditer(first[1] if len(first) == 2 else ""):
            found[match.group(0)] = None
    return list(found)


def text_units(documents: Sequence[str], sentences_per_document: int, *, seed: int, names: int = 0) -> list[str]:
    """Whole texts to distil on, short and long mixed: every document followed by up to
    ``sentences_per_document`` of its sentences (seeded draw, of at least ``MIN_SENTENCE_CHARS`` characters) and up
    to ``names`` of its name-like phrases (`name_phrases`, a seeded draw), each text once. Split documents first,
    then expand: a held-out document's sentences and names stay held out."""
    rng = random.Random(seed)
    units: dict[str, None] = {}
    for document in documents:
        units[document] = None
        split = split_sentences(document)
        sentences = [s for s in split if len(s) >= MIN_SENTENCE_CHARS and s != document]
        for sentence in rng.sample(sentences, min(sentences_per_document, len(sentences))):
            units[sentence] = None
        if names:
            phrases = _names_in(split)
            for name in rng.sample(phrases, min(names, len(phrases))):
                units[name] = None
    return list(units)


def document_pieces(documents: Sequence[str]) -> list[str]:
    """Each document's short pieces (`evaluation.domain_checks.PIECES`: its first sentence, its first words, its most
    central sentence), those it is long enough for."""
    return [found[0] for doc in documents for kind in PIECES if (found := short_piece(doc, kind))]


def query_units(documents: Sequence[str], spans: int, *, seed: int) -> list[str]:
    """Short texts shaped like a customer's queries, cut from ``documents``: each document's short pieces
    (`document_pieces`), then, per
    document, every sentence and ``spans`` seeded runs of 3-12 of its words (name-like phrases; none from a document of
    12 words or fewer). A text may come twice (a first sentence is a piece and a sentence): the shapes customers
    query with weigh more. Split documents first, then cut: a held-out document's pieces stay held out."""
    return [unit for unit, _source in query_unit_sources(documents, spans, seed=seed)]


def query_unit_sources(documents: Sequence[str], spans: int, *, seed: int) -> list[tuple[str, int]]:
    """`query_units` in the same order, each with the index in ``documents`` of the document it was cut from."""
    units = [(found[0], i) for i, doc in enumerate(documents) for kind in PIECES if (found := short_piece(doc, kind))]
    rng = random.Random(seed)
    shortest, longest = SPAN_WORDS
    for i, document in enumerate(documents):
        units += [(sentence, i) for sentence in split_sentences(document)]
        words = document.split()
        for _ in range(spans if len(words) > longest else 0):
            n = rng.randint(shortest, longest)
            at = rng.randrange(len(words) - n)
            units.append((" ".join(words[at : at + n]), i))
    return units


def shared_pieces(documents: Sequence[str], pieces: Sequence[tuple[str, int]]) -> set[str]:
    """The texts of ``pieces`` (``(text, index in documents)``, as `query_unit_sources` cuts them) whose words also
    run, in order, through a document other than their own (case and spacing aside): boilerplate a licence shares
    with its variants, a phrase many documents use. Such a piece does not say which document it belongs to, so a
    target that turns it toward one of them (`training.targets.pulled_targets`) teaches the student a guess. Candidate
    documents come from an index of each document's word runs (up to three words), then a substring test confirms."""
    tokens = [doc.lower().split() for doc in documents]
    padded = [f" {' '.join(words)} " for words in tokens]  # a substring here is a whole-word run
    index: dict[int, dict[tuple[str, ...], set[int]]] = {}  # run length -> run -> documents holding it

    def runs(words: list[str], k: int) -> set[tuple[str, ...]]:
        return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}

    shared: set[str] = set()
    for text, source in pieces:
        words = text.lower().split()
        if not words or text in shared:
            continue
        k = min(len(words), 3)
        if k not in index:
            index[k] = {}
            for i, doc_words in enumerate(tokens):
                for run in runs(doc_words, k):
                    index[k].setdefault(run, set()).add(i)
        candidates = set.intersection(*(index[k].get(run, set()) for run in runs(words, k))) - {source}
        needle = f" {' '.join(words)} "
        if any(needle in padded[i] for i in candidates):
            shared.add(text)
    return shared


@dataclass(frozen=True)
class ScoredPair:
    text1: str
    text2: str
    score: float


def load_scored_pairs(path: str | Path) -> list[ScoredPair]:
    """Supervised pairs for CoSENT fine-tuning: JSONL lines ``{"text1", "text2", "score"}``, UTF-8 (a byte-order
    mark dropped) as corpus files are; a score is a finite number."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"scored-pairs file {path} does not exist")
    try:
        content = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path} is not UTF-8 text ({err}); re-encode it as UTF-8") from err
    pairs = []
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text1, text2, score = str(row["text1"]), str(row["text2"]), row["score"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CorpusError(f"{path}:{number}: expected {{'text1', 'text2', 'score'}}, got {line[:80]!r}") from exc
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise CorpusError(f"{path}:{number}: the score must be a finite number, got {score!r}")
        pairs.append(ScoredPair(text1, text2, float(score)))
    if len(pairs) < 2:
        raise CorpusError(f"{path}: need at least 2 scored pairs, found {len(pairs)}")
    return pairs
