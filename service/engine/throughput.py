"""A model's recent throughput in tokens per second: what the admission's wait bound and ``Retry-After`` read."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Throughput:
    """Recent delivered tokens per second of busy wall-clock time, for admission and Retry-After.

    * Tokens, not texts: a batch costs about its tokens, so a queue of paragraphs is not mistaken for
      a queue of short sentences (on 2 cores they run at ~44 and ~370 texts/s but similar tokens/s).
    * Busy wall-clock time: a batch's interval runs from its launch to the moment the event loop
      collects its result, and the next batch is launched only then, so the intervals tile the time
      the model was busy, including the loop's delay in collecting results under load (capacity
      really lost); idle gaps between requests say nothing about capacity and are left out.
    * Decayed sums, not an average of per-batch rates: tokens over seconds weighs each batch by its
      time, where averaging rates lets many small fast batches overstate the capacity.
      ``horizon_seconds`` of busy time is the decay constant: shorter follows a change of workload
      sooner but is noisier.
    """

    horizon_seconds: float = 2.0
    tokens: float = 0.0
    seconds: float = 0.0
    batches: int = 0

    @property
    def tokens_per_second(self) -> float | None:
        """None until a batch has been delivered (cold start)."""
        return self.tokens / self.seconds if self.seconds > 0 else None

    def update(self, tokens: int, seconds: float) -> None:
        keep = math.exp(-seconds / self.horizon_seconds)
        self.tokens = self.tokens * keep + tokens
        self.seconds = self.seconds * keep + seconds
        self.batches += 1
