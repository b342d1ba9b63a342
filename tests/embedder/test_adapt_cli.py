"""`embedder adapt`'s arguments: a corpus that is not a file is refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedder import adapt_cli


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_corpus_that_is_not_a_file_is_a_usage_error(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "docs.jsonl"
    if kind == "folder":
        corpus.mkdir()
    with pytest.raises(SystemExit) as exit_:
        adapt_cli.parse_args([str(corpus), "--name", "acme"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert str(corpus) in err and ("no such file" if kind == "missing" else "a folder, not a file") in err


def test_a_corpus_file_is_accepted(tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('"a document. Of two sentences."\n')
    args = adapt_cli.parse_args([str(corpus), "--name", "acme"])
    assert args.corpus == corpus and args.name == "acme"
