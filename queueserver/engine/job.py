"""The job record every protocol shares, and its states.

A job is one object with fixed slots: all five protocols map onto these
fields, so a job added over one protocol can be taken over any other.
Times are integer microseconds since the Unix epoch; durations given by
clients (TTR, TTL) are kept in their original milliseconds.
"""
from __future__ import annotations

from typing import Optional

NEW = 0
COMPLETED = 1
FAILED = 2
PENDING = 3
LEASED = 4

#: Hard cap on attempts when a workq job says "unlimited" (max-attempts 0).
ATTEMPTS_CAP = 255
#: max_attempts of jobs from protocols with no attempt limit at all.
UNLIMITED_ATTEMPTS = -1


class Job:
    """One job. ``order`` is its place in a ready queue (smallest first)."""

    kind = "ttl"  # as an entry of the shard's timers, a job stands for its TTL

    __slots__ = (
        "id", "number", "name", "payload", "priority", "ttr", "ttl",
        "max_attempts", "max_fails", "attempts", "fails", "state",
        "created", "sched", "result", "order", "timer", "due", "foreground", "scheduled",
    )

    def __init__(
        self,
        id: str,
        number: int,
        name: str,
        payload: bytes,
        *,
        priority: int = 0,
        ttr: int = 0,
        ttl: int = 0,
        max_attempts: int = 0,
        max_fails: int = 0,
        created: int = 0,
        sched: Optional[int] = None,
        foreground: bool = False,
        scheduled: bool = False,
    ) -> None:
        self.id = id
        self.number = number
        self.name = name
        self.payload = payload
        self.priority = priority
        self.ttr = ttr                      # ms; 0 means the lease never times out
        self.ttl = ttl                      # ms; 0 means the job never expires
        self.max_attempts = max_attempts    # 0: up to ATTEMPTS_CAP; UNLIMITED_ATTEMPTS: no cap
        self.max_fails = max_fails
        self.attempts = 0
        self.fails = 0
        self.state = NEW
        self.created = created
        self.sched = created if sched is None else sched
        self.result: Optional[bytes] = None
        # Higher priority first, then earlier schedule, creation, arrival.
        self.order = (-priority, self.sched, created, number)
        self.timer = None        # the wake-up or TTR Timer, if any
        self.due: Optional[int] = None  # when the TTL evicts it; the job is its own TTL timer
        self.foreground = foreground  # a `run` job: removed once its caller has its answer
        self.scheduled = scheduled    # added by `schedule`: inspect shows its time

    @property
    def attempts_left(self) -> bool:
        if self.max_attempts < 0:
            return True
        return self.attempts < (self.max_attempts or ATTEMPTS_CAP)

    @property
    def success(self) -> bool:
        return self.state == COMPLETED

    @property
    def finished(self) -> bool:
        return self.state == COMPLETED or self.state == FAILED

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<Job {self.id} {self.name} state={self.state} attempts={self.attempts}>"
