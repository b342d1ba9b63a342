"""Settings: environment parsing, limit checks with messages that say what to fix, and `embedder serve --help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.cli import export_command, settings_from_args
from service.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]


def test_environment_lists_and_secrets(monkeypatch):
    monkeypatch.setenv("EMBED_MODELS", "a, b")
    monkeypatch.setenv("EMBED_API_KEYS", "k1,k2")
    monkeypatch.setenv("EMBED_PORT", "9000")
    settings = ServiceSettings()
    assert settings.models == ["a", "b"] and settings.port == 9000
    assert settings.api_key_values() == ["k1", "k2"]
    assert settings.admin_key_values() == []  # no fallback to the client keys
    assert settings.adapt.allow_client_keys is False  # so /adapt refuses client keys unless the operator opts in
    assert "k1" not in repr(settings) and "k1" not in str(settings.model_dump())


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("EMBED_MAX_BATCH_TOKENS", "1000")
    settings = settings_from_args(["--max-batch-tokens", "2048", "--no-warmup", "--models", "x,y"])
    assert settings.max_batch_tokens == 2048 and settings.warmup is False and settings.models == ["x", "y"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_batch_size": 64, "max_batch_tokens": 32}, "raise max_batch_tokens or lower max_batch_size"),
        ({"max_client_batch_size": 100, "max_queue_size": 10}, "could never be queued; raise max_queue_size"),
        ({"log_level": "loud"}, "log_level"),
        ({"port": 70000}, "port"),
    ],
)
def test_bad_limits_say_what_to_fix(overrides, message):
    with pytest.raises(ValidationError, match=message):
        ServiceSettings(**overrides)


def test_serve_help_documents_every_setting():
    result = subprocess.run(
        [sys.executable, "-m", "embedder.cli", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for name, field in ServiceSettings.model_fields.items():
        assert f"--{name.replace('_', '-')}" in text
        assert f"EMBED_{name.upper()}" in text
        assert field.description and len(field.description) > 20, name


def test_default_bundle_is_made_by_the_export_subprocess(tmp_path, monkeypatch):
    from service import cli

    settings = ServiceSettings(registry_dir=tmp_path / "reg")
    assert export_command(settings) == [
        sys.executable, "-m", "embedder.cli", "export", "minilm-l6", "--name", "minilm-l6",
        "--registry", str((tmp_path / "reg").absolute()), "--promote", "--quantize", "auto",
    ]  # fmt: skip
    calls = []

    def fake_run(command, **kwargs):
        calls.append(command)
        return subprocess.CompletedProcess(command, 3)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    with pytest.raises(RuntimeError, match="creating the default bundle failed \\(exit 3\\); run it yourself"):
        cli.ensure_default_bundle(settings)
    assert calls == [export_command(settings)]
