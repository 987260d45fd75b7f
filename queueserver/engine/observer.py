"""The engine's one hook: an observer of its state changes (a shard's metrics).

What a state change did to its job can only be told around it: before,
the job's queue and whether it was leased; after, whether this very event
finished it (a ``run`` job is gone by the end of the step that completes
it, a TTL removes the job its event names, later events of the step may
change it again). So the engine hands each event, with its handler, to
the observer, which carries it out and looks at the job on either side.
The engine declares the hook and calls it; nothing replaces its handlers.
Replaying a log calls no observer: rebuilding state is no new event.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from .engine import Engine

#: An event's handler: ``handler(engine, *event[1:])`` (``Engine.EVENTS``).
Handler = Callable[..., None]


class EventObserver:
    """Sees every event :meth:`Engine.apply <queueserver.engine.engine.Engine.apply>`
    carries out once the observer is set (``engine.observer``)."""

    def observe(self, engine: "Engine", event: Sequence[Any], handler: Handler) -> None:
        """Carry out ``event`` with its ``handler``; this one only does that."""
        handler(engine, *event[1:])
