"""Model names: what `core.registry.validate_name` lets become a folder in the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import registry


@pytest.mark.parametrize("name", ["acme", "a", "acme-2.v1_b", "0x", "a" * 64])
def test_slugs_are_valid_names(name: str) -> None:
    assert registry.validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "acme\n",  # "$" matches before a trailing newline: the name must match whole
        "acme\r\n",
        "\nacme",
        "ac\nme",
        "acme ",
        "\u0430cme",  # Cyrillic a
        "\uff41\uff43\uff4d\uff45",  # fullwidth "acme"
        "acm\u00e9",
        "acme\u200b",  # zero-width space
        "Acme",
        "a" * 65,
        "a..b",
        "current",
        "../acme",
        "",
    ],
)
def test_names_that_are_not_plain_slugs_are_refused(name: str) -> None:
    with pytest.raises(registry.RegistryError, match="invalid model name"):
        registry.validate_name(name)


def test_a_folder_whose_name_ends_in_a_newline_is_not_served(tmp_path: Path) -> None:
    for name in ("acme\n", "acme"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / registry.MANIFEST).write_text("{}")
        (tmp_path / name / registry.CURRENT).symlink_to("1")
    assert list(registry.served_models(tmp_path)) == ["acme"]
