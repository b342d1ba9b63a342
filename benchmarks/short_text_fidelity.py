"""How closely students follow their teacher on texts of different shapes: per shape, the mean cosine between each
text's student and teacher embedding, and how well the student keeps the teacher's similarities among the texts
(Pearson correlation of the two models' pairwise cosines) — docs/RESULTS.md, "Words from the teacher's own
vocabulary".

Shapes: a seeded draw of the `sct-tiny` recipe's paragraphs (the students' own kind of training text), and the three
shapes of `varied_corpus.vocabulary_texts` made from the teacher's vocabulary — single whole words, words lengthened
by continuation pieces, phrases of two or three words — drawn with another seed than the vocabulary corpus, and
leaving out any text of ``--unseen-by`` (the vocabulary corpus a student trained on).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/short_text_fidelity.py runs/sct-tiny-base/best \
        runs/sct-tiny-300-vocabulary/best --unseen-by runs/vocabulary_corpus.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
from varied_corpus import RECIPE_CORPUS, model_vocabulary, vocabulary_texts

from training.data import load_corpus
from training.encoder import Encoder


def shapes(teacher: str, per_shape: int, seed: int, unseen_by: set[str]) -> dict[str, list[str]]:
    """``per_shape`` texts of each shape (see the module docstring)."""
    made = vocabulary_texts(model_vocabulary(teacher), 8 * per_shape, seed=seed)
    singles, lengthened, phrases = made[: 4 * per_shape], made[4 * per_shape : 6 * per_shape], made[6 * per_shape :]
    paragraphs = random.Random(seed).sample(load_corpus(RECIPE_CORPUS), per_shape)
    made_shapes = {"one word": singles, "a word lengthened by pieces": lengthened, "two or three words": phrases}
    found = {"the recipe's paragraphs": paragraphs}
    found |= {shape: [t for t in texts if t not in unseen_by][:per_shape] for shape, texts in made_shapes.items()}
    for shape, texts in found.items():
        if len(texts) < per_shape:
            raise ValueError(f"only {len(texts)} texts of shape {shape!r} are not in the --unseen-by corpus")
    return found


def fidelity(teacher: np.ndarray, student: np.ndarray) -> tuple[float, float]:
    """(mean cosine of each text's two embeddings, correlation of their pairwise cosines)."""
    teacher, student = (rows / np.linalg.norm(rows, axis=1, keepdims=True) for rows in (teacher, student))
    upper = np.triu_indices(len(teacher), 1)
    pairs = np.corrcoef((teacher @ teacher.T)[upper], (student @ student.T)[upper])[0, 1]
    return float(np.sum(teacher * student, axis=1).mean()), float(pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("students", nargs="+", help="student model folders")
    parser.add_argument("--teacher", default="minilm-l6")
    parser.add_argument("--texts", type=int, default=300, help="texts per shape")
    parser.add_argument("--seed", type=int, default=1, help="the vocabulary corpus of varied_corpus.py uses 0")
    parser.add_argument("--unseen-by", type=Path, default=None, help="JSONL corpus whose texts are left out")
    args = parser.parse_args(argv)
    if not 10 <= args.texts <= 5000:
        parser.error("--texts must be 10-5000")
    unseen_by = set()
    if args.unseen_by is not None:
        with args.unseen_by.open(encoding="utf-8") as lines:
            unseen_by = {json.loads(line)["text"] for line in lines if line.strip()}
    texts = shapes(args.teacher, args.texts, args.seed, unseen_by)
    teacher = Encoder.from_pretrained(args.teacher)
    targets = {shape: teacher.encode(batch, batch_size=64) for shape, batch in texts.items()}
    print("| student | shape | texts | mean cosine to the teacher | pairwise cosines' correlation |")
    print("|---|---|---:|---:|---:|")
    for folder in args.students:
        student = Encoder.from_pretrained(folder)
        for shape, batch in texts.items():
            cosine, pairs = fidelity(targets[shape], student.encode(batch, batch_size=64))
            print(f"| {folder} | {shape} | {len(batch)} | {cosine:.3f} | {pairs:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
