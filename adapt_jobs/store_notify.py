"""Wake-ups from the job store on PostgreSQL: LISTEN/NOTIFY, so an idle worker claims a job as soon as one becomes
claimable and an event stream sends an event as soon as it is committed, instead of at their next poll.

The store sends the notifications in the same transaction as the change (`adapt_jobs.store_core`), so they arrive only
once it committed: ``adapt_claimable`` when a job is queued, goes back to the queue or ends (a slot frees, a build
a job waits for succeeds), ``adapt_events`` with the job's id when an event is added. One listener thread per process
holds its own connection, LISTENs on both, and reconnects after losing it (then wakes every waiter, since it may
have missed something). Polling stays: a waiter still wakes after its poll interval, which is all a SQLite store, or
a PostgreSQL store whose listener is down, gets. An event stream is also woken by `EventPoller`: one read of the
event counters of every job streamed from this process per poll, whatever the number of streams — SQLite's only
wake-up, and PostgreSQL's where notifications never arrive (a connection pooler in transaction mode drops LISTEN).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
import sqlalchemy as sa

log = logging.getLogger(__name__)

CLAIMABLE_CHANNEL = "adapt_claimable"
EVENTS_CHANNEL = "adapt_events"
_RECONNECT_S = 1.0
_WAIT_S = 1.0  # how often the listener looks at whether it was closed

Wake = Callable[[], None]


class Listener:
    """One LISTEN connection shared by every waiter of a process; each waiter arms a one-shot callback."""

    def __init__(self, url: sa.URL, connect_timeout_s: float) -> None:
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._connect_timeout = max(1, int(connect_timeout_s))
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[Wake]] = {}
        self._closed = threading.Event()
        self.listening = threading.Event()  # set while a LISTEN connection is up
        self._thread = threading.Thread(target=self._run, name="adapt-store-listener", daemon=True)
        self._thread.start()

    def arm(self, channel: str, key: str, wake: Wake) -> Callable[[], None]:
        """Call ``wake`` once, on the next notification on ``channel`` (with payload ``key``; "" for any). Returns
        the function that disarms it (a waiter that timed out)."""
        with self._lock:
            self._waiters.setdefault((channel, key), set()).add(wake)

        def disarm() -> None:
            with self._lock:
                waiters = self._waiters.get((channel, key))
                if waiters is not None:
                    waiters.discard(wake)
                    if not waiters:
                        del self._waiters[(channel, key)]

        return disarm

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=_WAIT_S + self._connect_timeout + 1)

    def _fire(self, keys: list[tuple[str, str]] | None) -> None:
        with self._lock:
            keys = list(self._waiters) if keys is None else keys
            woken = [wake for key in keys for wake in self._waiters.pop(key, ())]
        for wake in woken:
            try:
                wake()
            except Exception:  # a waiter gone (its event loop closed) must not end the listener
                log.debug("adapt: a store waiter could not be woken", exc_info=True)

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._connect_timeout) as conn:
                    conn.execute(f"LISTEN {CLAIMABLE_CHANNEL}")
                    conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self.listening.set()
                    failures = 0
                    self._fire(None)  # whatever happened while we were not listening
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=_WAIT_S):
                            key = "" if note.channel == CLAIMABLE_CHANNEL else note.payload
                            self._fire([(note.channel, key)])
            except psycopg.Error as err:
                failures += 1
                if failures == 1 and not self._closed.is_set():  # once per outage: the poll still runs meanwhile
                    log.warning("adapt: the job store's listener lost its connection, reconnecting: %s", err)
            finally:
                self.listening.clear()
            self._closed.wait(_RECONNECT_S)


class EventPoller:
    """Event streams woken by polling (SQLite's only wake-up; PostgreSQL's fallback): one thread per process reads
    the event counter of every job a stream waits on, in one query per poll, and wakes each stream whose job has
    events past the last one it read. However many streams wait, the store is read once per poll, not once per
    stream per poll. ``read_seqs`` maps job ids to their event counters (a missing job counts as changed); it may
    raise while the store is unavailable, and the next poll tries again."""

    def __init__(self, read_seqs: Callable[[list[str]], dict[str, int]], every_s: float) -> None:
        self._read_seqs = read_seqs
        self._every_s = every_s
        self._lock = threading.Lock()
        self._waiters: dict[str, dict[Wake, int]] = {}  # job id -> {wake: the last event id its stream read}
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, job_id: str, after_seq: int, wake: Wake) -> Callable[[], None]:
        """Call ``wake`` once, at the first poll that finds an event of ``job_id`` after ``after_seq``."""
        with self._lock:
            self._waiters.setdefault(job_id, {})[wake] = after_seq
            if self._thread is None and not self._closed.is_set():
                self._thread = threading.Thread(target=self._run, name="adapt-store-poller", daemon=True)
                self._thread.start()

        def disarm() -> None:
            with self._lock:
                waiters = self._waiters.get(job_id)
                if waiters is not None:
                    waiters.pop(wake, None)
                    if not waiters:
                        del self._waiters[job_id]

        return disarm

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every_s + 5)

    def _run(self) -> None:
        while not self._closed.wait(self._every_s):
            with self._lock:
                ids = list(self._waiters)
            if not ids:
                continue
            try:
                seqs = self._read_seqs(ids)
            except Exception as err:  # the store unavailable: the streams' own slow poll covers the gap
                log.debug("adapt: the event poller could not read the store: %s", err)
                continue
            woken: list[Wake] = []
            with self._lock:
                for job_id in ids:
                    waiters = self._waiters.get(job_id, {})
                    seq = seqs.get(job_id)
                    for wake, after in list(waiters.items()):
                        if seq is None or seq > after:
                            woken.append(wake)
                            del waiters[wake]
                    if not waiters:
                        self._waiters.pop(job_id, None)
            for wake in woken:
                try:
                    wake()
                except Exception:  # a waiter gone (its event loop closed) must not end the poller
                    log.debug("adapt: a store waiter could not be woken", exc_info=True)
