"""A named queue: its ready jobs in serving order, its sleeping scheduled
jobs, and the lease waiters parked on it.

Jobs enter and leave only through the methods below, so the optional
content index (sha256 of each waiting payload, for queued's ``HAS`` and
de-duplication) stays exact. The index is built the first time a queue is
asked for it; queues nobody asks about pay nothing.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import TYPE_CHECKING, Dict, Optional

from sortedcontainers import SortedKeyList

from .job import Job, schedule_key
from .timers import Line, discarded, job_line, remove_from

if TYPE_CHECKING:
    from .engine import Waiter


def schedule_line() -> Line[Job]:
    """Sleeping jobs by ``(sched, number)``: a ``SortedKeyList`` by
    :func:`schedule_key`, which keeps the int it makes beside each job (~56 B
    a sleeping job; a job sorts by its ready-queue key, where priority
    comes first, so no line of jobs in their own order could do)."""
    line: Line[Job] = SortedKeyList(key=schedule_key)
    return line


def digest(payload: bytes) -> bytes:
    return hashlib.sha256(payload).digest()


class JobQueue:
    __slots__ = ("name", "ready", "scheduled", "waiters", "jobs", "_digests")

    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs = 0  # jobs of this queue in any state: it may go only at 0
        self.ready = job_line()   # by job.key: priority, schedule, creation, number
        self.scheduled = schedule_line()  # by (sched, number)
        # Insertion-ordered set: the first waiter is served first.
        self.waiters: Dict[Waiter, None] = {}
        #: payload digest -> how many waiting jobs have it (None: not asked for yet)
        self._digests: Optional[Counter[bytes]] = None

    # Membership: every way in and out of the queue.
    def push(self, job: Job) -> None:
        self.ready.add(job)
        if self._digests is not None:
            self._digests[digest(job.payload)] += 1

    def remove(self, job: Job) -> None:
        remove_from(self.ready, job)
        if self._digests is not None:
            self._forget_digest(job)

    def discard(self, job: Job) -> None:
        if discarded(self.ready, job) and self._digests is not None:
            self._forget_digest(job)

    def sleep(self, job: Job) -> None:
        self.scheduled.add(job)
        if self._digests is not None:
            self._digests[digest(job.payload)] += 1

    def unsleep(self, job: Job) -> None:
        remove_from(self.scheduled, job)
        if self._digests is not None:
            self._forget_digest(job)

    def wake(self, job: Job) -> None:
        """A scheduled job's time came: it moves to the ready line, still present."""
        remove_from(self.scheduled, job)
        self.ready.add(job)

    def _forget_digest(self, job: Job) -> None:
        """Called only once the index exists."""
        digests = self._digests
        assert digests is not None
        key = digest(job.payload)
        left = digests[key] - 1
        if left:
            digests[key] = left
        else:
            del digests[key]

    def holds(self, content_digest: bytes) -> bool:
        """Whether a waiting (ready or scheduled) job has this payload digest."""
        if self._digests is None:
            self._digests = Counter(digest(j.payload) for j in self.ready)
            self._digests.update(digest(j.payload) for j in self.scheduled)
        return self._digests.get(content_digest, 0) > 0

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<JobQueue {self.name} ready={len(self.ready)} scheduled={len(self.scheduled)}>"
