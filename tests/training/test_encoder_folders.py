"""Folders a user brings, as sentence-transformers loads them: lower-casing (``do_lower_case``), input lengths bounded
by the position table, encoder-decoder models (T5's encoder alone) and models that need their own code (refused)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from training.encoder import Encoder

CASED_TEXT = "A Man Is Playing"
LOWERED_IDS = [101, 1037, 2158, 2003, 2652, 102]  # sentence-transformers' ids for CASED_TEXT, lower-cased first
LONG_TEXT = "tokens " * 600  # past every position table here
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


def plain_folder(folder: Path, backbone: torch.nn.Module, minilm_l6_path: Path, **tokenizer_kwargs) -> Path:
    """A Hugging Face folder without sentence-transformers' files: weights, config and tokenizer only."""
    backbone.save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_l6_path, **tokenizer_kwargs).save_pretrained(folder)
    return folder


def tiny_t5(folder: Path, minilm_l6_path: Path) -> Path:
    """A tiny random T5 (encoder and decoder) beside minilm-l6's tokenizer (without token type ids, which T5 does not
    take), as a plain folder."""
    from transformers import T5Config, T5Model

    torch.manual_seed(0)
    config = T5Config(
        vocab_size=30522, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, pad_token_id=0,
        decoder_start_token_id=0,
    )  # fmt: skip
    return plain_folder(folder, T5Model(config), minilm_l6_path, model_input_names=["input_ids", "attention_mask"])


def custom_code_folder(folder: Path, source: Path, model_type: str) -> Path:
    """A copy of ``source`` whose config points AutoModel at code shipped in the folder (``auto_map``)."""
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"}
    (folder / "config.json").write_text(json.dumps(config))
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


# --- input length -------------------------------------------------------------------------------


def test_sentence_transformers_length_past_the_position_table_is_capped(
    tiny_bert_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = shutil.copytree(tiny_bert_path, tmp_path / "long")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512, "do_lower_case": False}))
    with caplog.at_level(logging.WARNING, logger="training.encoder"):
        encoder = Encoder.from_pretrained(folder)
    assert encoder.max_seq_length == 128
    assert "max_seq_length 512" in caplog.text and "128" in caplog.text
    assert encoder.encode([LONG_TEXT]).shape == (1, 32)


@pytest.mark.parametrize("architecture", ["mpnet", "roberta"])
def test_plain_folder_length_leaves_out_the_padding_offset(
    architecture: str, minilm_l6_path: Path, tmp_path: Path
) -> None:
    """MPNet and RoBERTa number positions from padding_idx + 1 (2 here): 130 positions take 128 tokens."""
    import transformers as hf

    config_cls, model_cls = {"mpnet": (hf.MPNetConfig, hf.MPNetModel), "roberta": (hf.RobertaConfig, hf.RobertaModel)}[
        architecture
    ]
    torch.manual_seed(0)
    backbone = model_cls(config_cls(vocab_size=30522, max_position_embeddings=130, pad_token_id=1, **TINY))
    encoder = Encoder.from_pretrained(plain_folder(tmp_path / architecture, backbone, minilm_l6_path))
    assert encoder.max_seq_length == 128
    assert np.isfinite(encoder.encode([LONG_TEXT, "short"])).all()


def test_plain_folder_takes_the_tokenizers_length_as_sentence_transformers_does(
    minilm_l6_path: Path, tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel

    backbone = BertModel(BertConfig(vocab_size=30522, max_position_embeddings=1024, **TINY), add_pooling_layer=False)
    folder = plain_folder(tmp_path / "long", backbone, minilm_l6_path, model_max_length=1024)
    assert SentenceTransformer(str(folder), device="cpu").max_seq_length == 1024
    assert Encoder.from_pretrained(folder).max_seq_length == 1024
    # a tokenizer saved without a limit: the position table's
    unlimited = plain_folder(tmp_path / "unlimited", backbone, minilm_l6_path, model_max_length=int(1e30))
    assert Encoder.from_pretrained(unlimited).max_seq_length == 1024


# --- encoder-decoder models -------------------------------------------------------------------------


def test_t5_loads_its_encoder_alone_as_sentence_transformers_does(minilm_l6_path: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from transformers import T5EncoderModel

    folder = tiny_t5(tmp_path / "t5", minilm_l6_path)
    encoder = Encoder.from_pretrained(folder)
    assert isinstance(encoder.backbone, T5EncoderModel) and encoder.num_layers == 2
    texts = ["A man is playing a guitar.", "ok", LONG_TEXT]
    ours = encoder.encode(texts)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(texts)
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    assert (ours * theirs).sum(axis=1).min() > 0.9999
    reloaded = Encoder.from_pretrained(encoder.truncate(1).save(tmp_path / "saved"))
    assert reloaded.num_layers == 1 and reloaded.encode(texts).shape == (3, 32)


def test_other_encoder_decoder_models_are_refused_in_one_line(minilm_l6_path: Path, tmp_path: Path) -> None:
    from transformers import BartConfig, BartModel

    config = BartConfig(
        vocab_size=30522, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=130,
    )  # fmt: skip
    folder = plain_folder(tmp_path / "bart", BartModel(config), minilm_l6_path)
    with pytest.raises(ValueError, match=r"^[^\n]*bart is an encoder-decoder model[^\n]*$"):
        Encoder.from_pretrained(folder)


# --- custom code ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["x-custom", "bert"])
def test_a_model_that_needs_its_own_code_is_refused_without_a_prompt(
    model_type: str, tiny_bert_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether or not transformers knows the model type, the folder's own code defines the model: refused before
    transformers can ask on the terminal whether to run it."""

    def no_prompt(*args: object) -> str:
        raise AssertionError("transformers asked whether to run the folder's code")

    monkeypatch.setattr("builtins.input", no_prompt)
    folder = custom_code_folder(tmp_path / "custom", tiny_bert_path, model_type)
    with pytest.raises(ValueError, match=r"^[^\n]*needs its own code \(auto_map\)[^\n]*built-in architectures$"):
        Encoder.from_pretrained(folder)


def test_a_tokenizer_that_needs_its_own_code_is_refused(tiny_bert_path: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(tiny_bert_path, tmp_path / "custom-tokenizer")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="XTokenizer", auto_map={"AutoTokenizer": ["tokenization_x.XTokenizer", None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"^[^\n]*needs its own code \(auto_map\)"):
        Encoder.from_pretrained(folder)
