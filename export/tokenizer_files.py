"""The bundle's tokenizer files, made to tokenise as the bundle serves when read on their own.

A model folder's ``tokenizer.json`` keeps whatever truncation and padding it was saved with: all-MiniLM-L6-v2's
cuts at 128 tokens and pads every text to 128, while the model serves 256 (``sentence_bert_config.json``). The
service sets both when it loads the file (`core.runtime.OnnxBundle`), but onnxruntime with ``tokenizers`` or
transformers' ``AutoTokenizer`` outside this project reads them as they are, and would embed a longer text cut
short. So the bundle's copy says what the manifest says: truncation at ``max_seq_length`` from the right, no
padding (a batch is padded to its longest text, ``attention_mask`` 0 there), and ``model_max_length`` the same —
`core.model_folder.set_tokenizer_limit`, which every model folder a training run saves goes through too.

Only a fast tokenizer has a ``tokenizer.json``: a folder without one exports where transformers can make it from the
slow tokenizer's files (BERT's ``vocab.txt``), and is refused in one line before the export's work where it cannot
(`check_fast_tokenizer`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from core.model_folder import TOKENIZER_CONFIG, TOKENIZER_FILE, set_tokenizer_limit, transformer_folder


def write_tokenizer(tokenizer: PreTrainedTokenizerBase, folder: Path, max_length: int) -> dict[str, Any]:
    """Save ``tokenizer`` into ``folder`` cutting at ``max_length`` tokens and padding nothing; return the
    manifest's ``tokenizer`` record."""
    tokenizer.save_pretrained(folder)
    if not set_tokenizer_limit(Path(folder), max_length):  # a slow tokenizer: `export.bundle` refuses one first
        raise ValueError(f"the tokenizer saved no {TOKENIZER_FILE}; a bundle serves a fast tokenizer's")
    return {
        "file": TOKENIZER_FILE,
        "truncation": {"max_length": max_length, "direction": "right"},
        "padding": "none in the file: pad a batch on the right to its longest text with pad_token_id, "
        "attention_mask 0 there",
    }


def plain_ids(folder: Path, texts: list[str]) -> list[list[int]]:
    """The ids of ``texts`` from the bundle's ``tokenizer.json`` read as it is, as a user outside this project
    reads it (no truncation or padding set by the reader)."""
    return [encoding.ids for encoding in Tokenizer.from_file(str(Path(folder) / TOKENIZER_FILE)).encode_batch(texts)]


def check_fast_tokenizer(folder: Path) -> None:
    """Raise ValueError, saying what to do, when the model folder's tokenizer has no ``tokenizer.json`` and
    transformers cannot make one (a SentencePiece tokenizer without the sentencepiece package, a tokenizer with no
    fast version): the bundle could not serve it."""
    weights = transformer_folder(folder)
    if (weights / TOKENIZER_FILE).is_file():
        return
    try:
        tokenizer = AutoTokenizer.from_pretrained(weights, use_fast=True, trust_remote_code=False)
    except Exception as err:  # transformers fails in many ways here, an AttributeError among them
        if isinstance(err, ValueError) and "trust_remote_code" in str(err):
            return  # the folder's own code: loading the model refuses it in its own words
        raise ValueError(_no_fast_tokenizer(weights, f"{type(err).__name__}: {str(err)[:200]}")) from None
    check_is_fast(tokenizer, weights)


def check_is_fast(tokenizer: PreTrainedTokenizerBase, where: Path | str) -> None:
    if not tokenizer.is_fast:
        raise ValueError(_no_fast_tokenizer(where, f"{type(tokenizer).__name__} has no fast version"))


def _no_fast_tokenizer(where: Path | str, why: str) -> str:
    config = Path(where) / TOKENIZER_CONFIG
    kind = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    return (
        f"{where}: the tokenizer{f' ({kind})' if kind else ''} has no {TOKENIZER_FILE} and transformers could not "
        f"make one ({why}); a bundle serves a fast tokenizer's {TOKENIZER_FILE}: save the tokenizer with "
        "save_pretrained where transformers can convert it (SentencePiece tokenizers need the sentencepiece "
        "package), then export again"
    )
