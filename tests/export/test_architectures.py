"""More Hugging Face architectures a user may bring, as tiny random models: each exports, pools in the graph and
matches torch, on the tokenizer of minilm-l6 (the vocabulary does not matter to the graph)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers as hf
from transformers import AutoTokenizer

from core import registry
from export import bundle as exporter
from tests.export.test_export import batch_of_17, onnx_vs_torch, torch_reference
from training.encoder import Encoder

SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
ARCHITECTURES: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "distilbert": (hf.DistilBertConfig, hf.DistilBertModel, {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64}),
    "xlm-roberta": (hf.XLMRobertaConfig, hf.XLMRobertaModel, {**SIZES, "pad_token_id": 0}),
    "deberta-v2": (hf.DebertaV2Config, hf.DebertaV2Model, SIZES),
    "modernbert": (hf.ModernBertConfig, hf.ModernBertModel, {**SIZES, "pad_token_id": 0}),
    "albert": (hf.AlbertConfig, hf.AlbertModel, {**SIZES, "embedding_size": 16}),  # one layer run N times
}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_architecture_exports_and_matches_torch(
    architecture: str, tmp_path: Path, minilm_l6_path: Path, varied_texts: list[str]
) -> None:
    config_cls, model_cls, sizes = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    backbone = model_cls(config_cls(vocab_size=30522, max_position_embeddings=130, **sizes))
    tokenizer = AutoTokenizer.from_pretrained(minilm_l6_path)
    folder = Encoder(backbone, tokenizer, pooling="mean", normalize=True, max_seq_length=128).save(tmp_path / "model")
    bundle_dir = exporter.export_bundle(folder, tmp_path / "registry", "tiny")
    assert registry.read_manifest(bundle_dir)["layers"] == 2
    encoder = torch_reference(folder)
    assert onnx_vs_torch(bundle_dir, encoder, batch_of_17(varied_texts)).min() >= 0.9999
