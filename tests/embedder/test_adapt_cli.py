"""`embedder adapt`: a corpus that is not a readable file is refused in one line; how a job's progress is shown."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Events:
    """What `GET /adapt/{id}/events` streams: a few state and progress events, then the final job."""

    def __init__(self, events: list[tuple[str, dict]]) -> None:
        self.events = events

    def stream(self, method: str, url: str, timeout: float | None = None) -> contextlib.AbstractContextManager:
        lines = [part for kind, data in self.events for part in (f"event: {kind}", f"data: {json.dumps(data)}", "")]
        return contextlib.nullcontext(SimpleNamespace(iter_lines=lambda: iter(lines)))


EVENTS = [
    ("state", {"state": "running"}),
    *[("progress", {"stage": "training", "step": i, "total": 3}) for i in (1, 2, 3)],
    ("progress", {"stage": "evaluating"}),
    ("done", {"id": "adaptjob-x", "state": "succeeded", "name": "acme"}),
]


@pytest.mark.parametrize("terminal", [True, False])
def test_training_steps_rewrite_one_line_on_a_terminal_only(terminal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert adapt_cli.follow(_Events(EVENTS), "adaptjob-x", "acme") == EVENTS[-1][1]
    out = err.getvalue()
    if terminal:  # one line for the three steps, each step overwriting the last; every other line on its own
        assert out == (
            "[acme] running\n[acme] training 1/3\r\033[K[acme] training 2/3\r\033[K[acme] training 3/3\n"
            "[acme] evaluating\n"
        )
    else:
        assert out.splitlines() == [
            "[acme] running", "[acme] training 1/3", "[acme] training 2/3", "[acme] training 3/3", "[acme] evaluating"
        ]  # fmt: skip


def _unreadable(self: Path, *args: object, **kwargs: object) -> None:
    raise PermissionError(13, "Permission denied", str(self))


def test_an_unreadable_corpus_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('"a document."\n')
    monkeypatch.setattr(Path, "open", _unreadable)  # chmod 000 does not stop root from reading
    with pytest.raises(SystemExit) as exit_:
        adapt_cli.parse_args([str(corpus), "--name", "acme"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"embedder adapt: error: cannot read {corpus}: Permission denied"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads a chmod 000 file")
def test_a_chmod_000_corpus_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('"a document."\n')
    corpus.chmod(0)
    with pytest.raises(SystemExit) as exit_:
        adapt_cli.parse_args([str(corpus), "--name", "acme"])
    assert exit_.value.code == 2
    assert f"cannot read {corpus}: Permission denied" in capsys.readouterr().err


def _upload(tmp_path: Path) -> tuple[Path, argparse.Namespace]:
    """A one-document corpus and the arguments that upload it."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('"a document."\n')
    return corpus, adapt_cli.parse_args([str(corpus), "--name", "acme"])


def test_a_corpus_that_becomes_unreadable_before_the_upload_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus, args = _upload(tmp_path)
    monkeypatch.setattr(Path, "open", _unreadable)
    assert adapt_cli.run(SimpleNamespace(), args) == 2
    assert capsys.readouterr().err == f"embedder adapt: cannot read {corpus}: Permission denied\n"


JOB = {"id": "adaptjob-0123456789abcdef01234567", "state": "running", "name": "acme", "after_job": None}


class _Interrupted:
    """A server that has the job; Ctrl-C arrives while its events are followed."""

    base_url = "http://adapt.example:8080"

    def get(self, url: str) -> SimpleNamespace:
        return SimpleNamespace(status_code=200, json=lambda: dict(JOB), text=json.dumps(JOB))

    def stream(self, method: str, url: str, timeout: float | None = None) -> contextlib.AbstractContextManager:
        raise KeyboardInterrupt


def test_ctrl_c_while_following_says_the_job_keeps_running_and_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("EMBED_URL", raising=False)
    args = adapt_cli.parse_args(["--job", JOB["id"], "--url", "http://adapt.example:8080"])
    assert adapt_cli.run(_Interrupted(), args) == 130
    assert capsys.readouterr().err == (
        f"embedder adapt: stopped following; job {JOB['id']} keeps running on the server "
        f"(follow it again: embedder adapt --job {JOB['id']} --url http://adapt.example:8080)\n"
    )


def test_ctrl_c_names_no_url_when_it_is_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EMBED_URL", "http://adapt.example:8080")
    assert adapt_cli.run(_Interrupted(), adapt_cli.parse_args(["--job", JOB["id"]])) == 130
    assert capsys.readouterr().err.endswith(f"(follow it again: embedder adapt --job {JOB['id']})\n")


def test_ctrl_c_during_the_upload_exits_130_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, args = _upload(tmp_path)

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    assert adapt_cli.run(SimpleNamespace(post=interrupted), args) == 130
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("embedder adapt: interrupted before the server answered")


def test_the_job_id_form_is_the_servers() -> None:
    from adapt_jobs.jobs import new_job_id

    assert adapt_cli.JOB_ID.fullmatch(new_job_id())


@pytest.mark.parametrize("job_id", ["../health", "", "adaptjob-0123", "adaptjob-0123456789abcdef01234567/cancel"])
def test_a_job_id_of_another_form_is_a_usage_error(job_id: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        adapt_cli.parse_args(["--job", job_id])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"embedder adapt: error: --job {job_id!r}: not a job id (adaptjob- and 24 hex digits)"
    )


@pytest.mark.parametrize("url", ["http://[::1", "ftp://adapt.example", "adapt.example:8080", ""])
def test_a_url_that_is_not_a_server_address_is_a_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        adapt_cli.parse_args(["--job", JOB["id"], "--url", url])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"embedder adapt: error: --url {url}: ")


def test_job_ids_are_quoted_in_the_path() -> None:
    assert adapt_cli._path("a/b c", "/events") == "/adapt/a%2Fb%20c/events"


class _Answers:
    """A server whose `GET /adapt/{id}` answers ``body`` with status 200."""

    base_url = "http://adapt.example:8080"

    def __init__(self, body: str) -> None:
        self.body = body

    def get(self, url: str) -> httpx.Response:
        return httpx.Response(200, text=self.body)


@pytest.mark.parametrize("body", ['{"status": "ok"}', "<html>a proxy page</html>", "", '["adaptjob-x"]'])
def test_an_answer_that_is_not_a_job_is_one_line(body: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert adapt_cli.run(_Answers(body), adapt_cli.parse_args(["--job", JOB["id"]])) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        "embedder adapt: the server answered 200 with something other than a job: " + (body or "(an empty body)")
    )


def test_a_done_event_that_is_not_a_job_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    class Server(_Answers):
        def stream(self, method: str, url: str, timeout: float | None = None) -> contextlib.AbstractContextManager:
            return _Events([("done", {"detail": "gone"})]).stream(method, url, timeout)

    assert adapt_cli.run(Server(json.dumps(JOB)), adapt_cli.parse_args(["--job", JOB["id"]])) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"embedder adapt: the server ended the events of {JOB['id']} with something other than a job: "
        '{"detail": "gone"}'
    )


def test_help_lists_the_exit_codes_docs_adapt_documents(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        adapt_cli.parse_args(["--help"])
    help_text = capsys.readouterr().out
    codes = dict(
        line.split(maxsplit=1) for line in help_text.split("exit codes:\n", 1)[1].splitlines() if line.strip()
    )
    assert list(codes) == ["0", "1", "2", "3", "4", "130"]
    assert "bad arguments" in codes["2"] and "gate" in codes["3"] and "keeps running" in codes["130"]
    assert "embedder adapt --job adaptjob-" in help_text  # the examples, kept as written
    doc = (Path(__file__).resolve().parents[2] / "docs" / "ADAPT.md").read_text()
    terminal = " ".join(doc.split("From a terminal, `embedder adapt", 1)[1].split("\n\n", 1)[0].split())
    for documented in ("exit 0 when", "3 when the gate", "4 when its gate passed", "1 on failure", "2 on bad arguments",
                       "130 on Ctrl-C"):
        assert documented in terminal


@pytest.mark.parametrize(
    "gate,promote,code",
    [({"passed": True}, None, 4), ({"passed": False, "reasons": ["in-domain fell"]}, None, 3),
     ({"passed": True}, "never", 0)],
)
def test_a_model_another_jobs_newer_version_overtook_is_not_blamed_on_the_gate(
    gate: dict, promote: str | None, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job whose gate passed, but whose version stayed behind a newer one promoted meanwhile, exits 4 and says
    so; a gate that kept the model back exits 3."""
    done = {**JOB, "state": "succeeded", "gate": gate, "model": {"name": "acme", "version": "3", "promoted": False}}

    class Server(_Answers):
        def stream(self, method: str, url: str, timeout: float | None = None) -> contextlib.AbstractContextManager:
            return _Events([("done", done)]).stream(method, url, timeout)

    argv = ["--job", JOB["id"]] + (["--promote", promote] if promote else [])
    assert adapt_cli.run(Server(json.dumps(JOB)), adapt_cli.parse_args(argv)) == code
    err = capsys.readouterr().err
    assert ("a newer version of acme was promoted meanwhile and stays served" in err) == (code == 4)
