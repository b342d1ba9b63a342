"""`embedder export FOLDER` on folders a user brings: each exports and serves as sentence-transformers reads it —
lower-casing in the served tokenizer."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from core.runtime import OnnxBundle
from export import bundle as exporter
from tests.export.test_export import torch_reference
from tests.training.test_encoder_folders import CASED_TEXT, LOWERED_IDS, lower_case_folder


def test_do_lower_case_is_in_the_served_tokenizer(minilm_l6_path: Path, tmp_path: Path) -> None:
    folder = lower_case_folder(tmp_path / "lower", minilm_l6_path)
    bundle = exporter.export_bundle(folder, tmp_path / "registry", "lower")
    assert Tokenizer.from_file(str(bundle / "tokenizer.json")).encode(CASED_TEXT).ids == LOWERED_IDS
    assert OnnxBundle(bundle).tokenize([CASED_TEXT])[0].ids == LOWERED_IDS
    assert torch_reference(folder).tokenize([CASED_TEXT])["input_ids"][0].tolist() == LOWERED_IDS
