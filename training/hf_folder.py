"""How a Hugging Face folder becomes a backbone, a tokenizer and an input length, as sentence-transformers loads
it: the config without the folder's own code, T5's encoder alone, the length its tokenizer states cut to what the
position table takes, and ``do_lower_case`` put into the tokenizer itself. `training.encoder.Encoder.from_pretrained`
is the one caller.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import transformers
from tokenizers import normalizers
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel, PreTrainedTokenizerBase

# Encoder-decoder model types whose encoder transformers builds alone, as sentence-transformers loads sentence-T5 and
# GTR: the embedding is the encoder's; the decoder is neither needed nor loaded.
_ENCODER_ONLY_CLASSES = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}
# Tokenizers saved without a length limit report int(1e30); no real model takes this many tokens.
_NO_LIMIT = 100_000
# The input length of a model that states none: neither its tokenizer nor a position table.
_FALLBACK_MAX_LENGTH = 512
CUSTOM_CODE_REFUSAL = (
    "this model needs its own code (auto_map); the project loads only transformers' built-in architectures"
)


def lowercase_inputs(tokenizer: PreTrainedTokenizerBase) -> None:
    """Make ``tokenizer`` lower-case every text first, as sentence-transformers' ``do_lower_case`` does (it calls
    ``str.lower()`` on each text before tokenising).

    A fast tokenizer gets a ``Lowercase`` normalizer ahead of its own, so the lower-casing is part of its
    ``tokenizer.json``: whatever reads that file (a bundle's server, sentence-transformers, a reloaded checkpoint)
    lower-cases too. A tokenizer that already lower-cases is left as it is. A slow tokenizer lower-cases all but its
    special tokens in ``tokenize`` when its ``do_lower_case`` is set.
    """
    if not tokenizer.is_fast:
        tokenizer.do_lower_case = True
        return
    backend = tokenizer.backend_tokenizer
    if _lowercases(json.loads(backend.to_str()).get("normalizer")):
        return
    current = backend.normalizer
    backend.normalizer = (
        normalizers.Lowercase() if current is None else normalizers.Sequence([normalizers.Lowercase(), current])
    )


def _lowercases(normalizer: dict[str, Any] | None) -> bool:
    """Whether a serialised ``tokenizers`` normalizer lower-cases every text."""
    if not normalizer:
        return False
    if normalizer.get("type") == "Sequence":
        return any(_lowercases(step) for step in normalizer.get("normalizers", []))
    return normalizer.get("type") == "Lowercase" or (
        normalizer.get("type") == "BertNormalizer" and bool(normalizer.get("lowercase"))
    )


def st_lower_case(weights: Path) -> bool:
    """``do_lower_case`` of the sentence_bert_config.json beside the weights (False without one)."""
    path = weights / "sentence_bert_config.json"
    return path.is_file() and bool(json.loads(path.read_text()).get("do_lower_case", False))


def load_config(weights: Path) -> Any:
    """The folder's config, refused in one line when its model is defined by code in the folder (``auto_map``).

    transformers would build its own class for a model type it knows even when ``auto_map`` names the folder's code
    for ``AutoModel`` — different layers under the same name, loaded with freshly initialised weights — so such a
    folder is refused as well. ``trust_remote_code=False`` keeps transformers from asking on the terminal whether to
    run the code, which would block a command or the server's export subprocess.
    """
    raw = json.loads((weights / "config.json").read_text())
    if "AutoModel" in (raw.get("auto_map") or {}):
        raise ValueError(f"{weights}: {CUSTOM_CODE_REFUSAL}")
    try:
        return AutoConfig.from_pretrained(weights, trust_remote_code=False)
    except ValueError as err:
        raise custom_code_error(weights, err) from None


def custom_code_error(weights: Path, err: ValueError) -> ValueError:
    """transformers' refusal to run a folder's own code, as one line; any other error as it is."""
    return ValueError(f"{weights}: {CUSTOM_CODE_REFUSAL}") if "trust_remote_code" in str(err) else err


def backbone_class(weights: Path, config: Any) -> Any:
    """The class to load the backbone with: ``AutoModel``, or the encoder alone of an encoder-decoder model.

    The model type decides for T5's family, not ``is_encoder_decoder``: a saved encoder alone records False there."""
    name = _ENCODER_ONLY_CLASSES.get(config.model_type)
    if name is not None:
        return getattr(transformers, name)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{weights}: {config.model_type} is an encoder-decoder model; the project embeds with encoder or decoder "
            f"models, and of encoder-decoder ones loads the encoder alone only for {', '.join(_ENCODER_ONLY_CLASSES)}"
        )
    return AutoModel


def usable_positions(backbone: PreTrainedModel) -> int | None:
    """How many tokens ``backbone``'s positions cover: ``max_position_embeddings``, less the offset of models that
    number positions from ``padding_idx + 1`` (RoBERTa, XLM-RoBERTa, MPNet…: 514 positions take 512 tokens). None
    for a model without a position limit in its config (T5's relative positions)."""
    positions = getattr(backbone.config, "max_position_embeddings", None)
    if not positions:
        return None
    embeddings = getattr(backbone, "embeddings", None)
    padding_idx = getattr(embeddings, "padding_idx", None)
    numbered_after_padding = isinstance(getattr(embeddings, "position_embeddings", None), nn.Embedding)
    offset = padding_idx + 1 if numbered_after_padding and isinstance(padding_idx, int) and padding_idx >= 0 else 0
    return int(positions) - offset


def default_max_length(tokenizer: PreTrainedTokenizerBase, backbone: PreTrainedModel) -> int:
    """A plain folder's input length, as sentence-transformers picks it: the tokenizer's ``model_max_length``, else
    (a tokenizer saved without a limit) the position table's. The caller cuts it to `usable_positions`."""
    stated = int(getattr(tokenizer, "model_max_length", 0) or 0)
    if 2 <= stated <= _NO_LIMIT:
        return stated
    return usable_positions(backbone) or _FALLBACK_MAX_LENGTH
