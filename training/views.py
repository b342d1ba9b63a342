"""Views: two texts made from one document, the inputs of every self-supervised objective.

* **Crops** — the cropping paper's rule and its relaxations live in `core.text` (shared with evaluation
  and /adapt): `CropRule`, `choose_crop_rule`, `crop_pairs`.
* **Token-level augmentations** (here) — deletion, masking, span shuffle: the cheap cross-views SCT
  (``papers/001`` §3.1) can use when its back-translation models are unavailable (they are offline).
* **Dropout** (SimCSE) needs no function here: the same text goes through the encoder twice in
  train mode, so the trainer feeds one crop as both views.

Pure, seeded functions (every random choice goes through the ``random.Random`` the caller passes).
"""

from __future__ import annotations

import random
from typing import TypeVar

# --- token-level augmentations -------------------------------------------------------------------

Tokens = TypeVar("Tokens", str, list[str])


def _tokens(text_or_tokens: str | list[str]) -> list[str]:
    return text_or_tokens.split() if isinstance(text_or_tokens, str) else list(text_or_tokens)


def _like(original: str | list[str], tokens: list[str]) -> str | list[str]:
    return " ".join(tokens) if isinstance(original, str) else tokens


def _check_rate(name: str, rate: float) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{name} must be a fraction in [0, 1], got {rate}")


def token_deletion(tokens: Tokens, rng: random.Random, rate: float = 0.1) -> Tokens:
    """Drop each token independently with probability ``rate``; at least one token always survives
    (an empty view has no embedding). Text in, text out (whitespace tokens); list in, list out."""
    _check_rate("deletion rate", rate)
    items = _tokens(tokens)
    kept = [tok for tok in items if rng.random() >= rate]
    if not kept and items:
        kept = [rng.choice(items)]
    return _like(tokens, kept)  # type: ignore[return-value]


def token_masking(tokens: Tokens, rng: random.Random, rate: float = 0.15, mask_token: str = "[MASK]") -> Tokens:
    """Replace each token independently with ``mask_token`` with probability ``rate`` (paper 000
    Figure S1c masks a fraction of tokens on top of crops). Pass the tokenizer's mask token."""
    _check_rate("masking rate", rate)
    items = [mask_token if rng.random() < rate else tok for tok in _tokens(tokens)]
    return _like(tokens, items)  # type: ignore[return-value]


def span_shuffle(tokens: Tokens, rng: random.Random, rate: float = 0.1) -> Tokens:
    """Shuffle the order of the tokens inside one random contiguous span covering ``rate`` of them
    (at least two tokens when ``rate > 0``): local word-order noise that keeps the vocabulary."""
    _check_rate("span shuffle rate", rate)
    items = _tokens(tokens)
    length = min(len(items), max(2, round(rate * len(items)))) if rate > 0 else 0
    if length >= 2:
        start = rng.randrange(len(items) - length + 1)
        span = items[start : start + length]
        rng.shuffle(span)
        items[start : start + length] = span
    return _like(tokens, items)  # type: ignore[return-value]


def augment_text(
    text: str,
    rng: random.Random,
    deletion: float = 0.1,
    masking: float = 0.0,
    shuffle: float = 0.0,
    mask_token: str = "[MASK]",
) -> str:
    """Deletion, then masking, then span shuffle with the given rates (0 skips a step): one token-level
    view for SCT (``papers/001`` §3.1 uses back-translation, which needs MT models that are not
    available offline; these are the cheap substitute, alone or on top of crops)."""
    out = token_deletion(text, rng, deletion) if deletion else text
    out = token_masking(out, rng, masking, mask_token) if masking else out
    return span_shuffle(out, rng, shuffle) if shuffle else out
