"""`embedder registry list|promote|prune`, run as the command a user types: text for people, --json for scripts,
exit 0 on success, 1 when the registry refuses (with why on stderr), 2 for a command line argparse refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from core import registry
from tests.core.test_registry_manage import publish

ROOT = Path(__file__).resolve().parents[2]


def embedder(*args: str, registry_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBED_")}
    env["EMBED_REGISTRY_DIR"] = str(registry_dir)
    return subprocess.run([sys.executable, "-m", "embedder.cli", "registry", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_list_rollback_and_prune_from_the_command_line(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    root.mkdir()
    for _ in range(3):
        publish(root, "acme", age_s=3600, created_at="2026-12-01T10:00:00+00:00", base_model="minilm-l6",
                method={"name": "adapt"}, quantization="int8")  # fmt: skip
    publish(root, "other")

    listed = embedder("list", registry_dir=root)  # the registry from EMBED_REGISTRY_DIR
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[:3] for line in listed.stdout.splitlines()[1:4]] == [
        ["NAME", "CURRENT", "VERSIONS"], ["acme", "3", "1-3"], ["other", "1", "1"]]  # fmt: skip
    detail = embedder("list", "acme", "--json", "--registry", str(root), registry_dir=tmp_path / "elsewhere")
    (model,) = json.loads(detail.stdout)["models"]
    assert model["current"] == "3" and [v["version"] for v in model["versions"]] == ["1", "2", "3"]
    assert model["versions"][0]["base_model"] == "minilm-l6" and model["versions"][0]["method"] == "adapt"

    rolled = embedder("promote", "acme", "1", registry_dir=root)
    assert rolled.returncode == 0, rolled.stderr
    assert "acme: version 1 is current (rolled back from version 3)" in rolled.stdout
    assert registry.current_version(root, "acme") == "1"
    again = embedder("promote", "acme", "1", "--json", registry_dir=root)
    assert json.loads(again.stdout) == {"name": "acme", "version": "1", "previous": "1", "changed": False}
    missing = embedder("promote", "acme", "9", registry_dir=root)
    assert missing.returncode == 1 and missing.stdout == ""
    assert "embedder registry promote: acme has no version '9' (versions: 1, 2, 3)" in missing.stderr

    dry = embedder("prune", "acme", "--keep", "1", "--dry-run", "--json", registry_dir=root)
    assert json.loads(dry.stdout)["removed"] == ["2"] and registry.list_versions(root, "acme") == ["1", "2", "3"]
    pruned = embedder("prune", "acme", "--keep", "1", registry_dir=root)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("acme: removed version 2 (")
    assert "kept 3: among the newest 1" in pruned.stdout and "kept 1: current" in pruned.stdout
    assert registry.list_versions(root, "acme") == ["1", "3"]

    none = embedder("prune", "acme", "--keep", "0", registry_dir=root)
    assert none.returncode == 1 and "keep must be at least 1" in none.stderr
    unknown = embedder("list", "nope", registry_dir=root)
    assert unknown.returncode == 1 and "no model 'nope'" in unknown.stderr and "models: acme, other" in unknown.stderr
    assert embedder("prune", "acme", registry_dir=root).returncode == 2  # --keep is required
