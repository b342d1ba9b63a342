"""The one way a benchmark writes its figures: ``--out FILE`` as indented JSON (parents created)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(path: Path | None, report: Any) -> None:
    """Write ``report`` to ``path`` as indented JSON; nothing when ``path`` is None (no ``--out`` given)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
