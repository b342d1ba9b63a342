"""More Hugging Face architectures a user may bring, as tiny random models — encoders and decoders (GPT-2, Llama,
Qwen3: causal masks) — each exports, pools in the graph and matches torch, on the tokenizer of minilm-l6 (the
vocabulary does not matter to the graph)."""

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
DECODER = {**SIZES, "num_key_value_heads": 2, "max_position_embeddings": 130}
# name -> (config, model, sizes, pooling); encoders mean-pool, decoders (causal masks) take their last token
ARCHITECTURES: dict[str, tuple[Any, Any, dict[str, Any], str]] = {
    "distilbert": (
        hf.DistilBertConfig, hf.DistilBertModel,
        {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 130}, "mean",
    ),
    "xlm-roberta": (hf.XLMRobertaConfig, hf.XLMRobertaModel, {**SIZES, "pad_token_id": 0}, "mean"),
    "deberta-v2": (hf.DebertaV2Config, hf.DebertaV2Model, SIZES, "mean"),
    "modernbert": (hf.ModernBertConfig, hf.ModernBertModel, {**SIZES, "pad_token_id": 0}, "mean"),
    "albert": (hf.AlbertConfig, hf.AlbertModel, {**SIZES, "embedding_size": 16}, "mean"),  # one layer run N times
    "gpt2": (hf.GPT2Config, hf.GPT2Model, {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 130}, "last"),
    "llama": (hf.LlamaConfig, hf.LlamaModel, DECODER, "last"),
    "qwen3": (hf.Qwen3Config, hf.Qwen3Model, {**DECODER, "head_dim": 8}, "last"),
}  # fmt: skip


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_architecture_exports_and_matches_torch(
    architecture: str, tmp_path: Path, minilm_l6_path: Path, varied_texts: list[str]
) -> None:
    config_cls, model_cls, sizes, pooling = ARCHITECTURES[architecture]
    torch.manual_seed(0)
    backbone = model_cls(config_cls(**{"vocab_size": 30522, "max_position_embeddings": 130, **sizes}))
    tokenizer = AutoTokenizer.from_pretrained(minilm_l6_path)
    if pooling == "last":  # as decoders' tokenizers come: no pad token, an end-of-sequence one
        tokenizer.pad_token, tokenizer.eos_token = None, "[SEP]"
    folder = Encoder(backbone, tokenizer, pooling=pooling, normalize=True, max_seq_length=128).save(tmp_path / "model")
    bundle_dir = exporter.export_bundle(folder, tmp_path / "registry", "tiny")
    assert registry.read_manifest(bundle_dir)["layers"] == 2
    encoder = torch_reference(folder)
    assert onnx_vs_torch(bundle_dir, encoder, batch_of_17(varied_texts)).min() >= 0.9999
