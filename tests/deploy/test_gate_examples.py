"""The `gate.extraArgs` examples in the chart's values.yaml name tasks `embedder validate` knows: an unknown task
makes the gate exit 2 and fail the release."""

from __future__ import annotations

import json
import re

from evaluation.tasks import resolve_task


def _extra_args_examples(values_text: str) -> list[list[str]]:
    """The JSON lists in the comment just above the gate's ``extraArgs:``."""
    lines = values_text.splitlines()
    gate = lines.index("gate:")
    at = next(i for i, line in enumerate(lines) if i > gate and line.strip().startswith("extraArgs:"))
    comment = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        comment.insert(0, line.strip().lstrip("#"))
    return [json.loads(found) for found in re.findall(r"\[[^\]]*\]", " ".join(comment))]


def _task_names(args: list[str]) -> list[str]:
    """The values of every ``--tasks`` in ``args`` (each runs to the next flag)."""
    names, taking = [], False
    for arg in args:
        if arg.startswith("--"):
            taking = arg == "--tasks"
        elif taking:
            names.append(arg)
    return names


def test_gate_extra_args_examples_name_known_tasks(deploy) -> None:
    examples = _extra_args_examples((deploy.chart / "values.yaml").read_text())
    names = [name for example in examples for name in _task_names(example)]
    assert names, f"no --tasks example found in {examples}"
    for name in names:
        resolve_task(name)  # ValueError naming the known tasks when `embedder validate --tasks` would refuse it
