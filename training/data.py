"""Training corpora: local files through 🤗 ``datasets`` and the offline built-in corpora.

A corpus is a list of *documents* (strings); views (crops, dropout, token augmentations) are made
from them by `core.text` and `training.views`. Built-in corpora (see docs/OFFLINE.md) never include a text that an
evaluation task scores:

| name | documents |
|---|---|
| ``aclsum`` | body paragraphs of the 250 ACLSum papers (the evaluated abstracts and summaries are not used) |
| ``bbc`` | the BBC News *train* split defined by `evaluation.data` (its test split is what evaluation scores) |
| ``enwiki`` | paragraphs of gensim's shortened English Wikipedia dump (106 articles) |
| ``lee_background`` | gensim's 300 Lee background news documents (not the 50 scored ``lee.cor`` documents) |

Files: ``.txt`` (one document per line), ``.jsonl``/``.json`` (a ``text`` field), ``.parquet``
(a ``text`` column), or a folder of ``.txt`` files (one document per file).
"""

from __future__ import annotations

import bz2
import importlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import evaluation.data
from core.settings import get_settings
from core.text import CorpusError, hold_out, split_sentences

MIN_PARAGRAPH_CHARS = 200
MIN_SENTENCE_CHARS = 40  # shorter "sentences" are mostly split debris ("Fig.", "et al.", list items)


def _site_file(package: str, *parts: str) -> Path:
    module = importlib.import_module(package)
    return Path(module.__file__).parent.joinpath(*parts)  # type: ignore[arg-type]


def aclsum_body_paragraphs() -> list[str]:
    """Body paragraphs of the ACLSum papers (abstracts and summaries are evaluation data: excluded)."""
    return list(evaluation.data.aclsum_body_paragraphs())  # the evaluation package owns the split


def bbc_train_texts() -> list[str]:
    """BBC News train split, as defined by the evaluation package (its test split is evaluated)."""
    texts, _labels = evaluation.data.bbc_split("train")
    return list(texts)


def lee_background() -> list[str]:
    """gensim's 300 Lee background documents (disjoint from the 50 scored ``lee.cor`` documents)."""
    return list(evaluation.data.lee_background())


def enwiki_paragraphs() -> list[str]:
    """Plain-text paragraphs (≥ 200 characters) of gensim's shortened Wikipedia dump."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    path = _site_file(
        "gensim", "test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    )
    paragraphs = []
    with bz2.open(path) as handle:
        for _title, text, _page_id in extract_pages(handle):
            for block in filter_wiki(text).split("\n\n"):
                line = " ".join(block.replace("'''", "").replace("''", "").split())
                if len(line) >= MIN_PARAGRAPH_CHARS and not line.startswith(("*", "|", "{", "!")):
                    paragraphs.append(line)
    return paragraphs


BUILTIN_CORPORA: dict[str, Callable[[], list[str]]] = {
    "aclsum": aclsum_body_paragraphs,
    "bbc": bbc_train_texts,
    "enwiki": enwiki_paragraphs,
    "lee_background": lee_background,
}


def _load_with_datasets(path: Path) -> list[str]:
    import datasets

    suffix = path.suffix.lower()
    builder = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}.get(suffix)
    if builder is None:
        raise CorpusError(f"{path}: unsupported corpus file type {suffix!r}; use .txt, .jsonl, .json or .parquet")
    cache_dir = str(get_settings().cache_dir / "datasets")
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir)
    finally:
        datasets.logging.set_verbosity(verbosity)
    if "text" not in table.column_names:
        raise CorpusError(f"{path}: no 'text' column/field (found {table.column_names})")
    return [t for t in table["text"] if isinstance(t, str) and t.strip()]


def _builtin_names(spec: str | Path | Sequence[str]) -> list[str] | None:
    """The built-in corpora a spec names (``"enwiki+aclsum"`` → both), or None for a path or texts."""
    names = str(spec).split("+") if isinstance(spec, str | Path) else []
    return names if names and all(name in BUILTIN_CORPORA for name in names) else None


def corpus_names(spec: str | Path | Sequence[str]) -> list[str]:
    """What a model trained on ``spec`` records as ``trained_on`` (recipe.json, the bundle manifest): the
    built-in corpus names (their domains are `evaluation.data.CORPUS_DOMAINS`), or ``custom`` for a path or texts."""
    return _builtin_names(spec) or [evaluation.data.CUSTOM_CORPUS]


def load_corpus(spec: str | Path | Sequence[str], *, max_documents: int | None = None, seed: int = 0) -> list[str]:
    """Documents of a corpus: a built-in name (or several joined by ``+``), a file or folder path, or texts.

    With ``max_documents`` a seeded random subset is kept (in corpus order).
    """
    names = _builtin_names(spec)
    if names:
        documents = [doc for name in names for doc in BUILTIN_CORPORA[name]()]
    elif isinstance(spec, str | Path):
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(path.rglob("*.txt"))
            if not files:
                raise CorpusError(f"corpus folder {path} holds no .txt files")
            documents = [f.read_text(errors="replace").strip() for f in files]
        elif path.is_file():
            documents = _load_with_datasets(path)
        else:
            raise CorpusError(
                f"corpus {str(spec)!r} is neither a built-in corpus {sorted(BUILTIN_CORPORA)} nor an existing path"
            )
    else:
        documents = [str(t) for t in spec]
    documents = [d for d in documents if d.strip()]
    if not documents:
        raise CorpusError(f"corpus {spec if isinstance(spec, str | Path) else '(texts)'} has no non-empty documents")
    if max_documents is not None and len(documents) > max_documents:
        keep = sorted(random.Random(seed).sample(range(len(documents)), max_documents))
        documents = [documents[i] for i in keep]
    return documents


@dataclass(frozen=True)
class Split:
    train: list[str]
    validation: list[str]


def split_documents(documents: Sequence[str], fraction: float, *, seed: int, max_validation: int) -> Split:
    """Hold out a seeded random ``fraction`` of the documents (at most ``max_validation``) for validation."""
    held = set(hold_out(documents, fraction, seed=seed, minimum=1, maximum=max_validation))
    if len(documents) - len(held) < 2:
        raise CorpusError(f"{len(documents)} documents are too few to hold out {len(held)} for validation")
    return Split(
        train=[d for i, d in enumerate(documents) if i not in held],
        validation=[d for i, d in enumerate(documents) if i in held],
    )


def text_units(documents: Sequence[str], sentences_per_document: int, *, seed: int) -> list[str]:
    """Whole texts to distil on, short and long mixed: every document followed by up to
    ``sentences_per_document`` of its sentences (seeded draw, of at least ``MIN_SENTENCE_CHARS`` characters),
    each text once. Split documents first, then expand: a held-out document's sentences stay held out."""
    rng = random.Random(seed)
    units: dict[str, None] = {}
    for document in documents:
        units[document] = None
        sentences = [s for s in split_sentences(document) if len(s) >= MIN_SENTENCE_CHARS and s != document]
        for sentence in rng.sample(sentences, min(sentences_per_document, len(sentences))):
            units[sentence] = None
    return list(units)


@dataclass(frozen=True)
class ScoredPair:
    text1: str
    text2: str
    score: float


def load_scored_pairs(path: str | Path) -> list[ScoredPair]:
    """Supervised pairs for CoSENT fine-tuning: JSONL lines ``{"text1", "text2", "score"}``."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"scored-pairs file {path} does not exist")
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            pairs.append(ScoredPair(str(row["text1"]), str(row["text2"]), float(row["score"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise CorpusError(f"{path}:{number}: expected {{'text1', 'text2', 'score'}}, got {line[:80]!r}") from exc
    if len(pairs) < 2:
        raise CorpusError(f"{path}: need at least 2 scored pairs, found {len(pairs)}")
    return pairs
