"""`max_documents` of a corpus file: the same seeded sample a list of the whole corpus gives, read without holding
the file."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import pytest

from core.corpus_files import read_corpus_file
from training.data import load_corpus


def _listed_sample(path: Path, max_documents: int, seed: int) -> list[str]:
    """What `load_corpus` kept when it read the whole file into a list first (every published run's selection)."""
    documents = [d for d in read_corpus_file(path).texts if d.strip()]
    if len(documents) <= max_documents:
        return documents
    return [documents[i] for i in sorted(random.Random(seed).sample(range(len(documents)), max_documents))]


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".json"])
def test_a_sampled_file_keeps_the_documents_a_list_of_it_kept(tmp_path: Path, suffix: str) -> None:
    texts = [f"document {i}" + " word" * (i % 13) for i in range(500)]
    path = tmp_path / f"corpus{suffix}"
    if suffix == ".txt":
        path.write_text("\n\n".join(texts))
    elif suffix == ".jsonl":
        path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    else:
        path.write_text(json.dumps(texts))
    for max_documents, seed in [(1, 0), (7, 3), (60, 1), (499, 2), (500, 0), (900, 0)]:  # both of sample()'s methods
        assert load_corpus(path, max_documents=max_documents, seed=seed) == _listed_sample(path, max_documents, seed)
    assert load_corpus(path) == texts


def test_a_sample_of_a_large_file_is_read_without_holding_the_file(tmp_path: Path) -> None:
    path = tmp_path / "large.txt"
    path.write_text("\n\n".join(f"paragraph {i}: " + "some words of text " * 20 for i in range(20_000)))  # 8 MB
    tracemalloc.start()
    try:
        sample = load_corpus(path, max_documents=50, seed=0)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sample) == 50 and sample == _listed_sample(path, 50, 0)
    assert peak < 2_000_000, f"{peak} bytes held at once for a sample of 50 from an 8 MB file"
