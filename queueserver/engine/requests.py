"""The arguments of the requests that create jobs, by name.

Codecs build them, the router or the shard fills in a server-made id
(:func:`with_id`), and the engine takes them as its request's positional
arguments; across the router's link they travel as msgpack arrays in field
order. They are made with ``tuple.__new__`` where every request passes: a
named tuple's own ``__new__`` and ``_replace`` are Python code, an
interpreted call per request even when the callers are compiled.
"""
from __future__ import annotations

from typing import Any, Dict, Final, NamedTuple, Optional, Sequence, Tuple, TypeVar, Union


class AddRequest(NamedTuple):
    """``add``: enqueue one job (durations in ms, ``sched`` in µs)."""

    id: Optional[str]          # None until the server makes one
    name: str
    payload: bytes
    priority: int = 0
    ttr: int = 0               # 0: a lease never runs out
    ttl: int = 0               # 0: never expires
    max_attempts: int = 0
    max_fails: int = 0
    sched: Optional[int] = None
    unique: bool = False       # drop a payload the queue already holds (queued)


class RunRequest(NamedTuple):
    """``run`` (workq): enqueue a job and wait up to ``timeout`` ms for its result."""

    id: str
    name: str
    payload: bytes
    priority: int
    ttr: int
    timeout: int


Request = TypeVar("Request", bound=Union[AddRequest, RunRequest])


def with_id(args: Request, id: str) -> Request:
    """``args`` with the job id the server made (``args._replace(id=id)``)."""
    return tuple.__new__(type(args), (id, *args[1:]))


#: The key of :func:`in_queue`'s arguments that names the queue.
IN_QUEUE: Final = "in_queue"


def in_queue(args: Sequence[Any], queue: str) -> Tuple[Dict[str, Any]]:
    """The arguments of a request naming a job (by id or number, its key
    first), to run only while that job is in ``queue``: a router checked its
    client's permission on the job's queue with one question to the shard,
    and a job deleted and made again with the same id in another queue
    before the request arrives must not be reached (the shard finds no such
    job instead; see ``Shard._serve_channel``). A single map, which no
    request of the engine takes, says it."""
    return ({IN_QUEUE: queue, "args": list(args)},)
