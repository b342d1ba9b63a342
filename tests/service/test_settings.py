"""Settings: environment parsing, limit checks with messages that say what to fix, and `embedder serve --help`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from service.cli import export_command, settings_from_args
from service.settings import ServiceSettings
from tests.service.conftest import make_fake_bundle

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
        return 3

    monkeypatch.setattr(cli, "run_export", fake_run)
    with pytest.raises(RuntimeError, match="creating the bundle 'minilm-l6' failed \\(exit 3\\); run it yourself"):
        cli.ensure_bundles(settings)
    assert calls == [export_command(settings)]


def test_built_in_models_to_serve_are_exported_once_and_others_named_before_the_server_starts(tmp_path, monkeypatch):
    from service import cli

    root = tmp_path / "reg"
    make_fake_bundle(root, "fake-a")
    calls = []

    def fake_export(command, **kwargs):  # what the export subprocess leaves behind: the model, promoted
        calls.append(command)
        make_fake_bundle(root, command[command.index("--name") + 1])
        return 0

    monkeypatch.setattr(cli, "run_export", fake_export)
    settings = ServiceSettings(registry_dir=root, models=["fake-a", "minilm-l3"])
    assert settings.default_model == "fake-a"  # no minilm-l6 among the models: the first is the default
    assert cli.ensure_bundles(settings) == ["fake-a", "minilm-l3"]
    assert calls == [export_command(settings, "minilm-l3")]
    assert cli.ensure_bundles(settings) == ["fake-a", "minilm-l3"] and len(calls) == 1  # found: not again
    with pytest.raises(RuntimeError, match=r"no promoted bundle for \['my-model'\].*embedder export MODEL_OR_FOLDER"):
        cli.ensure_bundles(ServiceSettings(registry_dir=root, models=["my-model"]))
    with pytest.raises(RuntimeError, match="default model 'fake-z' is not among the served models"):
        cli.ensure_bundles(ServiceSettings(registry_dir=root, models=["fake-a"], default_model="fake-z"))
    assert len(calls) == 1
    assert ServiceSettings(models=["drug-a", "minilm-l6"]).default_model == "minilm-l6"


def fake_folder_export(root, calls):
    """What the export subprocess of a model folder leaves behind: its bundle, promoted, whose manifest records the
    folder's weights' sha256 and the sha256 of every file that decides its embeddings, as `export_bundle` does."""
    import json

    from core import registry
    from core.catalog import sha256_file
    from core.model_folder import embedding_file_digests

    def fake_export(command, **kwargs):
        calls.append(command)
        folder = Path(command[4])
        bundle = make_fake_bundle(root, command[command.index("--name") + 1])
        source = {"sha256": sha256_file(folder / "model.safetensors"), "files": embedding_file_digests(folder)}
        (bundle / "manifest.json").write_text(json.dumps(registry.read_manifest(bundle) | {"source": source}))
        return 0

    return fake_export


def test_a_model_folder_is_served_under_its_name_and_exported_again_when_its_weights_change(tmp_path, monkeypatch):
    from core import registry
    from service import cli

    root = tmp_path / "reg"
    folder = tmp_path / "models" / "My Model v2"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"first weights")
    calls = []

    monkeypatch.setattr(cli, "run_export", fake_folder_export(root, calls))
    monkeypatch.chdir(tmp_path)
    settings, folders = cli.model_folders(ServiceSettings(registry_dir=root, models=["./models/My Model v2"]))
    assert (settings.models, settings.default_model) == (["my-model-v2"], "my-model-v2")
    assert folders == {"my-model-v2": folder.resolve()}
    assert cli.ensure_bundles(settings, folders) == ["my-model-v2"]
    assert calls == [export_command(settings, "my-model-v2", folder.resolve())] and calls[0][4] == str(folder.resolve())
    assert cli.ensure_bundles(settings, folders) == ["my-model-v2"] and len(calls) == 1  # same weights: served as is
    (folder / "model.safetensors").write_bytes(b"retrained weights")
    assert cli.ensure_bundles(settings, folders) == ["my-model-v2"] and len(calls) == 2  # exported again
    assert registry.current_version(root, "my-model-v2") == "2"

    with pytest.raises(RuntimeError, match=r"'\./models' is not a Hugging Face model folder"):
        cli.model_folders(ServiceSettings(registry_dir=root, models=["./models"]))
    run = tmp_path / "runs" / "x"
    (run / "best").mkdir(parents=True)
    (run / "best" / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"'\./runs/x' is not a Hugging Face model folder \(.* training run's "
                       r"folder, not a model folder: pass .*runs/x/best \(the best-validated model"):
        cli.model_folders(ServiceSettings(registry_dir=root, models=["./runs/x"]))
    twin = tmp_path / "other" / "my model v2"
    twin.mkdir(parents=True)
    (twin / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="would both be served as 'my-model-v2'"):
        cli.model_folders(ServiceSettings(registry_dir=root, models=[str(folder), str(twin)]))
    named, _ = cli.model_folders(ServiceSettings(registry_dir=root, models=["minilm-l3", str(folder)]))
    assert (named.models, named.default_model) == (["minilm-l3", "my-model-v2"], "minilm-l3")


def _st_folder(folder, *, pooling="cls", max_seq_length=128):
    """A sentence-transformers model folder: config, weights, tokenizer, pooling, a Dense layer, prompts."""
    from core.model_folder import DenseLayer, Prompts, write_sentence_transformers_config

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"hidden_size": 8}')
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text('{"model": "wordpiece"}')
    (folder / "vocab.txt").write_text("[PAD]\n[CLS]\n")
    write_sentence_transformers_config(
        folder, dim=8, pooling=pooling, normalize=True, max_seq_length=max_seq_length, dense=DenseLayer(8, 4),
        prompts=Prompts({"query": "query: "}),
    )  # fmt: skip
    (folder / "2_Dense" / "model.safetensors").write_bytes(b"dense weights")
    return folder


def test_a_model_folder_is_exported_again_when_any_file_that_decides_its_embeddings_changes(
    tmp_path, monkeypatch, caplog
):
    """Pooling, max length, tokenizer, prompts, modules and the Dense layer change the vectors as much as the weights:
    a change to any of them exports the folder again at the next start; a file that does not (a README) does not."""
    import json
    import logging

    from core import registry
    from service import cli

    root = tmp_path / "reg"
    folder = _st_folder(tmp_path / "mine")
    calls = []
    monkeypatch.setattr(cli, "run_export", fake_folder_export(root, calls))
    settings, folders = cli.model_folders(ServiceSettings(registry_dir=root, models=[str(folder)]))
    assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == 1
    assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == 1  # unchanged: served as is

    with caplog.at_level(logging.INFO, logger="service"):
        _st_folder(folder, pooling="mean", max_seq_length=64)  # CLS -> mean pooling, 128 -> 64 tokens
        assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == 2
    assert registry.current_version(root, "mine") == "2"
    assert "(1_Pooling/config.json, sentence_bert_config.json): exporting it again" in caplog.text

    changes = {
        "tokenizer.json": '{"model": "bpe"}',
        "vocab.txt": "[PAD]\n[CLS]\n[SEP]\n",
        "config.json": '{"hidden_size": 8, "layer_norm_eps": 1e-6}',
        "config_sentence_transformers.json": json.dumps({"prompts": {"query": "search: "}}),
        "2_Dense/config.json": json.dumps({"in_features": 8, "out_features": 4, "bias": False}),
        "2_Dense/model.safetensors": "other dense weights",
        "model.safetensors": "retrained weights",
        "modules.json": "[]",  # last: without modules, the module folders no longer decide anything
    }
    for count, (name, text) in enumerate(changes.items(), start=3):
        (folder / name).write_text(text)
        assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == count, name
    (folder / "README.md").write_text("notes")
    assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == len(changes) + 2


def test_a_bundle_that_recorded_only_its_weights_digest_is_exported_again_once(tmp_path, monkeypatch, caplog):
    """Bundles exported before manifests recorded every file that decides the embeddings say nothing about the
    pooling or tokenizer they were made with: the folder is exported once more (the log says why), then compared."""
    import json
    import logging

    from core import registry
    from core.catalog import sha256_file
    from service import cli

    root = tmp_path / "reg"
    folder = _st_folder(tmp_path / "mine")
    old = make_fake_bundle(root, "mine")
    manifest = registry.read_manifest(old) | {"source": {"sha256": sha256_file(folder / "model.safetensors")}}
    (old / "manifest.json").write_text(json.dumps(manifest))
    calls = []
    monkeypatch.setattr(cli, "run_export", fake_folder_export(root, calls))
    settings, folders = cli.model_folders(ServiceSettings(registry_dir=root, models=[str(folder)]))
    with caplog.at_level(logging.INFO, logger="service"):
        assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == 1
    assert "'mine' version 1 records only its weights' sha256" in caplog.text
    assert registry.current_version(root, "mine") == "2"
    assert cli.ensure_bundles(settings, folders) == ["mine"] and len(calls) == 1  # recorded now: compared, unchanged


@pytest.mark.parametrize(
    ("host", "values", "refused"),
    [
        ("0.0.0.0", {}, True),
        ("::", {}, True),
        ("10.1.2.3", {}, True),
        ("embedder.example.com", {}, True),
        ("0.0.0.0", {"api_keys": "k"}, True),  # client keys may not use /adapt: no key could
        ("0.0.0.0", {"admin_api_keys": "a"}, False),
        ("0.0.0.0", {"api_keys": "k", "adapt_allow_client_keys": True}, False),
        ("0.0.0.0", {"adapt_allow_client_keys": True}, True),  # the fallback with no client key to fall back to
        ("0.0.0.0", {"adapt_enabled": False}, False),
        ("127.0.0.1", {}, False),
        ("127.8.9.10", {}, False),
        ("::1", {}, False),
        ("[::1]", {}, False),
        ("localhost", {}, False),
    ],
)
def test_a_server_reachable_from_elsewhere_never_starts_with_adapt_open(host, values, refused):
    settings = ServiceSettings.from_flat(host=host, **values)
    error = settings.open_adapt_error()
    assert (error is not None) is refused
    if refused:
        assert f"refusing to serve /adapt on {host}" in error
        assert "Set EMBED_ADMIN_API_KEYS" in error and "EMBED_ADAPT_ENABLED=false" in error


def test_create_app_applies_the_same_rule(tmp_path):
    from service.app import create_app

    open_settings = ServiceSettings.from_flat(host="0.0.0.0", registry_dir=tmp_path, adapt_dir=tmp_path / "adapt")
    with pytest.raises(ValueError, match="Set EMBED_ADMIN_API_KEYS"):
        create_app(open_settings, backend_factory=lambda bundle, settings: None)
    # without the /adapt routes there is nothing to refuse
    create_app(open_settings, backend_factory=lambda bundle, settings: None, include_adapt=False)


def test_metrics_port_must_differ_from_the_main_port():
    with pytest.raises(ValidationError, match="give /metrics its own port"):
        ServiceSettings(port=9000, metrics_port=9000)
    assert ServiceSettings(port=0, metrics_port=0).metrics_port == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://user:hunter2@db/jobs", "unsupported adapt store URL scheme 'mysql'"),
        ("sqlite://", "unsupported adapt store URL scheme 'sqlite'"),  # no file: an in-memory store no replica shares
        ("hunter2 is not a url", "not a URL"),
    ],
)
def test_a_job_store_url_that_cannot_open_stops_the_server_before_it_loads_and_is_never_echoed(
    url, message, monkeypatch, capsys
):
    from service.cli import main

    monkeypatch.setenv("EMBED_ADAPT_STORE_URL", url)
    assert main(["--port", "0"]) == 2  # refused while the settings are read: no model was loaded
    err = capsys.readouterr().err
    assert err.startswith("embedder serve: invalid settings: store_url: ") and message in err and "hunter2" not in err


def test_job_store_urls_that_open_are_kept(tmp_path):
    for url in (f"sqlite:///{tmp_path / 'jobs.sqlite3'}", "postgresql://u:p@db/jobs", "postgres://u:p@db/jobs", ""):
        settings = ServiceSettings.from_flat(adapt_store_url=url)
        assert settings.adapt.store_url is not None and settings.adapt.store_url.get_secret_value() == url


def test_a_port_in_use_stops_the_server_before_any_bundle_is_made_or_model_loaded(tmp_path, monkeypatch, capsys):
    import socket

    from service import cli

    def never(*args, **kwargs):
        raise AssertionError("the port is checked before the bundles are made")

    monkeypatch.setattr(cli, "ensure_bundles", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["--port", str(port), "--registry-dir", str(tmp_path / "reg")]
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"embedder serve: cannot listen on 127.0.0.1 port {port}: Address already in use")
    assert "pass --port" in err


def test_the_bound_listener_is_the_one_uvicorn_serves_on(tmp_path):
    """`bind_listener`'s socket is not listening until the server runs: a client is refused, not left hanging."""
    import socket

    from service.cli import bind_listeners

    for host in ("127.0.0.1", "localhost", "[::1]"):
        try:
            listeners = bind_listeners(host, 0)
        except OSError:  # a machine without IPv6 loopback
            assert host == "[::1]"
            continue
        for listener in listeners:
            with listener, pytest.raises(ConnectionRefusedError):
                socket.create_connection(listener.getsockname()[:2], timeout=2).close()


def test_a_host_name_of_several_addresses_is_bound_on_each_on_one_port(monkeypatch):
    """As uvicorn binds a name: ``localhost`` is ::1 and 127.0.0.1 on most machines, and a client may call either."""
    import socket

    from service import cli

    def two_addresses(host, port, *args, **kwargs):
        assert host == "twice.example"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in ("127.0.0.1", "127.0.0.2")]

    monkeypatch.setattr(cli.socket, "getaddrinfo", two_addresses)
    listeners = cli.bind_listeners("twice.example", 0)
    try:
        bound = [listener.getsockname() for listener in listeners]
    finally:
        for listener in listeners:
            listener.close()
    assert [address for address, _ in bound] == ["127.0.0.1", "127.0.0.2"]
    assert bound[0][1] != 0 and bound[0][1] == bound[1][1]


@pytest.mark.parametrize("whom", ["group", "server"], ids=["terminal-ctrl-c", "sigint-to-the-server"])
def test_ctrl_c_while_the_first_bundle_is_made_stops_cleanly_and_leaves_nothing(tiny_bert_path, tmp_path, whom):
    """A terminal's Ctrl-C (to the server's process group) or a SIGINT sent to the server alone: either way no
    traceback, exit 130, no staging folder left behind and nothing published — the export, in a session of its own,
    is stopped by the server, not left to finish."""
    import os
    import signal
    import time

    from tests.ports import free_port

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    folder = tmp_path / "my-model"
    shutil.copytree(tiny_bert_path, folder)
    command = [
        sys.executable, "-m", "embedder.cli", "serve", "--registry-dir", str(tmp_path / "reg"),
        "--models", str(folder), "--port", str(free_port()), "--no-adapt-enabled",
    ]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(scratch), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(p.name.startswith("embedder-export-") for p in scratch.iterdir()):
            assert server.poll() is None and time.monotonic() < deadline, "the export never started"
            time.sleep(0.02)
        if whom == "group":
            os.killpg(server.pid, signal.SIGINT)
        else:
            server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=120)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert server.returncode == 130, output
    assert "embedder serve: stopped by SIGINT before the server started" in output
    assert "Traceback" not in output
    assert [p.name for p in scratch.iterdir() if p.name.startswith("embedder-")] == []  # staging folders
    assert not list((tmp_path / "reg").glob("*/current"))
