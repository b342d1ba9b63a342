"""The one corpus reader: the same file is the same corpus for `embedder train` and for an /adapt upload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.corpus_files import CorpusFile, read_corpus_bytes, read_corpus_file, split_text_documents
from core.text import CorpusError

ARTICLE = "First paragraph, line one.\nStill the first paragraph.\n\n  \nSecond paragraph.\n\nThird."


def test_txt_documents_are_blank_line_blocks() -> None:
    assert split_text_documents(ARTICLE) == [
        "First paragraph, line one.\nStill the first paragraph.",
        "Second paragraph.",
        "Third.",
    ]


def test_txt_without_a_blank_line_between_texts_is_one_document_per_line() -> None:
    assert split_text_documents("one.\ntwo.\r\nthree.\n") == ["one.", "two.", "three."]
    assert split_text_documents("\n\none.\ntwo.\n\n\n") == ["one.", "two."]  # blank lines at the ends separate nothing
    assert split_text_documents("only one line") == ["only one line"]
    assert split_text_documents(" \n\n ") == []


def test_a_path_and_its_upload_read_the_same(tmp_path: Path) -> None:
    files = {
        "a.txt": ARTICLE.encode(),
        "b.txt": b"one per line.\nsecond line.\n",
        "c.jsonl": b'{"text": "x. y.", "label": 1}\n\n{"text": "z.", "label": "b"}\n',
        "d.ndjson": b'"plain string record"\n"another"\n',
        "e.json": json.dumps([{"text": "j1"}, "j2"]).encode(),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        assert read_corpus_file(tmp_path / name) == read_corpus_bytes(data, name), name
    assert read_corpus_file(tmp_path / "c.jsonl") == CorpusFile(["x. y.", "z."], ["1", "b"])
    assert read_corpus_file(tmp_path / "e.json") == CorpusFile(["j1", "j2"], None)


def test_an_upload_without_a_file_name_is_sniffed() -> None:
    assert read_corpus_bytes(b'{"text": "a"}\n{"text": "b"}\n') == CorpusFile(["a", "b"], None)
    assert read_corpus_bytes(b"\xef\xbb\xbfDoc one.\n\nDoc two.") == CorpusFile(["Doc one.", "Doc two."], None)


def test_parquet_text_and_label_columns(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["p one", " ", "p two"], "label": ["a", "b", "c"]}), tmp_path / "c.parquet")
    assert read_corpus_file(tmp_path / "c.parquet") == CorpusFile(["p one", "p two"], ["a", "c"])
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(CorpusError, match=r"no 'text' column \(found \['body'\]\)"):
        read_corpus_file(tmp_path / "bad.parquet")


def test_a_folder_holds_one_document_per_txt_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("second file.\n\nstill the second file.")
    (tmp_path / "sub" / "a.txt").write_text("nested file.")
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "notes.md").write_text("ignored")
    assert read_corpus_file(tmp_path).texts == ["second file.\n\nstill the second file.", "nested file."]
    (tmp_path / "none").mkdir()
    with pytest.raises(CorpusError, match=r"holds no .txt files: put one document per .txt file"):
        read_corpus_file(tmp_path / "none")


def test_errors_name_the_line_and_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="line 3 of the uploaded JSONL is not valid JSON"):
        read_corpus_bytes(b'{"text": "ok"}\n\n{"text": \n', "c.jsonl")
    (tmp_path / "d.jsonl").write_text('"fine"\n{"body": "x"}\n')
    expected = r"line 2 of .*d\.jsonl must be a string or an object with a \"text\" string, got an object with keys"
    with pytest.raises(CorpusError, match=expected):
        read_corpus_file(tmp_path / "d.jsonl")
    with pytest.raises(CorpusError, match=r"record 2 of the uploaded JSON must be a string .* got int"):
        read_corpus_bytes(b'["a", 3]', "c.json")
    with pytest.raises(CorpusError, match=r"one record per line must be named .jsonl"):
        read_corpus_bytes(b'{"text": "a"}\n{"text": "b"}\n', "c.json")
    with pytest.raises(CorpusError, match="1 of 2 JSONL records have a label: give every record a label, or none"):
        read_corpus_bytes(b'{"text": "a", "label": 1}\n{"text": "b"}\n', "c.jsonl")
    with pytest.raises(CorpusError, match=r"not UTF-8 text .* re-encode it as UTF-8"):
        read_corpus_bytes("déjà".encode("latin-1"), "c.txt")
    with pytest.raises(CorpusError, match=r"unsupported corpus file type '\.csv'; use \.txt, \.jsonl"):
        read_corpus_bytes(b"text\nx\n", "c.csv")
    with pytest.raises(CorpusError, match="does not exist"):
        read_corpus_file(tmp_path / "missing.jsonl")
