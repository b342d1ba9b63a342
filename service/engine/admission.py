"""The server's admission gate: which embedding requests get in, decided before their body is read.

A request that finds the server over its bound (`room` answers an error: too many requests in flight, or every
model's queue over its bound) is not answered 429 at once: it waits in a FIFO line, its body unread, and is let
in the moment there is room — or refused with 429 and an honest ``Retry-After`` once it has waited
``hold_seconds``. Why not refuse at once: a client that retries a 429 immediately (a server must survive impolite
ones) is then back at once, so a retry storm of *k* clients costs as much CPU as both sides can spend on it,
however cheap one refusal is — and on a small machine that CPU is taken from inference. Held, each client costs
at most one refusal per ``hold_seconds``; meanwhile the queue is refilled from the head of the line as soon as it
has room, so the model never waits for a retry to arrive.

The line lets one request in at a time: the next only when the previous one has reached its model's queue
(`Ticket.queued`), so a burst of admissions cannot overshoot the bound before the queue shows their work. A request
still on its way after ``ENTER_GRACE_SECONDS`` (a slow client sending its body) no longer holds the line up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service.errors import ErrorKind, ServiceError

ENTER_GRACE_SECONDS = 0.05  # parsing and tokenising 32 paragraphs takes ~10-20 ms on 2 cores


@dataclass(eq=False)
class Ticket:
    """An admitted request: when it reached the gate and how long it waited in line."""

    gate: AdmissionGate
    arrived: float
    waited: float
    from_line: bool

    def queued(self) -> None:
        """The request's texts are in its model's queue (or it ended before): the line may move (idempotent)."""
        if self.from_line:
            self.from_line = False
            self.gate._entering -= 1
            self.gate.wake()

    def done(self) -> None:
        """The request was answered; call once."""
        self.queued()
        self.gate.in_flight -= 1
        self.gate.wake()


class AdmissionGate:
    """Lets embedding requests in while ``room()`` answers None; holds the others in line (see the module doc).

    ``room()`` is asked on every arrival and whenever the line may move (`wake`: a batch launched, a request
    answered or queued). At most ``max_waiting`` requests wait in line; more are refused at once.
    """

    def __init__(self, room: Callable[[], ServiceError | None], *, hold_seconds: float, max_waiting: int) -> None:
        self.room = room
        self.hold_seconds = hold_seconds
        self.max_waiting = max_waiting
        self.in_flight = 0  # admitted, not yet answered
        self._entering = 0  # let in from the line, not yet in a model's queue
        self._let_in_at = 0.0  # when the line last let a request in
        self._line: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting in line."""
        return len(self._line)

    async def enter(self) -> Ticket | ServiceError:
        """A `Ticket` once the request may go on, or the error to answer it with (429 after the hold)."""
        arrived = time.perf_counter()
        if not self._line:
            refusal = self.room()
            if refusal is None:
                return self._ticket(arrived, from_line=False)
            if self.hold_seconds <= 0:
                return refusal
        if len(self._line) >= self.max_waiting:
            return self.room() or self._line_full()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        self.wake()
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.hold_seconds)
        except TimeoutError:
            if not turn.done():
                self._line.remove(turn)
                refusal = self.room()
                return refusal if refusal is not None else self._ticket(arrived, from_line=False)
        except asyncio.CancelledError:  # the client went away while waiting
            if turn.done():  # it had been let in: free its place for the next one
                self._entering -= 1
                self.wake()
            else:
                self._line.remove(turn)
            raise
        return self._ticket(arrived, from_line=True)

    def wake(self) -> None:
        """Let the head of the line in if there is room and no request let in just before is still on its way."""
        while self._line and self._line_may_move() and self.room() is None:
            self._line.popleft().set_result(None)
            self._entering += 1
            self._let_in_at = time.perf_counter()

    def _line_may_move(self) -> bool:
        return self._entering == 0 or time.perf_counter() - self._let_in_at > ENTER_GRACE_SECONDS

    def _ticket(self, arrived: float, *, from_line: bool) -> Ticket:
        self.in_flight += 1
        return Ticket(self, arrived, waited=time.perf_counter() - arrived, from_line=from_line)

    def _line_full(self) -> ServiceError:
        return ServiceError(
            ErrorKind.overloaded,
            f"the server is overloaded: {len(self._line)} requests are waiting to be admitted; retry after the "
            "number of seconds in Retry-After",
            headers={"Retry-After": "1"},
        )
