"""A named queue: its ready jobs in serving order, its sleeping scheduled
jobs, and the lease waiters parked on it."""
from __future__ import annotations

from operator import attrgetter
from typing import Dict

from sortedcontainers import SortedKeyList

from .job import Job

_by_order = attrgetter("order")
_by_schedule = attrgetter("sched", "number")


class JobQueue:
    __slots__ = ("name", "ready", "scheduled", "waiters")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready: SortedKeyList = SortedKeyList(key=_by_order)
        self.scheduled: SortedKeyList = SortedKeyList(key=_by_schedule)
        # Insertion-ordered set: the first waiter is served first.
        self.waiters: Dict[object, None] = {}

    def best(self) -> Job | None:
        return self.ready[0] if self.ready else None

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<JobQueue {self.name} ready={len(self.ready)} scheduled={len(self.scheduled)}>"
