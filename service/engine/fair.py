"""A queue that several tenants (API keys) share fairly: deficit round robin by cost.

Deficit round robin (Shreedhar and Varghese, "Efficient fair queuing using deficit round robin", 1995): each
tenant with items waiting holds a credit (its deficit); in its turn it takes items from the head of its own FIFO
while their cost fits the credit, and when the next one does not, it gets ``quantum`` more and the turn passes to
the next tenant. Over time every tenant that keeps items waiting is served the same cost per round, whatever the
number of items (or requests) it queued; a tenant alone is served in plain FIFO order. The batcher's items are
texts and their cost is their tokens, so a key that floods the queue with requests gets the same tokens per round
as a key with a few clients, not the same share as each of its requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items of several tenants, taken in deficit round robin by ``cost(item)``; FIFO within a tenant."""

    def __init__(self, cost: Callable[[T], int], *, quantum: int) -> None:
        if quantum < 1:
            raise ValueError(f"quantum must be at least 1, got {quantum}")
        self.cost = cost
        self.quantum = quantum
        self._queues: dict[str, deque[T]] = {}
        self._ring: deque[str] = deque()  # tenants with items, the one whose turn it is first
        self._deficit: dict[str, int] = {}
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for queue in self._queues.values():
            yield from queue

    def tenants(self) -> list[str]:
        """Tenants with items waiting."""
        return list(self._ring)

    def extend(self, tenant: str, items: Iterable[T]) -> None:
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
        before = len(queue)
        queue.extend(items)
        self._len += len(queue) - before
        if before == 0 and queue:
            self._ring.append(tenant)
            self._deficit[tenant] = self.quantum

    def _turn(self) -> str:
        """The tenant whose head item is served next (moves the turn on while the head does not fit the credit)."""
        while True:
            tenant = self._ring[0]
            if self.cost(self._queues[tenant][0]) <= self._deficit[tenant]:
                return tenant
            self._deficit[tenant] += self.quantum
            self._ring.rotate(-1)

    def peek(self) -> T:
        """The item `popleft` would return (IndexError when empty)."""
        if not self._len:
            raise IndexError("peek from an empty FairQueue")
        return self._queues[self._turn()][0]

    def popleft(self) -> T:
        """The next item in deficit round robin order (IndexError when empty)."""
        if not self._len:
            raise IndexError("pop from an empty FairQueue")
        tenant = self._turn()
        queue = self._queues[tenant]
        item = queue.popleft()
        self._len -= 1
        self._deficit[tenant] -= self.cost(item)
        if not queue:  # an idle tenant keeps no credit (DRR's rule): it cannot save up a burst
            self._ring.popleft()
            del self._deficit[tenant], self._queues[tenant]
        return item

    def remove(self, tenant: str, unwanted: Callable[[T], bool]) -> list[T]:
        """Remove and return the items of ``tenant`` for which ``unwanted`` is true (the others keep their order)."""
        queue = self._queues.get(tenant)
        if queue is None:
            return []
        removed = [item for item in queue if unwanted(item)]
        if not removed:
            return []
        kept = [item for item in queue if not unwanted(item)]
        queue.clear()
        queue.extend(kept)
        self._len -= len(removed)
        if not queue:
            self._ring.remove(tenant)
            del self._deficit[tenant], self._queues[tenant]
        return removed

    def clear(self) -> list[T]:
        """Remove and return every item."""
        items = list(self)
        self._queues.clear()
        self._ring.clear()
        self._deficit.clear()
        self._len = 0
        return items
