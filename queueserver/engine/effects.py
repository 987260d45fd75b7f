"""What one engine step caused: the engine returns it, the shell carries it out.

The engine does no I/O, so everything a request or a timer run sets in
motion beyond its own answer comes back in one value: answers to *other*
requests that were parked (a lease that an ``add`` satisfied, a ``result``
that a ``complete`` settled), the state changes in the order they happened
(what a durable shard writes to its log before anyone hears of them), and
which jobs appeared on or left the shard (what routers' directories need).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

from .status import Reply

#: A request's token, chosen by the shell (a ``(channel, request id)`` pair;
#: tests use any hashable): opaque here, only kept and handed back.
Token = Any

# The events, by shape (the first item is the event's kind). Written to a
# log and read back, a list comes back a tuple: hence ``Sequence``.
#: ``("add", id, number, queue, payload, priority, ttr, ttl, max_attempts,
#: max_fails, now, sched or None, foreground)``
AddEvent = Tuple[str, str, int, str, bytes, int, int, int, int, int, int, Optional[int], bool]
#: ``("restore", id, number, queue, payload, priority, ttr, order, now)``
RestoreEvent = Tuple[str, str, int, str, bytes, int, int, Sequence[int], int]
#: ``("job", id, number, queue, payload, priority, ttr, ttl, max_attempts,
#: max_fails, created, sched, foreground, scheduled, state, attempts, fails,
#: result or None, sleeping, lease deadline or None)``: one job as it is
JobEvent = Tuple[str, str, int, str, bytes, int, int, int, int, int, int, int, bool, bool, int, int,
                 int, Optional[bytes], bool, Optional[int]]
#: ``(kind, job id)``: delete, exhaust, take; and ``("queue", name)``
IdEvent = Tuple[str, str]
#: ``(kind, job id, µs)``: lease, unlease, retry, release (now); wake, ttr,
#: ttl (the deadline); and ``("export", job id, epoch)``
TimedEvent = Tuple[str, str, int]
#: ``(kind, job id, result, now)``: complete, fail
ResultEvent = Tuple[str, str, bytes, int]
#: ``("counters", last number, evicted)``, ``("own", ranges, epoch)``,
#: ``("moving", ranges, target, epoch)``, ``("exported", epoch, job event)``,
#: ``("gave", epoch)``, ``("hints", [[slot, target, epoch], ...])``
CountersEvent = Tuple[str, int, int]
OwnEvent = Tuple[str, Sequence[Sequence[int]], int]
MovingEvent = Tuple[str, Sequence[Sequence[int]], int, int]
ExportedEvent = Tuple[str, int, JobEvent]
EpochEvent = Tuple[str, int]
HintsEvent = Tuple[str, Sequence[Sequence[int]]]
#: One state change (see :meth:`Engine.apply <queueserver.engine.engine.Engine.apply>`).
Event = Union[AddEvent, RestoreEvent, JobEvent, IdEvent, TimedEvent, ResultEvent, CountersEvent,
              OwnEvent, MovingEvent, ExportedEvent, EpochEvent, HintsEvent]
#: ``(event kind, job id, queue, number, attempts, priority, payload size,
#: state after, lessee token)``: an event's job as it is after it
HistoryEntry = Tuple[str, str, str, int, int, int, int, int, Token]


class Effects:
    """The outcome of one :meth:`Engine.execute` or :meth:`Engine.advance`."""

    __slots__ = ("reply", "later", "events", "placed", "forgotten", "history")

    def __init__(self) -> None:
        #: the request's own answer; None when it now waits (or for a timer run)
        self.reply: Optional[Reply] = None
        #: ``(token, reply)`` answers to requests parked earlier
        self.later: List[Tuple[Token, Reply]] = []
        #: the state changes, in order (:meth:`Engine.replay` rebuilds from them)
        self.events: List[Event] = []
        #: ids of the jobs that came to exist here
        self.placed: List[str] = []
        #: ids of the jobs that left (deleted, expired, taken)
        self.forgotten: List[str] = []
        #: with the engine's ``history`` on: a :data:`HistoryEntry` per event,
        #: in order (the lessee: the request a lease went to)
        self.history: Optional[List[HistoryEntry]] = None

    def __repr__(self) -> str:
        return (f"<Effects reply={self.reply!r} later={self.later!r} events={len(self.events)} "
                f"placed={self.placed!r} forgotten={self.forgotten!r}>")
