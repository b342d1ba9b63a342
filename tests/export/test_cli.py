"""`embedder export` and the default bundle, as the service and `embedder models prepare` use them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import registry
from core.runtime import OnnxBundle
from embedder import models_cli as catalog_cli
from embedder.cli import main as embedder_main
from export import bundle as exporter

REPO = Path(__file__).resolve().parents[2]


def test_cli_exports_truncated_bundle(tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["export", str(tiny_bert_path), "--layers", "2", "--name", "tiny", "--registry", str(tmp_path)]
    assert embedder_main([*argv, "--promote"]) == 0
    out = capsys.readouterr().out
    bundle = tmp_path / "tiny" / "1"
    assert out.splitlines()[0] == str(bundle)
    assert "parity fp32: min cosine 1.0000" in out and "2/4 layers" in out and "(promoted)" in out
    assert registry.current_bundle(tmp_path, "tiny") == bundle
    assert OnnxBundle(bundle).encode(["hello"]).shape == (1, 32)
    assert "prompts" not in out


def test_cli_says_when_a_version_published_meanwhile_stays_current(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--promote` leaves a newer version of the name, promoted by another process meanwhile, current: the command
    must not print "(promoted)" for a version that is not served."""
    argv = ["export", str(tiny_bert_path), "--layers", "2", "--name", "tiny", "--registry", str(tmp_path)]
    assert embedder_main([*argv, "--promote"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(registry, "promote", lambda root, name, version: False)  # another process's is newer
    assert embedder_main([*argv, "--promote"]) == 0
    out = capsys.readouterr().out
    assert "tiny version 2 (not promoted: version 1, published meanwhile, stays current)" in out
    assert "(promoted)" not in out and registry.current_version(tmp_path, "tiny") == "1"


def test_cli_names_the_prompts_a_bundle_keeps(tiny_bert_path: Path, tmp_path: Path, capsys) -> None:
    import json
    import shutil

    folder = shutil.copytree(tiny_bert_path, tmp_path / "e5-like")
    prompts = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    assert embedder_main(["export", str(folder), "--name", "e5-like", "--registry", str(tmp_path / "reg")]) == 0
    assert "prompts (prompt_name): passage, query; default prompt: none" in capsys.readouterr().out


def test_cli_default_registry_and_clear_errors(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("EMBED_REGISTRY_DIR", str(tmp_path / "from-env"))
    assert embedder_main(["export", str(tiny_bert_path), "--name", "tiny", "--layers", "7"]) == 1
    assert "embedder export: layers must be an integer between 1 and 4" in capsys.readouterr().err
    assert embedder_main(["export", str(tmp_path / "missing"), "--name", "tiny"]) == 1
    assert "is neither a built-in model nor an existing model folder" in capsys.readouterr().err
    assert not (tmp_path / "from-env").exists()
    assert embedder_main(["export", str(tiny_bert_path), "--name", "tiny", "--quantize", "int8"]) == 0
    assert registry.read_manifest(tmp_path / "from-env" / "tiny" / "1")["serve_variant"] == "int8"


def test_service_spawn_command_then_default_bundle_is_reused(tmp_path: Path, minilm_l6_path: Path) -> None:
    """The exact command the service spawns on an empty registry; then prepare finds the bundle."""
    command = [sys.executable, "-m", "embedder.cli", "export", "minilm-l6", "--name", "minilm-l6"]
    command += ["--registry", str(tmp_path), "--promote"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EMBED_REGISTRY_DIR": str(tmp_path), "EMBED_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "minilm-l6" / "1"
    assert done.stdout.splitlines()[0] == str(bundle)
    manifest = registry.read_manifest(bundle)
    assert (manifest["base_model"], manifest["layers"], manifest["dim"]) == ("minilm-l6", 6, 384)
    assert manifest["parity"]["fp32"]["min_cosine"] >= 0.9999
    assert exporter.ensure_default_bundle(tmp_path) == bundle  # already served: no second export
    assert registry.list_versions(tmp_path, "minilm-l6") == ["1"]


def test_models_prepare_creates_default_bundle_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tiny_bert_path: Path
) -> None:
    """`embedder models prepare minilm-l6` exports the default bundle only when none is served
    (a tiny model stands in for minilm-l6 so the test stays fast)."""
    calls = []
    real_export = exporter.export_bundle

    def recording_export(model: str, root: Path, name: str, **kwargs: object) -> Path:
        calls.append((model, name, kwargs))
        return real_export(tiny_bert_path, root, name, **kwargs)

    monkeypatch.setattr(exporter, "export_bundle", recording_export)
    monkeypatch.setenv("EMBED_REGISTRY_DIR", str(tmp_path))
    assert catalog_cli.main(["prepare", "minilm-l6"]) == 0
    assert catalog_cli.main(["prepare", "minilm-l6"]) == 0
    assert calls == [("minilm-l6", "minilm-l6", {"quantize": "auto", "promote": True})]  # both graphs
    assert f"default bundle: {tmp_path / 'minilm-l6' / '1'}" in capsys.readouterr().out
    assert catalog_cli.main(["prepare", "minilm-l6", "--no-default-bundle"]) == 0
    assert registry.list_versions(tmp_path, "minilm-l6") == ["1"]
