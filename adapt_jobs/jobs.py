"""What an /adapt job is: its states and the transitions between them, its records (`Job`, `Event`), a worker's
`Lease` on one attempt, and the errors of the job store. Pure standard library: every process imports it.

States and the transitions the store allows::

    queued ──▶ running ──▶ evaluating ──▶ succeeded
      ▲  │        │             │
      │  │        ├─────────────┴──▶ failed      (reason: corpus | training | export | evaluation | publish | spec |
      │  │        │                               student | interrupted | internal;
      │  ├──────────────────────────▶ failed      dependency: the job it waited for failed)
      │  └────────┴─────────────┴──▶ cancelled
      └───────────┴─────────────┘   back to the queue: the worker stopped (drain), or its lease lapsed
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

QUEUED, RUNNING, EVALUATING = "queued", "running", "evaluating"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
ACTIVE_STATES = (RUNNING, EVALUATING)
TERMINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)
ALL_STATES = (QUEUED, RUNNING, EVALUATING, SUCCEEDED, FAILED, CANCELLED)

# Allowed transitions; anything else is a programming error (raised, never silently applied).
TRANSITIONS: dict[str, tuple[str, ...]] = {
    QUEUED: (RUNNING, CANCELLED, FAILED),
    RUNNING: (EVALUATING, QUEUED, SUCCEEDED, FAILED, CANCELLED),
    EVALUATING: (QUEUED, SUCCEEDED, FAILED, CANCELLED),
    SUCCEEDED: (),
    FAILED: (),
    CANCELLED: (),
}

# What a job does: adapt a model to a corpus (the /adapt request), or build a base student once.
JOB_KIND_ADAPT, JOB_KIND_STUDENT_BUILD = "adapt", "student-build"
DEPENDENCY_FAILED = "dependency"  # the failure reason of a job whose `after_job` failed or was cancelled

INTERRUPTED = "interrupted"  # a failure reason, and the outcome of an attempt whose worker died
HANDED_BACK = "handed_back"  # the outcome of an attempt whose worker stopped on purpose (not counted)
PRUNED = "pruned"  # what became of an ended job removed past its retention (`Ended.state`)

# The event of a job whose corpus was deleted because it will never run (data: reason).
CORPUS_REMOVED_EVENT = "corpus_removed"

# Audit: an event of this type records who created, cancelled or promoted a job (data: action, actor, name).
AUDIT_EVENT = "audit"


class JobStoreError(RuntimeError):
    """A job that does not exist, or a state change the state machine does not allow."""


class JobNotFound(JobStoreError):
    """No job has this id."""


class StoreUnavailable(JobStoreError):
    """The store cannot be reached or is locked past its timeout (a database restarting, a network outage)."""


class LeaseLost(JobStoreError):
    """This worker no longer holds the job: its lease lapsed and the job was taken back, or it ended."""


class QueueFullError(JobStoreError):
    """The bounded queue of pending jobs is full; the client should retry later."""

    def __init__(self, pending: int, limit: int) -> None:
        super().__init__(
            f"the adapt queue is full ({pending} jobs pending, limit {limit}); retry when a job has finished"
        )
        self.pending = pending
        self.limit = limit


@dataclass(frozen=True)
class Lease:
    """A worker's hold on one attempt of one job; every write the worker makes must match it."""

    job_id: str
    worker_id: str
    attempt: int


@dataclass
class Job:
    """One row of the jobs table."""

    id: str
    state: str
    created_at: float
    params: dict[str, Any]
    corpus_dir: str
    n_documents: int
    started_at: float | None = None
    finished_at: float | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    worker_id: str | None = None
    heartbeat_at: float | None = None
    lease_expires_at: float | None = None
    attempt: int = 0
    max_attempts: int = 1
    attempts: list[dict[str, Any]] = field(default_factory=list)
    kind: str = JOB_KIND_ADAPT
    after_job: str | None = None  # a job this one waits for: claimed only once it succeeded
    created_by: str | None = None  # the creator's API key id (`service.auth.key_id`); None on an open server

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def lease(self) -> Lease:
        if self.worker_id is None:
            raise JobStoreError(f"adapt job {self.id} is not held by a worker")
        return Lease(self.id, self.worker_id, self.attempt)


@dataclass
class Event:
    id: int  # the job's own sequence number (1, 2, ...): what SSE clients resume from
    job_id: str
    created_at: float
    type: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Ended:
    """A job a rescuer or supervisor took back from a dead worker, one failed because the job it waited for did not
    succeed, or one pruned past its retention: what became of it, and the folder of its corpus."""

    job_id: str
    state: str  # queued (retried), failed (attempts spent or dependency) or cancelled; or pruned
    corpus_dir: str


def audit_record(action: str, actor: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """An ``audit`` event's data: what was done (``created``, ``cancelled``, ``promoted``) to which model name, by
    whom (an API key id, `service.auth.key_id`; None on a server without keys; for a promotion, the worker's id)."""
    return {"action": action, "actor": actor, "name": params.get("name")}


def new_job_id() -> str:
    """``adaptjob-`` + 24 hex characters (shape after OpenAI's ``ftjob-...`` ids)."""
    return "adaptjob-" + secrets.token_hex(12)


def close_attempt(attempts: list[dict[str, Any]], now: float, outcome: str) -> list[dict[str, Any]]:
    """The attempts list with its last (open) entry ended at ``now`` with ``outcome``."""
    if not attempts or "outcome" in attempts[-1]:
        return list(attempts)
    return [*attempts[:-1], {**attempts[-1], "ended_at": now, "outcome": outcome}]
