"""Schemathesis against the app's own OpenAPI schema, over HTTP to a live server with the deterministic fake backend:
no 5xx, and every status, content type, header and body is what the schema documents; schema-invalid requests are
rejected; undeclared methods get 405 with ``Allow``.

The schemathesis command line runs its usual phases (examples, coverage — edge cases and undeclared methods per
operation — and fuzzing) with a fixed seed and ``--max-examples`` so the run takes seconds on 2 cores.

/adapt is fuzzed too: jobs are enabled but no worker is supervised, so a generated corpus that passes every check
is only queued in a temporary store and no training starts; the router's own answers (401/403, 404, 409, 413,
422, 429) are checked against the schema with the rest.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "unsupported_method",
)


@pytest.mark.slow
def test_the_api_conforms_to_its_schema(make_app: Any, serve: Any, tmp_path: Path) -> None:
    app = make_app(include_adapt=True, adapt_enabled=True, adapt_supervise_worker=False, adapt_dir=tmp_path / "adapt")
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "run", "--checks", ",".join(CHECKS),
        "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "14", "--workers", "1",
        "--suppress-health-check", "all", "--no-color",
    ]  # fmt: skip
    with serve(app) as (url, _):
        done = subprocess.run(
            [*command, f"{url}/openapi.json"], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
    assert done.returncode == 0, done.stdout[-20_000:] + done.stderr[-5_000:]
    tested = re.search(r"Selected: (\d+)/(\d+)\s+Tested: (\d+)", done.stdout)
    assert tested, done.stdout[-5_000:]
    selected, total, ran = map(int, tested.groups())
    assert selected == total == ran >= 14, done.stdout[-5_000:]  # every operation, /adapt's included, was fuzzed
