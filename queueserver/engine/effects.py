"""What one engine step caused: the engine returns it, the shell carries it out.

The engine does no I/O, so everything a request or a timer run sets in
motion beyond its own answer comes back in one value: answers to *other*
requests that were parked (a lease that an ``add`` satisfied, a ``result``
that a ``complete`` settled), the state changes in the order they happened
(what a durable shard writes to its log before anyone hears of them), and
which jobs appeared on or left the shard (what routers' directories need).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from .status import Reply

Event = Tuple[Any, ...]


class Effects:
    """The outcome of one :meth:`Engine.execute` or :meth:`Engine.advance`."""

    __slots__ = ("reply", "later", "events", "placed", "forgotten", "history")

    def __init__(self) -> None:
        #: the request's own answer; None when it now waits (or for a timer run)
        self.reply: Optional[Reply] = None
        #: ``(token, reply)`` answers to requests parked earlier
        self.later: List[Tuple[Any, Reply]] = []
        #: the state changes, in order (:meth:`Engine.replay` rebuilds from them)
        self.events: List[Event] = []
        #: ids of the jobs that came to exist here
        self.placed: List[str] = []
        #: ids of the jobs that left (deleted, expired, taken)
        self.forgotten: List[str] = []
        #: with the engine's ``history`` on: ``(event kind, job id, queue, number,
        #: attempts, priority, payload size, state after, lessee token)`` per
        #: event, in order (the lessee: the request a lease went to)
        self.history: Optional[List[Tuple[Any, ...]]] = None

    def __repr__(self) -> str:
        return (f"<Effects reply={self.reply!r} later={self.later!r} events={len(self.events)} "
                f"placed={self.placed!r} forgotten={self.forgotten!r}>")
