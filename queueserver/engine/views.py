"""What the engine answers about a job, for every protocol.

A lease is a named tuple: the same value in a shard that serves a
connection directly, and (as a msgpack array, read back with
:func:`as_lease`) in a router that forwarded the request.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from .job import Job


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


def as_lease(value: Any) -> LeaseView:
    """A lease view from either side of the link (a msgpack array there)."""
    return value if type(value) is LeaseView else LeaseView(*value)


def lease_view(job: Job, shard: int = 0) -> LeaseView:
    order = job.order  # (-priority, sched, created, number), unpacked once
    return LeaseView(job.id, job.name, job.payload, order[3], -order[0], job.ttr,
                     job.attempts, order, shard)


def result_view(job: Job) -> list:
    """``[id, success (1 or 0), result]``."""
    return [job.id, 1 if job.success else 0, job.result or b""]


def inspect_view(job: Job) -> list:
    """The 13 values ``inspect job`` shows, in the seed's order."""
    return [job.id, job.name, job.ttr, job.ttl, job.payload, max(job.max_attempts, 0),
            job.attempts, job.max_fails, job.fails, job.priority, job.state,
            job.created, job.sched if job.scheduled else None]


def undo_delivery(op: str, reply: list) -> Optional[Tuple[str, List[Any], LeaseView]]:
    """The engine request that gives back a job ``reply`` delivered to a
    client that had left (``unlease`` a lease, ``restore`` a take), with the
    job's view; None when the answer delivered no job."""
    if reply[0] != 0 or (op != "lease" and op != "take"):
        return None
    view = as_lease(reply[1])
    if op == "lease":
        return "unlease", [view.id, view.attempts], view
    return "restore", [view], view
