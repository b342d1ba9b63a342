"""Folders a user brings, as sentence-transformers loads them: lower-casing (``do_lower_case``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from training.encoder import Encoder

CASED_TEXT = "A Man Is Playing"
LOWERED_IDS = [101, 1037, 2158, 2003, 2652, 102]  # sentence-transformers' ids for CASED_TEXT, lower-cased first
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}


def cased_tokenizer(minilm_l6_path: Path) -> PreTrainedTokenizerBase:
    """minilm-l6's vocabulary with lower-casing off: capitalised words are unknown to it."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_l6_path, do_lower_case=False)
    assert tokenizer([CASED_TEXT])["input_ids"][0] == [101, 100, 100, 100, 100, 102]
    return tokenizer


def lower_case_folder(folder: Path, minilm_l6_path: Path) -> Path:
    """A sentence-transformers folder with a cased tokenizer whose sentence_bert_config.json says do_lower_case."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    backbone = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=128, **TINY), add_pooling_layer=False)
    Encoder(backbone, cased_tokenizer(minilm_l6_path), max_seq_length=128).save(folder)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": True}))
    return folder


# --- do_lower_case ------------------------------------------------------------------------------


def test_do_lower_case_lowercases_as_sentence_transformers_does(minilm_l6_path: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = lower_case_folder(tmp_path / "lower", minilm_l6_path)
    theirs = SentenceTransformer(str(folder), device="cpu").tokenize([CASED_TEXT])["input_ids"][0].tolist()
    assert theirs == LOWERED_IDS
    encoder = Encoder.from_pretrained(folder)
    assert encoder.tokenize([CASED_TEXT])["input_ids"][0].tolist() == LOWERED_IDS
    assert encoder.tokenizer([CASED_TEXT])["input_ids"][0] == LOWERED_IDS  # every caller of the tokenizer
    # a saved checkpoint keeps lower-casing, for this project and for sentence-transformers
    saved = encoder.save(tmp_path / "saved")
    assert Encoder.from_pretrained(saved).tokenize([CASED_TEXT])["input_ids"][0].tolist() == LOWERED_IDS
    assert SentenceTransformer(str(saved), device="cpu").tokenize([CASED_TEXT])["input_ids"][0].tolist() == (
        LOWERED_IDS
    )


def test_without_do_lower_case_a_cased_tokenizer_stays_cased(minilm_l6_path: Path, tmp_path: Path) -> None:
    folder = lower_case_folder(tmp_path / "cased", minilm_l6_path)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    assert Encoder.from_pretrained(folder).tokenize([CASED_TEXT])["input_ids"][0].tolist()[1] == 100
