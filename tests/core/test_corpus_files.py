"""The one corpus reader: the same file is the same corpus for `embedder train` and for an /adapt upload."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from core.corpus_files import (
    CorpusFile,
    iter_corpus_file,
    iter_text_documents,
    read_corpus_bytes,
    read_corpus_file,
    split_text_documents,
)
from core.corpus_limits import ReadLimits
from core.text import CorpusError
from tests.parquet_bombs import dictionary_bomb, plain_bomb

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
    lone = r"the text of line 2 of the uploaded JSONL is not valid Unicode: a lone surrogate \(\\ud800\) at character 4"
    with pytest.raises(CorpusError, match=lone):
        read_corpus_bytes(b'"fine"\n{"text": "bad \\ud800 text"}\n', "c.jsonl")
    with pytest.raises(CorpusError, match=r"the label of record 1 of the uploaded JSON is not valid Unicode"):
        read_corpus_bytes(b'[{"text": "fine", "label": "\\udfff"}]', "c.json")
    with pytest.raises(CorpusError, match=r"not UTF-8 text .* re-encode it as UTF-8"):
        read_corpus_bytes("déjà".encode("latin-1"), "c.txt")
    with pytest.raises(CorpusError, match=r"unsupported corpus file type '\.csv'; use \.txt, \.jsonl"):
        read_corpus_bytes(b"text\nx\n", "c.csv")
    with pytest.raises(CorpusError, match="does not exist"):
        read_corpus_file(tmp_path / "missing.jsonl")


# --- Parquet under limits: refused before what breaks them is decoded ---------------------------------------------

LIMITS = ReadLimits(max_documents=20_000, max_document_chars=20_000, max_decoded_bytes=50 * 2**20)


def _parquet(table: object, **options: object) -> bytes:
    pq = pytest.importorskip("pyarrow.parquet")
    out = io.BytesIO()
    pq.write_table(table, out, **options)
    return out.getvalue()


def test_a_dictionary_bomb_is_refused_on_its_first_row() -> None:
    data = dictionary_bomb()  # one 1 MB string on 2,000 rows
    assert len(data) < 1024
    with pytest.raises(CorpusError, match=r"row 1 is 1000000 characters long; the limit is 20000") as err:
        read_corpus_bytes(data, "bomb.parquet", LIMITS)
    assert err.value.code == "document_too_long"


def test_text_past_the_decoded_bytes_limit_is_refused_batch_by_batch() -> None:
    data = dictionary_bomb(value_chars=19_000, rows=3000)  # every row under the character limit: 57 MB decoded
    with pytest.raises(CorpusError, match=r"decodes to at least \d+ bytes of text; the limit is 52428800 bytes") as err:
        read_corpus_bytes(data, "bomb.parquet", LIMITS)
    assert err.value.code == "payload_too_large" and "adapt_max_upload_bytes" in str(err.value)


def test_plain_text_past_the_limit_is_refused_from_the_footer() -> None:
    data = plain_bomb(rows=40, row_chars=2_000_000, random_chars=1000)  # 80 MB of plain text in ~50 KB
    with pytest.raises(CorpusError, match=r"holds \d+ bytes of text; the limit is 52428800 bytes") as err:
        read_corpus_bytes(data, "plain.parquet", LIMITS)
    assert err.value.code == "payload_too_large"


def test_too_many_rows_are_refused_from_the_footer() -> None:
    pa = pytest.importorskip("pyarrow")
    data = _parquet(pa.table({"text": ["a b."] * 30}))
    limits = ReadLimits(max_documents=20, max_document_chars=100, max_decoded_bytes=10_000)
    with pytest.raises(CorpusError, match=r"has 30 rows; the limit is 20 documents \(adapt_max_documents\)") as err:
        read_corpus_bytes(data, "many.parquet", limits)
    assert err.value.code == "too_many_documents"


def test_a_file_within_the_limits_reads_whole() -> None:
    pa = pytest.importorskip("pyarrow")
    texts = [f"document {i}. " + "word " * (i % 50) for i in range(1000)]
    labels = pa.array([str(i % 3) for i in range(1000)]).dictionary_encode()
    data = _parquet(pa.table({"text": texts, "label": labels}), row_group_size=300)
    corpus = read_corpus_bytes(data, "ok.parquet", LIMITS)
    assert corpus.texts == [t.strip() for t in texts] and corpus.labels == [str(i % 3) for i in range(1000)]
    # a document padded past the limit with spaces is measured as it is kept: stripped
    padded = _parquet(pa.table({"text": ["  " * 20_000 + "short. text."]}))
    assert read_corpus_bytes(padded, "padded.parquet", LIMITS).texts == ["short. text."]


def test_json_nested_too_deeply_is_a_corpus_error() -> None:
    deep = b"[" * 15_000
    with pytest.raises(CorpusError, match=r"line 2 of the uploaded JSONL is nested too deeply"):
        read_corpus_bytes(b'"fine"\n' + deep, "c.jsonl")
    with pytest.raises(CorpusError, match=r"the uploaded JSON is nested too deeply"):
        read_corpus_bytes(deep, "c.json")
    with pytest.raises(CorpusError, match=r"the uploaded JSONL is nested too deeply"):  # sniffed: no file name
        read_corpus_bytes(b'"fine"\n' + deep)



# --- the document limit: checked as documents are read, so a long upload is not decoded whole first -----------------

FEW = ReadLimits(max_documents=3, max_document_chars=100, max_decoded_bytes=10_000)
FOUR = {
    "c.txt": b"one.\ntwo.\nthree.\nfour.\n",
    "d.txt": b"one.\n\ntwo.\n\nthree.\n\nfour.",
    "c.jsonl": b'"one."\n"two."\n\n"three."\n{"text": "four."}\n',
    "c.json": b'["one.", "two.", "three.", {"text": "four."}]',
}


@pytest.mark.parametrize("name", sorted(FOUR))
def test_one_document_past_the_limit_is_refused_and_the_limit_itself_is_read(name: str) -> None:
    with pytest.raises(CorpusError, match=r"has more than 3 documents; the limit is 3 \(adapt_max_documents\)") as err:
        read_corpus_bytes(FOUR[name], name, FEW)
    assert err.value.code == "too_many_documents"
    assert err.value.details == {"documents": 4, "max_documents": 3}
    limits = ReadLimits(max_documents=4, max_document_chars=100, max_decoded_bytes=10_000)
    assert read_corpus_bytes(FOUR[name], name, limits).texts == ["one.", "two.", "three.", "four."]
    assert read_corpus_bytes(FOUR[name], name).texts == ["one.", "two.", "three.", "four."]  # no limits: no bound


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("c.jsonl", b'"one."\n"two."\n"three."\n"four."\n{"text": \n' + b'"more."\n' * 1000),
        ("c.json", b'["one.", "two.", "three.", "four.", {"text": ' + b'"more.", ' * 1000),
    ],
)
def test_records_past_the_limit_are_never_parsed(name: str, data: bytes) -> None:
    """What follows the first document past the limit is not read: here it is not even valid JSON."""
    with pytest.raises(CorpusError) as err:
        read_corpus_bytes(data, name, FEW)
    assert err.value.code == "too_many_documents"


def test_text_documents_past_the_limit_are_never_cut_out(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = []

    def counted(content: str):
        for document in iter_text_documents(content):
            taken.append(document)
            yield document

    monkeypatch.setattr("core.corpus_files.iter_text_documents", counted)
    with pytest.raises(CorpusError) as err:
        read_corpus_bytes(b"a line.\n" * 10_000, "c.txt", FEW)
    assert err.value.code == "too_many_documents" and len(taken) == 4


def test_the_lazy_text_split_is_the_list_split() -> None:
    for content in (ARTICLE, "one.\ntwo.\r\nthree.\n", "\n\none.\ntwo.\n\n\n", "a\r\rb\r\n \r\nc", " \n\n ", ""):
        assert list(iter_text_documents(content)) == split_text_documents(content)
    assert split_text_documents("a\r\rb\r\n \r\nc") == ["a", "b", "c"]


def test_jsonl_lines_end_where_str_splitlines_ends_them() -> None:
    data = '"a"\u2028"b"\r\n"c"\r"d"\x85"e"\n\n'.encode()
    assert read_corpus_bytes(data, "c.jsonl").texts == ["a", "b", "c", "d", "e"]
    with pytest.raises(CorpusError, match="line 4 of the uploaded JSONL is not valid JSON"):
        read_corpus_bytes(b'"a"\v"b"\f\x1c{', "c.jsonl")


def test_a_json_array_read_record_by_record_reads_as_json_loads_does() -> None:
    for data in (b"[]", b" [ ] \n", b'[\n "a" ,\n\t{"text": "b"}\n]\n', b'["x", "", {"text": " y "}]'):
        records = json.loads(data)
        expected = [r if isinstance(r, str) else r["text"] for r in records]
        assert read_corpus_bytes(data, "c.json").texts == [t.strip() for t in expected if t.strip()], data
    bad_arrays = {
        b'["a",]': "Expecting value",
        b'["a" "b"]': "Expecting ',' delimiter",
        b"[": "Expecting value",
        b'["a"] ["b"]': "Extra data",
        b'["a"': "Expecting ',' delimiter",
    }
    for bad, why in bad_arrays.items():
        with pytest.raises(CorpusError, match=f"the uploaded JSON is not valid JSON \\({why} at line 1\\)"):
            read_corpus_bytes(bad, "c.json")
    with pytest.raises(CorpusError, match=r"must hold one JSON array"):
        read_corpus_bytes(b'{"text": "a"}', "c.json")


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("a.txt", "\ufeff \n\xa0\nfirst\r\n \t\f\v\r\nsecond\rstill second\n\n\n\xa0 third \x85 \n \n"),
        ("b.txt", " \n\n one\r\ntwo\u2028x\n\v\n"),  # blank lines at the ends only: one document per line
        ("c.jsonl", '{"text": "a", "label": 0}\r\n{"text": "b\\u2028c", "label": 1}\x85\n\r'
                    '{"text": " d ", "label": "x"}\u2029'),
        ("d", '{"text": "no suffix"}\n"read as JSONL"\n'),
    ],
)
def test_a_file_read_one_document_at_a_time_is_the_file_read_whole(tmp_path: Path, name: str, content: str) -> None:
    """`iter_corpus_file` streams the file (training samples a corpus of any size with it) and gives what reading
    its bytes gives, line ends of every kind included."""
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8"))
    whole = read_corpus_bytes(content.encode("utf-8"), name)
    assert list(iter_corpus_file(path)) == read_corpus_file(path).texts == whole.texts
    assert read_corpus_file(path).labels == whole.labels
