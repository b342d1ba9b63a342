"""`embedder export FOLDER` on folders a user brings: each exports and serves as sentence-transformers reads it, or
is refused in one line — lower-casing in the served tokenizer, lengths within the position table, T5's encoder,
models that need their own code and encoder-decoder models; and what export says when no int8 setting keeps the
parity bars."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from core import registry, runtime
from core.runtime import OnnxBundle
from embedder.cli import main as embedder_main
from export import bundle as exporter
from export import quantize
from tests.export.test_export import batch_of_17, onnx_vs_torch, torch_reference
from tests.training.test_encoder_folders import (
    CASED_TEXT,
    LONG_TEXT,
    LOWERED_IDS,
    TINY,
    custom_code_folder,
    lower_case_folder,
    plain_folder,
    tiny_t5,
)


def _export(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> tuple[int, str, list[str]]:
    """`embedder export` (fp32 only): exit code, stdout and the lines on stderr (the progress bar's left out)."""
    argv = ["export", str(folder), "--name", "user", "--registry", str(tmp_path / "registry"), "--quantize", "none"]
    code = embedder_main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip() and not line.startswith("export user")]
    return code, captured.out, lines


def test_do_lower_case_is_in_the_served_tokenizer(minilm_l6_path: Path, tmp_path: Path) -> None:
    folder = lower_case_folder(tmp_path / "lower", minilm_l6_path)
    bundle = exporter.export_bundle(folder, tmp_path / "registry", "lower")
    assert Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(CASED_TEXT).ids == LOWERED_IDS
    assert OnnxBundle(bundle).tokenize([CASED_TEXT])[0].ids == LOWERED_IDS
    assert torch_reference(folder).tokenize([CASED_TEXT])["input_ids"][0].tolist() == LOWERED_IDS


def test_a_length_past_the_position_table_exports_at_the_tables_length(
    tiny_bert_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = shutil.copytree(tiny_bert_path, tmp_path / "long")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    code, out, err = _export(folder, tmp_path, capsys)
    assert code == 0, err
    bundle = tmp_path / "registry" / "user" / "1"
    assert registry.read_manifest(bundle)["max_seq_length"] == 128
    assert "max_seq_length 128" in out
    assert OnnxBundle(bundle).encode([LONG_TEXT]).shape == (1, 32)


def test_plain_mpnet_exports_within_its_padding_offset(
    minilm_l6_path: Path, tmp_path: Path, varied_texts: list[str]
) -> None:
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    backbone = MPNetModel(MPNetConfig(vocab_size=30522, max_position_embeddings=130, **TINY), add_pooling_layer=False)
    folder = plain_folder(tmp_path / "mpnet", backbone, minilm_l6_path)
    bundle = exporter.export_bundle(folder, tmp_path / "registry", "mpnet")
    assert registry.read_manifest(bundle)["max_seq_length"] == 128
    assert onnx_vs_torch(bundle, torch_reference(folder), batch_of_17(varied_texts)).min() >= 0.9999


def test_a_plain_folder_exports_at_its_tokenizers_length(
    minilm_l6_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from transformers import BertConfig, BertModel

    backbone = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=1024, **TINY), add_pooling_layer=False)
    folder = plain_folder(tmp_path / "long", backbone, minilm_l6_path, model_max_length=1024)
    code, out, err = _export(folder, tmp_path, capsys)
    assert code == 0, err
    assert registry.read_manifest(tmp_path / "registry" / "user" / "1")["max_seq_length"] == 1024
    assert "max_seq_length 1024" in out


def test_t5_exports_its_encoder(minilm_l6_path: Path, tmp_path: Path, varied_texts: list[str]) -> None:
    folder = tiny_t5(tmp_path / "t5", minilm_l6_path)
    bundle = exporter.export_bundle(folder, tmp_path / "registry", "t5")
    manifest = registry.read_manifest(bundle)
    assert manifest["layers"] == 2 and manifest["dim"] == 32 and manifest["inputs"] == ["input_ids", "attention_mask"]
    assert onnx_vs_torch(bundle, torch_reference(folder), batch_of_17(varied_texts)).min() >= 0.9999


def test_folders_the_project_cannot_load_are_refused_in_one_line(
    tiny_bert_path: Path, minilm_l6_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from transformers import BartConfig, BartModel

    custom = custom_code_folder(tmp_path / "custom", tiny_bert_path, "x-custom")
    code, out, err = _export(custom, tmp_path, capsys)
    assert code == 1 and out == ""
    assert err == [
        f"embedder export: {custom}: this model needs its own code (auto_map); the project loads only transformers' "
        "built-in architectures"
    ]
    config = BartConfig(
        vocab_size=30522, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=130,
    )  # fmt: skip
    code, out, err = _export(plain_folder(tmp_path / "bart", BartModel(config), minilm_l6_path), tmp_path, capsys)
    assert code == 1 and len(err) == 1 and "bart is an encoder-decoder model" in err[0]
    assert not (tmp_path / "registry").exists()


def test_int8_that_misses_the_bars_points_at_auto_and_auto_says_it_serves_fp32(
    tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    impossible = runtime.ParityBars(int8_mean_cosine=1.01)
    monkeypatch.setattr(exporter, "choose_int8", functools.partial(quantize.choose_int8, bars=impossible))
    argv = ["export", str(tiny_bert_path), "--name", "tiny", "--registry", str(tmp_path)]
    assert embedder_main([*argv, "--quantize", "int8"]) == 1
    err = capsys.readouterr().err
    assert "--quantize auto" in err and "Check the source model loads" not in err
    assert embedder_main([*argv, "--quantize", "auto"]) == 0
    out = capsys.readouterr().out
    assert "int8: none kept the parity bars; serving fp32" in out and "int8 setting: None" not in out
