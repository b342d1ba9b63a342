"""`embedder export --help` names the registry the command writes to when neither --registry nor the environment
says otherwise."""

from __future__ import annotations

import pytest

from core.settings import Settings
from export import cli


def test_registry_help_shows_the_default_the_command_uses(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    default = Settings.model_fields["registry_dir"].default
    assert f"default: EMBED_REGISTRY_DIR, else {default})" in help_text
    assert "./registry" not in help_text
