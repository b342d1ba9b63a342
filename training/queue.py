"""A FIFO instance queue of embeddings: the memory of past reference vectors SCT compares against.

``papers/001`` §3.1 ("Instance Queues"): two queues D₁, D₂ of the reference representations of view 1
and view 2, length k, first-in-first-out, "initialized by randomly generating vectors" (§4.1). The
queue is an ``nn.Module`` whose storage is a *buffer*, so it follows the module's ``.to(device,
dtype)``, is saved in ``state_dict`` (resume continues with the same memory) and is never a parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class InstanceQueue(nn.Module):
    """``size`` vectors of dimension ``dim``, random unit vectors at first, overwritten oldest-first.

    ``vectors`` is the storage in slot order (not age order — a softmax over the queue does not care);
    :meth:`ordered` returns it oldest → newest. ``enqueue(x)`` takes ``(B, dim)`` or ``(dim,)``; with
    ``B > size`` only the newest ``size`` rows are kept. The storage dtype/device follow the module;
    enqueued vectors are detached, cast and moved to it.
    """

    vectors: Tensor
    pointer: Tensor

    def __init__(self, size: int, dim: int, generator: torch.Generator | None = None) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"queue size must be >= 1, got {size} (paper 001 Table 1 uses 16384-131072)")
        if dim < 1:
            raise ValueError(f"queue dim must be >= 1, got {dim}: pass the reference embedding dimension")
        self.register_buffer("vectors", F.normalize(torch.randn(size, dim, generator=generator), dim=-1))
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))  # next slot to overwrite

    @property
    def size(self) -> int:
        return self.vectors.shape[0]

    @property
    def dim(self) -> int:
        return self.vectors.shape[1]

    @torch.no_grad()
    def enqueue(self, x: Tensor) -> None:
        """Write ``x`` over the oldest entries (first in, first out)."""
        x = x.detach()
        x = x[None] if x.ndim == 1 else x
        if x.ndim != 2 or x.shape[-1] != self.dim:
            raise ValueError(
                f"cannot enqueue a tensor of shape {tuple(x.shape)} into a queue of dim {self.dim}: "
                f"pass (B, {self.dim})"
            )
        x = x[-self.size :].to(device=self.vectors.device, dtype=self.vectors.dtype)  # (n <= size, dim)
        n, start = x.shape[0], int(self.pointer)
        slots = (start + torch.arange(n, device=self.vectors.device)) % self.size
        self.vectors[slots] = x
        self.pointer.fill_((start + n) % self.size)

    def ordered(self) -> Tensor:
        """The contents oldest → newest, ``(size, dim)``."""
        return torch.roll(self.vectors, shifts=-int(self.pointer), dims=0)

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}"
