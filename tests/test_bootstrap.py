"""scripts/bootstrap.sh, the set-up both README commands run first."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_another_python_is_refused_before_a_venv_or_any_install(tmp_path: Path) -> None:
    """pip finds no local torch wheel for another Python and would pull a multi-GB CUDA build before it read that
    the project needs 3.11."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    python = tmp_path / "python3.12"
    python.write_text("#!/bin/sh\necho 3.12\n")
    python.chmod(0o755)
    result = subprocess.run(
        ["bash", "scripts/bootstrap.sh"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"needs Python 3.11; {python} is 3.12" in result.stderr
    assert "PYTHON=python3.11" in result.stderr
    assert not (tmp_path / ".venv").exists()
