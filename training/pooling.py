"""Pooling token states into one vector per text. Pure tensor code, traceable to ONNX."""

from __future__ import annotations

import torch

from core.model_folder import POOLING_MODES


def check_pooling(mode: str) -> str:
    if mode not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
    return mode


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Pool token states ``(B, T, H)`` into ``(B, H)``.

    - ``mean``: average over real tokens (padding masked out), as sentence-transformers does;
    - ``cls``: the first token;
    - ``last``: the last real token ([SEP] for BERT-style tokenizers). Assumes right padding,
      which `Encoder` enforces;
    - ``max``: each dimension's largest value over the real tokens;
    - ``mean_sqrt_len``: the sum over real tokens divided by the square root of their count.
    """
    if mode in ("mean", "mean_sqrt_len"):
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        count = mask.sum(dim=1).clamp(min=1e-9)
        return (hidden * mask).sum(dim=1) / (count if mode == "mean" else count.sqrt())
    if mode == "max":
        real = attention_mask.unsqueeze(-1).bool()  # (B, T, 1)
        return hidden.masked_fill(~real, -1e9).max(dim=1).values
    if mode == "cls":
        return hidden[:, 0]
    if mode == "last":
        last = attention_mask.sum(dim=1).long() - 1  # (B,)
        index = last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])  # (B, 1, H)
        return hidden.gather(1, index).squeeze(1)
    raise ValueError(f"pooling must be one of {POOLING_MODES}, got {mode!r}")
