"""The `embedder` command when the reader of its output goes away, as `| head -1` does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["models", "list"], ["--help"]], ids=["a-command", "the-usage"])
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    """Python raises BrokenPipeError on the next write once the reader has gone: no traceback for the user, and
    the exit status a shell gives a command stopped by SIGPIPE."""
    script = f"import sys; from embedder.cli import main; sys.exit(main({argv!r}))"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    with os.fdopen(write_end, "wb") as stdout:
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, stdout=stdout, stderr=subprocess.PIPE,
                              text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141
