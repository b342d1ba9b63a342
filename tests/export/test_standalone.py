"""A bundle used outside this project: onnxruntime and `tokenizers` alone, as docs/ARCHITECTURE.md shows, embed as
the service does — the bundle's tokenizer file cuts where the manifest says — and the manifest says what a user
needs and which CPU measured its parity figures."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from core import registry, runtime
from core.runtime import OnnxBundle, mixed_batches
from embedder.cli import main as embedder_main
from export import bundle as exporter
from tests.padded_int8 import padding_moves_int8

REPO = Path(__file__).resolve().parents[2]
LONG = "tokens of a long text " * 60  # past 64 and 128 tokens


def documented_embed() -> Any:
    """The ``embed`` function of docs/ARCHITECTURE.md's "A bundle without this project", as written there."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("### A bundle without this project", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict[str, Any] = {}
    exec(compile(code, "ARCHITECTURE.md", "exec"), namespace)  # the project's own documentation
    return namespace["embed"]


def short_model(tiny_bert_path: Path, folder: Path) -> Path:
    """The tiny model serving 64 tokens; its tokenizer.json, as all-MiniLM-L6-v2's, cuts at 128 and pads to 128."""
    folder = shutil.copytree(tiny_bert_path, folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))  # saved as the model's (Encoder.save): set both
    tokenizer.enable_truncation(max_length=128)
    tokenizer.enable_padding(length=128)
    tokenizer.save(str(folder / "tokenizer.json"))
    saved = json.loads((folder / "tokenizer.json").read_text())
    assert saved["truncation"]["max_length"] == 128 and saved["padding"] is not None
    return folder


def test_a_bundle_embeds_outside_the_project_as_served(tiny_bert_path: Path, tmp_path: Path) -> None:
    bundle = exporter.export_bundle(short_model(tiny_bert_path, tmp_path / "short"), tmp_path / "registry", "short")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["max_seq_length"] == 64
    assert len(Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(LONG).ids) == 64  # read as it is
    assert manifest["tokenizer"]["truncation"] == {"max_length": 64, "direction": "right"}
    texts = ["ok", LONG, "a sentence of middling length"]
    served = OnnxBundle(bundle, variant="fp32").encode(texts)
    plain = documented_embed()(str(bundle), texts)
    assert plain.shape == served.shape == (3, manifest["dim"])
    assert np.abs(plain - served).max() < 1e-5  # the long text cut at 64 tokens, as served
    assert AutoTokenizer.from_pretrained(bundle).model_max_length == 64


def test_the_manifest_says_which_cpu_measured_parity(tiny_bert_path: Path, tmp_path: Path) -> None:
    bundle = exporter.export_bundle(tiny_bert_path, tmp_path / "registry", "tiny")
    parity = json.loads((bundle / "manifest.json").read_text())["parity"]
    assert parity["checked_on"] == runtime.cpu_features()
    assert parity["onnxruntime"] == runtime.ort.__version__


# --- where the bundle would go: checked before the export's work -------------------------------------------------


@pytest.mark.parametrize("where", ["a file", "a read-only folder"])
def test_a_registry_it_cannot_write_in_fails_before_any_work(
    where: str, tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    if where == "a file":
        registry = tmp_path / "registry"
        registry.write_text("not a folder")
        reason = "is not a folder"
    elif os.geteuid() == 0:  # root writes in any folder of a writable filesystem
        registry = Path("/proc") / "registry"
        reason = "/proc is not writable"
    else:
        registry = tmp_path / "read-only"
        registry.mkdir(mode=0o500)
        reason = "is not writable"

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the export started although it could not be published")

    monkeypatch.setattr(exporter, "build_bundle", no_work)
    argv = ["export", str(tiny_bert_path), "--name", "tiny", "--registry", str(registry), "--quantize", "none"]
    assert embedder_main(argv) == 1
    err = capsys.readouterr().err
    assert f"embedder export: cannot publish into {registry / 'tiny'}: " in err and reason in err
    assert "nothing was exported" in err


# --- an export stopped midway ------------------------------------------------------------------------------------

STOPPED_EXPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whoever started this process
from embedder.cli import main
from export import bundle, graph

def stop_after(module, name):
    original = getattr(module, name)
    def stopping(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, sys.argv[4]))
        return result
    setattr(module, name, stopping)

if sys.argv[1] == "optimise":
    stop_after(graph, "optimize_graph")
else:  # the bundle's copy into the registry, before its rename
    stop_after(bundle.shutil, "copytree")
sys.exit(main(["export", sys.argv[2], "--name", "tiny", "--registry", sys.argv[3], "--quantize", "none"]))
"""


@pytest.mark.parametrize(("stage", "stop"), [("optimise", "SIGTERM"), ("copy", "SIGTERM"), ("optimise", "SIGINT")])
def test_stopped_midway_leaves_no_temporary_files_and_no_half_bundle(
    stage: str, stop: str, tiny_bert_path: Path, tmp_path: Path
) -> None:
    """SIGTERM (a stopping service or container, ``kill``) or Ctrl-C while the graphs are built, or while the bundle
    is copied into the registry: the export's temporary folder and the registry's partial copy are removed, no
    version is published or left reserved, and the command says it was stopped (no traceback)."""
    temporary, root = tmp_path / "tmp", tmp_path / "registry"
    temporary.mkdir()
    env = {**os.environ, "TMPDIR": str(temporary), "HF_HUB_OFFLINE": "1", "EMBED_NUM_THREADS": "1"}
    command = [sys.executable, "-c", STOPPED_EXPORT, stage, str(tiny_bert_path), str(root), stop]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + getattr(signal, stop), done.stderr
    assert f"embedder export: stopped by {stop} before it finished" in done.stderr
    assert "Traceback" not in done.stderr
    assert list(temporary.glob("embedder-export-*")) == []
    left = sorted(p.name for p in (root / "tiny").iterdir()) if (root / "tiny").exists() else []
    assert [name for name in left if name != ".lock"] == []
    assert registry.list_versions(root, "tiny") == []


# --- a model folder whose tokenizer has no tokenizer.json --------------------------------------------------------


def _export_lines(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    argv = ["export", str(folder), "--name", "user", "--registry", str(tmp_path / "registry"), "--quantize", "none"]
    code = embedder_main(argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip() and not line.startswith("export user")]


def test_a_slow_tokenizer_is_converted_or_refused_in_one_line(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bert = shutil.copytree(tiny_bert_path, tmp_path / "vocab-only")
    (bert / "tokenizer.json").unlink()  # vocab.txt alone: transformers makes the fast tokenizer
    code, err = _export_lines(bert, tmp_path, capsys)
    assert code == 0, err
    bundle = tmp_path / "registry" / "user" / "1"
    assert OnnxBundle(bundle).tokenize(["Hello there"])[0].ids == [101, 7592, 2045, 102]

    sentencepiece = shutil.copytree(tiny_bert_path, tmp_path / "sentencepiece")
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        (sentencepiece / name).unlink()
    config = {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 128}
    (sentencepiece / "tokenizer_config.json").write_text(json.dumps(config))
    (sentencepiece / "sentencepiece.bpe.model").write_bytes(bytes(range(256)) * 4)  # unreadable without or with
    code, err = _export_lines(sentencepiece, tmp_path, capsys)
    assert code == 1 and len(err) == 1, err
    assert "(XLMRobertaTokenizer) has no tokenizer.json and transformers could not make one" in err[0]
    assert registry.list_versions(tmp_path / "registry", "user") == ["1"]


# --- int8 held against torch in batches as served: short texts padded to long ones -------------------------------


def test_int8_is_held_to_the_bars_in_mixed_length_batches(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    padding_moves_int8(monkeypatch)
    bundle = exporter.export_bundle(tiny_bert_path, tmp_path / "registry", "tiny", quantize="auto")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["int8"]["chosen"] is None and manifest["serve_variant"] == "fp32"
    for candidate in manifest["int8"]["candidates"]:
        assert any("min cosine" in failure for failure in candidate["failures"]), candidate
    assert "mixed-length" in manifest["parity"]["batches"]


def test_recorded_int8_figures_hold_in_mixed_length_batches(tiny_bert_path: Path, tmp_path: Path) -> None:
    """On whatever CPU the export ran: the int8 figures the manifest records bound every probe in mixed batches."""
    bundle = exporter.export_bundle(tiny_bert_path, tmp_path / "registry", "tiny", quantize="int8")
    parity = json.loads((bundle / "manifest.json").read_text())["parity"]
    texts, reference = runtime.read_probes(bundle)
    int8 = OnnxBundle(bundle, variant="int8", intra_op_threads=2)
    encodings = int8.tokenize(texts)
    for rows in mixed_batches([len(encoding.ids) for encoding in encodings], 16):
        out = int8.run(int8.pad([encodings[i] for i in rows]))
        assert runtime.cosines(out, reference[rows]).min() >= parity["int8"]["min_cosine"] - 1e-6


def test_a_run_checkpoint_names_the_model_it_was_trained_from(tiny_bert_path: Path, tmp_path: Path) -> None:
    """`embedder export runs/NAME/best`: the manifest (and /v1/models) names the base model and the objective of the
    run's recipe, not the folder ``best`` and ``pretrained``."""
    run = tmp_path / "runs" / "sct-tiny"
    shutil.copytree(tiny_bert_path, run / "best")
    recipe = {"name": "sct-tiny", "model": "minilm-l6", "objective": "sct", "lr": 1e-4, "trained_on": ["enwiki"]}
    (run / "recipe.json").write_text(json.dumps(recipe))
    manifest = json.loads((exporter.export_bundle(run / "best", tmp_path / "reg", "s") / "manifest.json").read_text())
    assert (manifest["base_model"], manifest["method"]["name"]) == ("minilm-l6", "sct")
    assert manifest["method"]["hyperparameters"]["lr"] == 1e-4 and manifest["trained_on"] == ["enwiki"]
    told = exporter.export_bundle(run / "best", tmp_path / "reg", "s", method={"name": "tmft"})
    assert json.loads((told / "manifest.json").read_text())["method"] == {"name": "tmft"}
    plain = exporter.export_bundle(tiny_bert_path, tmp_path / "reg", "p")
    manifest = json.loads((plain / "manifest.json").read_text())
    assert (manifest["base_model"], manifest["method"]["name"]) == (tiny_bert_path.name, "pretrained")
