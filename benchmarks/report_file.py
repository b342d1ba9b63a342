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


def cpu_text(cpu: dict[str, Any]) -> str:
    """The CPU a benchmark ran on, as its report prints it: the model and the flags that decide the kernels
    (`core.runtime.cpu_features`)."""
    return f"{cpu['model']} ({', '.join(cpu['flags'])})"
