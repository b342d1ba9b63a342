"""What the /adapt end-to-end tests share: a registry serving one tiny bundle (so a service starts without exporting
minilm-l6) and a corpus of 80 Lee background news documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.corpora import lee_background


@pytest.fixture(scope="session")
def base_registry(tmp_path_factory: pytest.TempPathFactory, tiny_bert_path: Path) -> Path:
    """Read-only: each test copies it into its own folder."""
    from export.bundle import export_bundle

    root = tmp_path_factory.mktemp("base-registry")
    export_bundle(tiny_bert_path, root, "tiny-base", promote=True)
    return root


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return list(lee_background()[:80])
