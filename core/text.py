"""Text handling shared by training, evaluation and /adapt: the sentence split, the crop rules, the seeded
hold-out of documents and the error a corpus that cannot be used raises.

One definition, so a job never evaluates on documents its training could not crop.

* **Crops** — cropping paper ``papers/000`` §3.1 ("cropping augmentation") and appendix "Cropping
  augmentation": split a document into sentences on periods, discard sentences under 100 or over
  250 characters, take every chunk of *t* consecutive sentences (t = 2), and sample two chunks of the
  same document as anchor and positive; they may overlap but never coincide. Documents with fewer
  than two chunks are skipped and counted (:class:`CropStats`).
* **Adaptive crop rule** — the 100–250 filter was tuned on abstracts; on short technical texts it
  leaves most documents without two crops (21 % of 1,000 documents kept two crops). :class:`CropRule`
  adds a relaxed length filter and per-document fall-backs (halves, sliding word windows), and
  :func:`choose_crop_rule` picks the first rule, from the paper's outward, under which enough of the
  corpus contributes. It reports the yield so a job can show it. `can_crop` is the loosest of those
  rules: what /adapt's intake accepts as a usable document.

Readings taken where the paper text is terse:

* *Sentence split.* The paper uses "periods ('.') as sentence delimiters". We split at a period
  followed by whitespace (or the end of the text), so decimals ("3.5") and dotted names ("e.g.x")
  inside a token do not cut a sentence; the period stays with its sentence.
* *Consecutive after filtering.* Chunks are *t* consecutive sentences of the filtered list (a dropped
  sentence does not break a run), as in the authors' description "cropped out all possible chunks of
  t = 2 consecutive sentences (discarding all sentences under 100 and over 250 characters)".

Pure, seeded functions (every random choice goes through the ``random.Random`` the caller passes).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

_PERIOD_END = re.compile(r"(?<=\.)\s+")
# Looser ends used only by the "halves" fall-back (which must accept the texts the /adapt intake accepts).
_ANY_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+")


class CorpusError(ValueError):
    """A corpus that names nothing readable, breaks a limit or has too few usable documents; the message says
    what to fix. ``code`` and ``details`` let an API answer with a stable code and the facts behind it."""

    def __init__(self, message: str, *, code: str = "invalid_corpus", details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details or {}

    def __reduce__(self) -> tuple[Any, ...]:
        # code and details survive a process boundary (an upload read in another process)
        return (_corpus_error, (type(self), str(self), self.code, self.details))


def _corpus_error(cls: type[CorpusError], message: str, code: str, details: dict[str, Any]) -> CorpusError:
    return cls(message, code=code, details=details)


def not_unicode(text: str) -> str | None:
    """Why ``text`` is not valid Unicode, to follow the text's name in a message ("is not valid Unicode: ..."), or
    None when it is. JSON's ``\\ud800`` escapes carry lone UTF-16 surrogates into a Python string, and no tokenizer
    or UTF-8 file takes one."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return f"is not valid Unicode: a lone surrogate (\\u{ord(text[err.start]):04x}) at character {err.start}"
    return None


PAPER_MIN_CHARS = 100
PAPER_MAX_CHARS = 250
RELAXED_MIN_CHARS = 40
MIN_WORDS_PER_HALF = 8  # a half (or a window) shorter than this is too little text to embed usefully
FALLBACKS = ("none", "halves", "windows")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, split on periods (paper 000, appendix "Cropping augmentation").

    A period followed by whitespace or the end of the text ends a sentence; whitespace runs inside a
    sentence collapse to one space; empty pieces are dropped.

    >>> split_sentences("One. Two  words.\\nThree 3.5")
    ['One.', 'Two words.', 'Three 3.5']
    """
    pieces = (" ".join(part.split()) for part in _PERIOD_END.split(text))
    return [p for p in pieces if p]


def crop_chunks(text: str, t: int = 2, min_chars: int = PAPER_MIN_CHARS, max_chars: int = PAPER_MAX_CHARS) -> list[str]:
    """All distinct chunks of ``t`` consecutive kept sentences (paper 000 §3.1; kept = length in
    ``[min_chars, max_chars]``), in document order. Identical chunks (repeated sentences) count once,
    so two chunks sampled from this list never coincide."""
    _check_crop_args(t, min_chars, max_chars)
    kept = [s for s in split_sentences(text) if min_chars <= len(s) <= max_chars]
    chunks = (" ".join(kept[i : i + t]) for i in range(len(kept) - t + 1))
    return list(dict.fromkeys(chunks))


def _check_crop_args(t: int, min_chars: int, max_chars: int) -> None:
    if t < 1:
        raise ValueError(f"t (sentences per crop) must be >= 1, got {t}")
    if min_chars < 0 or max_chars < min_chars:
        raise ValueError(
            f"need 0 <= min_chars <= max_chars, got min_chars={min_chars}, max_chars={max_chars}: swap or lower them"
        )


def _pick_two(chunks: Sequence[str], rng: random.Random) -> tuple[str, str] | None:
    if len(chunks) < 2:
        return None
    i, j = rng.sample(range(len(chunks)), 2)
    return chunks[i], chunks[j]


def sample_crop_pair(
    text: str,
    rng: random.Random,
    t: int = 2,
    min_chars: int = PAPER_MIN_CHARS,
    max_chars: int = PAPER_MAX_CHARS,
) -> tuple[str, str] | None:
    """(anchor, positive): two different chunks of ``text`` drawn uniformly without replacement
    (paper 000 §3.1: they may overlap, never coincide), or ``None`` when ``text`` has fewer than two."""
    return _pick_two(crop_chunks(text, t, min_chars, max_chars), rng)


@dataclass(frozen=True)
class CropRule:
    """How one document is cut into candidate crops.

    ``sentences``/``min_chars``/``max_chars`` are the paper's rule (000 §3.1) when left at their defaults.
    ``fallback`` applies to a document that yields fewer than two sentence chunks:

    * ``"halves"`` — its sentences (any length, ended by ``. ! ? ;``) split into a first and a second
      half; a one-sentence document is split into halves of words when each half has at least
      ``MIN_WORDS_PER_HALF`` words (on short technical texts, halving the rest covered every document).
    * ``"windows"`` — sliding windows of ``window_words`` words with a stride of half a window, for
      long texts without usable sentence boundaries.
    """

    sentences: int = 2
    min_chars: int = PAPER_MIN_CHARS
    max_chars: int = PAPER_MAX_CHARS
    fallback: str = "none"
    window_words: int = 32

    def __post_init__(self) -> None:
        _check_crop_args(self.sentences, self.min_chars, self.max_chars)
        if self.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {self.fallback!r}")
        if self.window_words < MIN_WORDS_PER_HALF:
            raise ValueError(f"window_words must be >= {MIN_WORDS_PER_HALF}, got {self.window_words}")

    def chunks(self, text: str) -> list[str]:
        """Candidate crops of ``text`` under this rule (distinct, document order)."""
        chunks = crop_chunks(text, self.sentences, self.min_chars, self.max_chars)
        if len(chunks) >= 2 or self.fallback == "none":
            return chunks
        if self.fallback == "halves":
            return _halves(text)
        return _windows(text, self.window_words)

    def sample_pair(self, text: str, rng: random.Random) -> tuple[str, str] | None:
        """Two distinct crops of ``text``, or ``None`` when it has fewer than two."""
        return _pick_two(self.chunks(text), rng)

    def describe(self) -> str:
        """One line for logs and job reports."""
        text = f"{self.sentences} sentence(s) of {self.min_chars}-{self.max_chars} chars"
        if self.fallback == "halves":
            return text + ", else halves"
        if self.fallback == "windows":
            return text + f", else {self.window_words}-word windows"
        return text


PAPER_RULE = CropRule()


def _halves(text: str) -> list[str]:
    sentences = [" ".join(s.split()) for s in _ANY_SENTENCE_END.split(text.strip())]
    sentences = [s for s in sentences if s]
    if len(sentences) >= 2:
        middle = len(sentences) // 2
        parts = [" ".join(sentences[:middle]), " ".join(sentences[middle:])]
    else:
        words = text.split()
        if len(words) < 2 * MIN_WORDS_PER_HALF:
            return []
        middle = len(words) // 2
        parts = [" ".join(words[:middle]), " ".join(words[middle:])]
    return list(dict.fromkeys(parts))


def _windows(text: str, size: int) -> list[str]:
    words = text.split()
    stride = size // 2
    if len(words) < size + stride:  # fewer than two windows
        return []
    starts = range(0, len(words) - size + 1, stride)
    return list(dict.fromkeys(" ".join(words[s : s + size]) for s in starts))


@dataclass
class CropStats:
    """What a pass over a corpus produced: pairs made, documents skipped (fewer than two crops)."""

    documents: int = 0
    pairs: int = 0
    skipped: int = 0
    rule: str = PAPER_RULE.describe()

    @property
    def yield_fraction(self) -> float:
        """Fraction of documents that contributed a pair (0 for an empty corpus)."""
        return self.pairs / self.documents if self.documents else 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return {**asdict(self), "yield": self.yield_fraction}


def crop_pairs(
    corpus: Iterable[str],
    rng: random.Random,
    t: int = 2,
    min_chars: int = PAPER_MIN_CHARS,
    max_chars: int = PAPER_MAX_CHARS,
    rule: CropRule | None = None,
) -> tuple[list[tuple[str, str]], CropStats]:
    """One (anchor, positive) crop pair per document that has two crops, plus the counts.

    ``rule`` overrides ``t``/``min_chars``/``max_chars`` (pass :func:`choose_crop_rule`'s result for a
    real corpus); without it the paper's rule with the given lengths applies.
    """
    rule = rule or CropRule(sentences=t, min_chars=min_chars, max_chars=max_chars)
    stats = CropStats(rule=rule.describe())
    pairs: list[tuple[str, str]] = []
    for text in corpus:
        stats.documents += 1
        pair = rule.sample_pair(text, rng)
        if pair is None:
            stats.skipped += 1
        else:
            pairs.append(pair)
    stats.pairs = len(pairs)
    return pairs, stats


def crop_yield(corpus: Sequence[str], rule: CropRule) -> float:
    """Fraction of ``corpus`` documents with at least two crops under ``rule``."""
    if not corpus:
        return 0.0
    return sum(len(rule.chunks(text)) >= 2 for text in corpus) / len(corpus)


def choose_crop_rule(corpus: Sequence[str], target_yield: float = 0.8, sentences: int = 2) -> CropRule:
    """The least-changed crop rule under which at least ``target_yield`` of ``corpus`` contributes.

    Tried in order: the paper's 100–250-character filter;
    the relaxed 40–250 filter; the relaxed filter with sliding word windows for long documents left
    over; the relaxed filter with halves for the rest. If none reaches the target, the rule with the
    highest yield is returned (ties go to the earlier, more paper-like rule); the caller reports
    :func:`crop_yield` of the result.
    """
    if not 0.0 < target_yield <= 1.0:
        raise ValueError(f"target_yield must be in (0, 1], got {target_yield}")
    candidates = [
        CropRule(sentences=sentences),
        CropRule(sentences=sentences, min_chars=RELAXED_MIN_CHARS),
        CropRule(sentences=sentences, min_chars=RELAXED_MIN_CHARS, fallback="windows"),
        CropRule(sentences=sentences, min_chars=RELAXED_MIN_CHARS, fallback="halves"),  # LOOSEST_RULE at t=2
    ]
    best, best_yield = candidates[0], -1.0
    for rule in candidates:
        value = crop_yield(corpus, rule)
        if value >= target_yield:
            return rule
        if value > best_yield:
            best, best_yield = rule, value
    return best


LOOSEST_RULE = CropRule(min_chars=RELAXED_MIN_CHARS, fallback="halves")  # choose_crop_rule's last resort


def can_crop(text: str) -> bool:
    """True when ``text`` yields two distinct crops under the loosest rule `choose_crop_rule` may pick: two
    sentences (ended by ``. ! ? ;``), or halves of at least ``MIN_WORDS_PER_HALF`` words each."""
    return len(LOOSEST_RULE.chunks(text)) >= 2


@dataclass(frozen=True)
class HeldOut:
    """A hold-out split by index (each list sorted): no text of ``held`` is among ``train``'s, nor held twice."""

    train: list[int]
    held: list[int]


def hold_out(
    texts: Sequence[str],
    fraction: float,
    *,
    seed: int,
    minimum: int = 1,
    maximum: int | None = None,
    eligible: Callable[[str], bool] | None = None,
) -> HeldOut:
    """A seeded random ``fraction`` of the ``eligible`` texts held out, at least ``minimum`` and at most ``maximum``,
    the others to train on: the one hold-out rule of training's validation split and /adapt's evaluation split.

    Disjoint by text, not only by position: a drawn text that recurs among the training texts is not held out (it
    would be scored as unseen after being trained on), nor is a second copy of one held out; the training side keeps
    exactly the texts not drawn, so duplicates change only the held-out side, which may then hold fewer than
    ``minimum``."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    candidates = [i for i in order if eligible is None or eligible(texts[i])]
    count = max(minimum, round(fraction * len(candidates)))
    if maximum is not None:
        count = min(maximum, count)
    drawn = set(candidates[:count])
    train = [i for i in range(len(texts)) if i not in drawn]
    seen = {texts[i] for i in train}
    held = []
    for i in sorted(drawn):
        if texts[i] not in seen:
            seen.add(texts[i])
            held.append(i)
    return HeldOut(train, held)
