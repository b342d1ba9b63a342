"""The import contract of docs/ARCHITECTURE.md, read from the code: a package imports only the packages below it —
never one above, not even inside a function — and the torch-free packages import no torch at all. The check reads
every module's imports with `ast`, so an import hidden in a function counts like one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each package and the project packages it may import (docs/ARCHITECTURE.md, "Floors").
MAY_IMPORT: dict[str, set[str]] = {
    "core": set(),
    "adapt_jobs": {"core"},
    "evaluation": {"core"},
    "training": {"core", "evaluation"},
    "export": {"core", "evaluation", "training"},
    "adapt_worker": {"core", "adapt_jobs", "evaluation", "training", "export"},
    "service": {"core", "adapt_jobs"},
    "embedder": {"core", "adapt_jobs", "evaluation", "training", "export", "adapt_worker", "service"},
}
TORCH_FREE = ("core", "adapt_jobs", "service")
TORCH_STACK = {"torch", "transformers", "sentence_transformers", "optimum"}


def imported_roots(path: Path) -> set[str]:
    """The top-level names a module imports, at any depth of its code (relative imports stay in the package)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_project_package_has_a_floor() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "benchmarks", "tools"}
    assert packages == set(MAY_IMPORT)


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_package_imports_only_the_floors_below_it(package: str) -> None:
    others = set(MAY_IMPORT) - {package}
    wrong = {
        f"{path.relative_to(ROOT)} imports {root}"
        for path in modules(package)
        for root in imported_roots(path) & others - MAY_IMPORT[package]
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("package", TORCH_FREE)
def test_the_torch_free_packages_never_import_torch(package: str) -> None:
    wrong = {
        f"{path.relative_to(ROOT)} imports {root}"
        for path in modules(package)
        for root in imported_roots(path) & TORCH_STACK
    }
    assert not wrong, sorted(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from training.trainer import train\n    import torch.nn\n")
    assert imported_roots(module) == {"training", "torch"}


def test_the_architecture_names_every_module() -> None:
    """docs/ARCHITECTURE.md says what each module is for: a module is named by its path, or — in a folder listed as
    one entry (`evaluation/tasks/`, `training/objectives/`) — by its file name beside that folder."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = []
    for package in MAY_IMPORT:
        for path in modules(package):
            rel = path.relative_to(ROOT)
            if path.name == "__init__.py" or "migrations" in rel.parts:
                continue
            folder_entry = f"`{rel.parent.as_posix()}/`"
            if f"`{rel.as_posix()}`" not in text and not (folder_entry in text and f"`{path.name}`" in text):
                missing.append(rel.as_posix())
    assert not missing, missing
