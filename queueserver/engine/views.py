"""What the engine answers about a job, for every protocol.

Each view is a named tuple: the same value in a shard that serves a
connection directly, and (as a msgpack array, read back with
:func:`as_lease`, or unpacked in field order) in a router that forwarded
the request.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from .job import Job
from .ops import UNDOES
from .status import Reply


class LeaseView(NamedTuple):
    """A leased (or taken) job."""

    id: str
    name: str
    payload: bytes
    number: int
    priority: int
    ttr: int
    attempts: int          # lets a router undo an undelivered lease exactly
    order: Sequence[int]   # (-priority, schedule, creation, number): compares jobs across shards
    shard: int = 0         # where it lives


def as_lease(value: Sequence[Any]) -> LeaseView:
    """A lease view from either side of the link (a msgpack array there)."""
    return value if type(value) is LeaseView else LeaseView(*value)


def lease_view(job: Job, shard: int = 0) -> LeaseView:
    order = job.order  # (-priority, sched, created, number), unpacked once
    # tuple.__new__ itself: a named tuple's own __new__ is Python code, an
    # interpreted call on every lease even when this module is compiled.
    return tuple.__new__(LeaseView, (job.id, job.name, job.payload, order[3], -order[0], job.ttr,
                                     job.attempts, order, shard))


class ResultView(NamedTuple):
    """A finished job's outcome (``result``, ``run``)."""

    id: str
    success: int           # 1 or 0
    result: bytes


class JobView(NamedTuple):
    """What ``inspect job`` shows, in the order the original workq server listed it."""

    id: str
    name: str
    ttr: int
    ttl: int
    payload: bytes
    max_attempts: int
    attempts: int
    max_fails: int
    fails: int
    priority: int
    state: int
    created: int               # µs
    sched: Optional[int]       # µs; None unless the job was scheduled


def result_view(job: Job) -> ResultView:
    return ResultView(job.id, 1 if job.success else 0, job.result or b"")


def inspect_view(job: Job) -> JobView:
    return JobView(job.id, job.name, job.ttr, job.ttl, job.payload, max(job.max_attempts, 0),
                   job.attempts, job.max_fails, job.fails, job.priority, job.state,
                   job.created, job.sched if job.scheduled else None)


def undo_delivery(op: str, reply: Reply) -> Optional[Tuple[str, List[Any], LeaseView]]:
    """The engine request that gives back a job ``reply`` delivered to a
    client that had left (the table of operations names it: ``unlease`` a
    lease, ``restore`` a take), its arguments, and the job's view; None when
    the answer delivered no job."""
    if reply[0] != 0:
        return None
    undo = UNDOES.get(op)
    if undo is None:
        return None
    view = as_lease(reply[1])
    if undo == "unlease":   # the lease it undoes, exactly: by its attempt
        return undo, [view.id, view.attempts], view
    return undo, [view], view   # ("restore": the job again, at its place)
