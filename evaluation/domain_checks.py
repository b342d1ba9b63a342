"""In-domain checks shaped like what customers do with an embedder, built from the customer's documents alone.

Crop-pair retrieval (`evaluation.tasks.CropPairRetrieval`) asks a piece of a document to find another piece of the same
length: a model can win it by matching style and vocabulary, which adapting to a corpus rewards, while what a customer
does is search full documents with a short text. These checks ask a *short piece* of each held-out document to retrieve
the rest of it (the piece removed, so no check is won by copying text) among the rest of every held-out document and the
training documents (distractors, as in the customer's own index):

- ``lead``: the first sentence → the rest (a summary-like opening, as news leads and abstracts have);
- ``title``: the first `TITLE_WORDS` words of the first sentence → the rest (a title-like line);
- ``summary``: the sentence sharing the most words with the rest of the document → the rest (a summary-like span).

For a student, which is made to retrieve as its teacher does, `retrieval_agreement` scores how closely its retrieval of
the ``lead`` and ``title`` pieces follows its teacher's (the teacher's ten nearest documents as the relevant set): a
step that raises the pieces by learning the corpus's phrasing while moving the student away from its better teacher
lowers it.

Scores are nDCG@10 × 100 with one relevant document per query; `title_retrieval` scores a domain's real task the same
way (a name given by the data's publisher retrieves its document). kNN accuracy, when labels exist, is
`evaluation.diagnostics.knn_accuracy`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from evaluation.embedding_model import EmbeddingModel

PIECES = ("lead", "title", "summary")
TITLE_WORDS = 8
MIN_REST_WORDS = 8  # a remainder shorter than this is too little to retrieve
# A student's retrieval of these pieces is held to its teacher's (`retrieval_agreement`, its teacher's top rows):
# over 15 student pairs of three unseen domains (docs/ADAPT.md) the lead and title pieces' agreement moved with the
# real task where the pieces' own scores did not (a crop step that raised the pieces and lowered the real task).
AGREEMENT_PIECES = ("lead", "title")
AGREEMENT_DEPTH = 10
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")
_WORD = re.compile(r"[a-z0-9]+")
STOP_WORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "is", "it", "its", "of", "on",
     "or", "that", "the", "this", "to", "was", "were", "which", "with"]
)  # fmt: skip


@dataclass(frozen=True)
class PiecePair:
    query: str  # the short piece
    document: str  # the rest of its document
    source: int  # index of the document it came from


def _sentences(text: str) -> list[str]:
    return [s for s in (" ".join(p.split()) for p in _SENTENCE_END.split(text.strip())) if s]


def words(text: str) -> list[str]:
    """The lower-cased words (runs of letters and digits) of ``text``, in order."""
    return _WORD.findall(text.lower())


def content_words(text: str) -> set[str]:
    """The distinct words of ``text`` that are not `STOP_WORDS`."""
    return {w for w in words(text) if w not in STOP_WORDS}


def short_piece(text: str, kind: str) -> tuple[str, str] | None:
    """(piece, rest) of one document for a check of ``kind`` (`PIECES`), or None when the document is too short: it
    needs two sentences (``lead``, ``summary``) or, for ``title``, `TITLE_WORDS` words and `MIN_REST_WORDS` more."""
    if kind not in PIECES:
        raise ValueError(f"kind must be one of {PIECES}, got {kind!r}")
    sentences = _sentences(text)
    if kind == "title":
        first = sentences[0].split() if sentences else []
        rest = " ".join(sentences[1:]) if len(sentences) >= 2 else " ".join(first[TITLE_WORDS:])
        piece = " ".join(first[:TITLE_WORDS]).rstrip(".,;:!?")
        return (piece, rest) if piece and len(rest.split()) >= MIN_REST_WORDS else None
    if len(sentences) < 2:
        return None
    if kind == "lead":
        at = 0
    else:  # summary: the sentence whose content words cover most of the rest's
        overlaps = []
        for i, sentence in enumerate(sentences):
            own = content_words(sentence)
            others = content_words(" ".join(sentences[:i] + sentences[i + 1 :]))
            overlaps.append(len(own & others) / (len(own) ** 0.5 or 1.0))
        at = int(np.argmax(overlaps))
    rest = " ".join(sentences[:at] + sentences[at + 1 :])
    return (sentences[at], rest) if len(rest.split()) >= MIN_REST_WORDS else None


def piece_pairs(documents: Sequence[str], kind: str) -> list[PiecePair]:
    """One (piece, rest) pair per document that has one, in document order."""
    pairs = []
    for i, text in enumerate(documents):
        found = short_piece(text, kind)
        if found is not None:
            pairs.append(PiecePair(found[0], found[1], i))
    return pairs


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def ndcg_at_10(similarity: np.ndarray, relevant: Sequence[Iterable[int]]) -> np.ndarray:
    """nDCG@10 × 100 of each query (a row of ``similarity`` over the corpus) whose relevant corpus rows are
    ``relevant[q]`` (binary relevance; a tie with an irrelevant row counts against the query)."""
    scores = np.zeros(len(similarity))
    for q, rows in enumerate(relevant):
        rows = sorted(set(rows))
        row = np.asarray(similarity[q])
        mask = np.zeros(len(row), dtype=bool)
        mask[rows] = True
        gain = 0.0
        for n, r in enumerate(rows):
            rank = int((row[~mask] >= row[r]).sum() + (row[mask] > row[r]).sum())
            rank += int(sum(1 for other in rows[:n] if row[other] == row[r]))
            gain += 1 / np.log2(rank + 2) if rank < 10 else 0.0
        ideal = sum(1 / np.log2(i + 2) for i in range(min(len(rows), 10)))
        scores[q] = 100 * gain / ideal
    return scores


def piece_similarities(
    model: EmbeddingModel, held_out: Sequence[str], distractors: Sequence[str] = (), kinds: Sequence[str] = PIECES
) -> dict[str, np.ndarray]:
    """Each check's cosine similarities (queries × corpus): each held-out document's short piece (row ``i``) against
    the rests of every held-out document of that check (column ``i`` is its own) and then the ``distractors`` (whole
    documents never queried). A check with fewer than two pairs is left out.

    A list of texts is embedded once: the ``lead`` and ``title`` checks usually share every rest (all but a document's
    first sentence), and the same call gives the same vectors — an int8 graph quantises each batch by its own range,
    so texts are never regrouped into other batches than their check's."""
    seen: dict[tuple[str, ...], np.ndarray] = {}

    def embed(texts: Sequence[str], role: str = "document") -> np.ndarray:
        key = (role, *texts)
        if key not in seen:
            seen[key] = _unit(model.encode_as(list(texts), role))
        return seen[key]

    extra = embed(distractors) if distractors else np.zeros((0, 0), dtype=np.float32)
    out = {}
    for kind in kinds:
        pairs = piece_pairs(held_out, kind)
        if len(pairs) < 2:
            continue
        queries = embed([p.query for p in pairs], "query")
        corpus = embed([p.document for p in pairs])
        if len(extra):
            corpus = np.concatenate([corpus, extra])
        out[kind] = queries @ corpus.T
    return out


def piece_scores(similarities: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-query nDCG@10 of each check of `piece_similarities` (each piece's own rest is its one relevant row)."""
    return {kind: ndcg_at_10(sim, [[i] for i in range(len(sim))]) for kind, sim in similarities.items()}


def piece_retrieval(
    model: EmbeddingModel, held_out: Sequence[str], distractors: Sequence[str] = (), kinds: Sequence[str] = PIECES
) -> dict[str, np.ndarray]:
    """Per-query nDCG@10 of each check in ``kinds``: each held-out document's short piece retrieves its rest among the
    rests of every held-out document of that check and the ``distractors`` (`piece_similarities`)."""
    return piece_scores(piece_similarities(model, held_out, distractors, kinds))


def retrieval_agreement(similarity: np.ndarray, reference: np.ndarray, depth: int = AGREEMENT_DEPTH) -> np.ndarray:
    """Per-query nDCG@10 of ``similarity``'s ranking with the ``depth`` corpus rows ``reference`` ranks highest for
    that query as its relevant set: how closely a model retrieves like the reference model (100: the same top rows
    in the same order)."""
    if similarity.shape != reference.shape:
        raise ValueError(f"similarities of shape {similarity.shape} against a reference of shape {reference.shape}")
    return ndcg_at_10(similarity, np.argsort(-reference, axis=1)[:, :depth].tolist())


def title_retrieval(model: EmbeddingModel, titles: Sequence[str], texts: Sequence[str]) -> np.ndarray:
    """Per-query nDCG@10 of a real task: each distinct title retrieves the documents it names among ``texts``."""
    if len(titles) != len(texts):
        raise ValueError(f"{len(titles)} titles for {len(texts)} texts")
    by_title: dict[str, list[int]] = {}
    for i, title in enumerate(titles):
        by_title.setdefault(title, []).append(i)
    queries = _unit(model.encode_as(list(by_title), "query"))
    corpus = _unit(model.encode_as(list(texts), "document"))
    return ndcg_at_10(queries @ corpus.T, list(by_title.values()))
