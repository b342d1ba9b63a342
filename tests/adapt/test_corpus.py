"""Corpus intake: upload parsing, limits, and the crop-yield check that decides the 422."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapt_jobs.corpus import check_corpus, parse_upload, read_job_corpus
from adapt_jobs.settings import AdaptSettings
from core.text import CorpusError, can_crop

TWO_SENTENCES = "Crops are cut from documents. Two sentences make one view."
ONE_SHORT = "A single short sentence"


def _limits(**values: int) -> AdaptSettings:
    return AdaptSettings.model_construct(**values)  # unvalidated: limits far below what a deployment may set


def test_can_crop_needs_two_sentences_or_enough_words_for_halves() -> None:
    assert can_crop(TWO_SENTENCES)
    assert not can_crop(ONE_SHORT)
    assert can_crop(" ".join(f"w{i}" for i in range(16)))  # halves of 8 words each
    assert not can_crop(" ".join(f"w{i}" for i in range(15)))
    assert not can_crop(" ".join(["word"] * 16))  # two identical halves are no pair: training could not use it


def test_too_few_usable_documents_says_how_many_and_what_is_needed() -> None:
    texts = [TWO_SENTENCES] * 3 + [ONE_SHORT] * 5
    with pytest.raises(CorpusError, match="found 3 usable documents out of 8; adaptation needs at least 4") as info:
        check_corpus(texts, None, _limits(min_documents=4))
    assert info.value.code == "corpus_too_small"
    assert info.value.details == {"documents": 8, "usable_documents": 3, "min_documents": 4}


def test_limits_on_count_length_and_labels() -> None:
    with pytest.raises(CorpusError, match="3 documents; the limit is 2"):
        check_corpus([TWO_SENTENCES] * 3, None, _limits(max_documents=2, min_documents=1))
    with pytest.raises(CorpusError, match=r"1 documents are longer than 20 characters \(first: index 1"):
        check_corpus(["short. ok.", TWO_SENTENCES], None, _limits(max_document_chars=20, min_documents=1))
    with pytest.raises(CorpusError, match="got 1 labels for 2 texts"):
        check_corpus([TWO_SENTENCES] * 2, ["a"], _limits(min_documents=1))
    # a JSON body's \ud800 escape decodes to a lone surrogate: refused at intake, not by the worker's tokenizer
    with pytest.raises(CorpusError, match=r"texts\[1\] is not valid Unicode: a lone surrogate \(\\udc00\)"):
        check_corpus([TWO_SENTENCES, TWO_SENTENCES + " \udc00"], None, _limits(min_documents=1))
    with pytest.raises(CorpusError, match=r"labels\[0\] is not valid Unicode"):
        check_corpus([TWO_SENTENCES] * 2, ["\ud800", "b"], _limits(min_documents=1))


def test_empty_documents_are_dropped_with_their_labels(tmp_path: Path) -> None:
    corpus = check_corpus([TWO_SENTENCES, "  ", TWO_SENTENCES + " More."], ["x", "y", "z"], _limits(min_documents=2))
    assert corpus.labels == ["x", "z"] and corpus.usable == 2
    corpus.save(tmp_path)
    texts, labels = read_job_corpus(tmp_path)
    assert texts == corpus.texts and labels == ["x", "z"]


def test_a_saved_corpus_is_readable_by_the_service_user_alone(tmp_path: Path) -> None:
    import os
    import stat

    previous = os.umask(0o022)  # the usual umask: files readable by every local user
    try:
        check_corpus([TWO_SENTENCES] * 2, None, _limits(min_documents=1)).save(tmp_path / "job")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "job" / "corpus.jsonl").stat().st_mode) == 0o600


def test_parse_jsonl_objects_strings_and_plain_text() -> None:
    data = "\n".join(json.dumps(r) for r in [{"text": "a. b.", "label": 1}, {"text": "c. d.", "label": "x"}])
    assert parse_upload(data.encode()) == (["a. b.", "c. d."], ["1", "x"])
    assert parse_upload(b'"one. two."\n\n"three. four."\n') == (["one. two.", "three. four."], None)
    assert parse_upload(b"First doc. Line two.\n\nSecond doc.\nmore\n", "corpus.txt") == (
        ["First doc. Line two.", "Second doc.\nmore"],
        None,
    )


def test_parse_errors_name_the_line_and_the_fix() -> None:
    with pytest.raises(CorpusError, match="line 2 of the uploaded JSONL is not valid JSON"):
        parse_upload(b'{"text": "ok"}\n{"text": \n')
    with pytest.raises(CorpusError, match='line 1 of the uploaded JSONL must be a string or an object with a "text"'):
        parse_upload(b'{"body": "x"}\n')
    with pytest.raises(CorpusError, match="1 of 2 JSONL records have a label"):
        parse_upload(b'{"text": "a", "label": 1}\n{"text": "b"}\n')
    with pytest.raises(CorpusError, match="not UTF-8"):
        parse_upload(b"\xff\xfe\x00bad")
