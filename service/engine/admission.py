"""The server's admission: which embedding requests get in, decided before their body is read.

A request that finds the server over its bound (`room` answers an error: too many requests in flight, or every
model's queue over its bound) is not answered 429 at once: it waits in a FIFO line, its body unread, and is let
in the moment there is room — or refused with 429 and an honest ``Retry-After`` once it has waited
``hold_seconds``. Why not refuse at once: a client that retries a 429 immediately (a server must survive impolite
ones) is then back at once, so a retry storm of *k* clients costs as much CPU as both sides can spend on it,
however cheap one refusal is — and on a small machine that CPU is taken from inference. Held, each client costs
at most one refusal per ``hold_seconds``; meanwhile the queue is refilled from the head of the line as soon as it
has room, so the model never waits for a retry to arrive.

Callers (API keys) share the line fairly. Each key waits in its own FIFO, and when there is room the line lets
in the head of the key with the fewest requests in flight — so under overload a key that floods the server
cannot hold more than its share of the slots while others wait: as its requests finish, the slots go to the
keys that have fewer. A newcomer goes straight in (when there is room for it) unless a request of a key with no
more in flight than its own is waiting. When the line is full, a newcomer of a key with fewer waiting than the
longest line takes the place of that key's newest waiter (which is refused), so one key cannot fill the line
either. `room` is asked per key, so the queues' per-key bounds (`service.engine.batcher`) apply here too.

The line lets one request in at a time: the next only when the previous one has reached its model's queue
(`Ticket.queued`), so a burst of admissions cannot overshoot the bound before the queue shows their work. A request
still on its way after ``ENTER_GRACE_SECONDS`` (a slow client sending its body) no longer holds the line up.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from service.auth import ANONYMOUS
from service.errors import ErrorKind, ServiceError

ENTER_GRACE_SECONDS = 0.05  # parsing and tokenising 32 paragraphs takes ~10-20 ms on 2 cores

Room = Callable[[str], "ServiceError | None"]  # admission's question, per key id: None if a request may go on


@dataclass(eq=False)
class Ticket:
    """An admitted request: whose it is, when it reached admission and how long it waited in line."""

    admission: Admission
    arrived: float
    waited: float
    from_line: bool
    tenant: str = ANONYMOUS

    def queued(self) -> None:
        """The request's texts are in its model's queue (or it ended before): the line may move (idempotent)."""
        if self.from_line:
            self.from_line = False
            self.admission._entering -= 1
            self.admission.wake()

    def done(self) -> None:
        """The request was answered; call once."""
        self.queued()
        self.admission._leave(self.tenant)
        self.admission.wake()


@dataclass(eq=False)
class _Waiter:
    turn: asyncio.Future[ServiceError | None]  # None: let in; an error: refused (its place given to another key)
    arrived: float


class Admission:
    """Lets embedding requests in while ``room(key)`` answers None; holds the others in line, one line per key
    (see the module doc).

    ``room`` is asked on every arrival and whenever the line may move (`wake`: a batch launched, a request
    answered or queued). At most ``max_waiting`` requests wait in line, all keys together.
    """

    def __init__(self, room: Room, *, hold_seconds: float, max_waiting: int) -> None:
        self.room = room
        self.hold_seconds = hold_seconds
        self.max_waiting = max_waiting
        self.in_flight = 0  # admitted, not yet answered
        self.in_flight_by: Counter[str] = Counter()
        self._entering = 0  # let in from the line, not yet in a model's queue
        self._let_in_at = 0.0  # when the line last let a request in
        self._lines: dict[str, deque[_Waiter]] = {}

    @property
    def waiting(self) -> int:
        """Requests waiting in line, all keys together."""
        return sum(len(line) for line in self._lines.values())

    async def enter(self, tenant: str = ANONYMOUS) -> Ticket | ServiceError:
        """A `Ticket` once the request of key ``tenant`` may go on, or the error to answer it with (429 after the
        hold, or at once when the line is full)."""
        arrived = time.perf_counter()
        if not self._waits_ahead(tenant):
            refusal = self.room(tenant)
            if refusal is None:
                return self._ticket(arrived, tenant, from_line=False)
            if self.hold_seconds <= 0:
                return refusal
        if self.waiting >= self.max_waiting and not self._make_place(tenant):
            return self.room(tenant) or self._line_full()
        waiter = _Waiter(asyncio.get_running_loop().create_future(), arrived)
        line = self._lines.setdefault(tenant, deque())
        line.append(waiter)
        self.wake()
        turn = waiter.turn
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.hold_seconds)
        except TimeoutError:
            if not turn.done():
                self._remove(tenant, waiter)
                refusal = self.room(tenant)
                return refusal if refusal is not None else self._ticket(arrived, tenant, from_line=False)
        except asyncio.CancelledError:  # the client went away while waiting
            if not turn.done():
                self._remove(tenant, waiter)
            elif turn.result() is None:  # it had been let in: free its place for the next one
                self._entering -= 1
                self._leave(tenant)
                self.wake()
            raise
        refused = turn.result()
        if refused is not None:
            return refused
        return Ticket(self, arrived, waited=time.perf_counter() - arrived, from_line=True, tenant=tenant)

    def wake(self) -> None:
        """Let the head of the line of the key with the fewest requests in flight in, while there is room for it
        and no request let in just before is still on its way."""
        while self._lines and self._line_may_move():
            for tenant in sorted(self._lines, key=self._priority):
                if self.room(tenant) is None:
                    self._let_in(tenant)
                    break
            else:
                return

    def _priority(self, tenant: str) -> tuple[int, float]:
        """Fewest in flight first; between keys with as many, the one waiting longest."""
        return self.in_flight_by[tenant], self._lines[tenant][0].arrived

    def _waits_ahead(self, tenant: str) -> bool:
        """Whether a request that a newcomer of ``tenant`` must not overtake is waiting: one of its own key, or
        of a key with no more requests in flight."""
        mine = self.in_flight_by[tenant]
        return any(other == tenant or self.in_flight_by[other] <= mine for other in self._lines)

    def _let_in(self, tenant: str) -> None:
        waiter = self._remove(tenant, self._lines[tenant][0])
        waiter.turn.set_result(None)
        self.in_flight += 1
        self.in_flight_by[tenant] += 1
        self._entering += 1
        self._let_in_at = time.perf_counter()

    def _make_place(self, tenant: str) -> bool:
        """The line is full: refuse the newest waiter of the key with the longest line, if that line is longer
        than ``tenant``'s, so that ``tenant`` may wait in its place."""
        longest = max(self._lines, key=lambda other: len(self._lines[other]))
        if len(self._lines[longest]) <= len(self._lines.get(tenant, ())) + 1:
            return False
        waiter = self._lines[longest].pop()
        waiter.turn.set_result(self._line_full())
        return True

    def _remove(self, tenant: str, waiter: _Waiter) -> _Waiter:
        line = self._lines[tenant]
        line.remove(waiter)
        if not line:
            del self._lines[tenant]
        return waiter

    def _leave(self, tenant: str) -> None:
        self.in_flight -= 1
        self.in_flight_by[tenant] -= 1
        if self.in_flight_by[tenant] <= 0:
            del self.in_flight_by[tenant]

    def _line_may_move(self) -> bool:
        return self._entering == 0 or time.perf_counter() - self._let_in_at > ENTER_GRACE_SECONDS

    def _ticket(self, arrived: float, tenant: str, *, from_line: bool) -> Ticket:
        self.in_flight += 1
        self.in_flight_by[tenant] += 1
        return Ticket(self, arrived, waited=time.perf_counter() - arrived, from_line=from_line, tenant=tenant)

    def _line_full(self) -> ServiceError:
        return ServiceError(
            ErrorKind.overloaded,
            f"the server is overloaded: {self.waiting} requests are waiting to be admitted; retry after the "
            "number of seconds in Retry-After",
            headers={"Retry-After": "1"},
        )
