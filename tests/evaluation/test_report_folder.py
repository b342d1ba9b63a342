"""The report folder is checked before any scoring: one that exists but cannot take files is refused at once."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from evaluation.validate import prepare_out_dir


def _unwritable_folder(tmp_path: Path) -> Path:
    """An existing folder no file can be created in: a read-only one, or (as root, whom modes do not stop) a
    kernel file system's."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    for folder in (locked, Path("/sys"), Path("/proc/self")):
        try:
            fd, probe = tempfile.mkstemp(dir=folder)
        except OSError:
            return folder
        os.close(fd)
        os.unlink(probe)
    pytest.skip("no folder here refuses new files")


def test_a_folder_that_cannot_take_files_is_refused_before_scoring(tmp_path: Path) -> None:
    folder = _unwritable_folder(tmp_path)
    with pytest.raises(ValueError, match=f"cannot write the report into {folder}"):
        prepare_out_dir(folder, model=None, cache_dir=None)  # type: ignore[arg-type]
    assert prepare_out_dir(tmp_path / "new" / "report", model=None, cache_dir=None).is_dir()  # type: ignore[arg-type]
    assert not [p for p in (tmp_path / "new" / "report").iterdir()]  # the check leaves nothing behind


def test_validate_exits_2_at_once_for_such_a_folder(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from embedder.evaluation_cli import validate_main
    from evaluation import validate as validate_module

    folder = _unwritable_folder(tmp_path)
    monkeypatch.setattr(validate_module, "evaluate_model", lambda *a, **k: pytest.fail("scored before refusing"))
    args = [str(tiny_bert_path), "--tasks", "LeeDocSTS", "--fast", "--quiet", "--no-speed", "--out", str(folder)]
    assert validate_main(args) == 2
    assert "cannot write the report into" in capsys.readouterr().err
