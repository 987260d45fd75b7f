"""All deadlines of a shard in one ordered structure.

One ``SortedKeyList`` keyed by each entry's ``due`` (microseconds) holds
every deadline of a shard: a job itself stands for its TTL (no extra object
per queued job), a :class:`Timer` for a lease's TTR or a schedule's wake-up,
and a waiter for its wait-timeout. Every entry says what it is by ``kind``.
The process shell needs exactly one greenlet sleeping until
:meth:`Timers.next_deadline`.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any, Iterator, Optional

from sortedcontainers import SortedKeyList


class Timer:
    """A deadline of a job other than its TTL (TTR, or a scheduled wake-up)."""

    __slots__ = ("due", "kind", "job")

    def __init__(self, due: int, kind: str, job: Any) -> None:
        self.due = due
        self.kind = kind
        self.job = job


class Timers:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: SortedKeyList = SortedKeyList(key=attrgetter("due"))

    def add(self, entry: Any) -> Any:
        """Add an entry (anything with ``due`` and ``kind``); returns it."""
        self._entries.add(entry)
        return entry

    def cancel(self, entry: Optional[Any]) -> None:
        """Remove an entry; one already fired or never added is ignored."""
        if entry is not None:
            self._entries.discard(entry)

    def next_deadline(self) -> Optional[int]:
        return self._entries[0].due if self._entries else None

    def due(self, now: int) -> Iterator[Any]:
        """Pop and yield entries due at ``now`` or earlier, earliest first.

        Entries added while iterating are seen if they are already due.
        """
        entries = self._entries
        while entries and entries[0].due <= now:
            yield entries.pop(0)

    def __len__(self) -> int:
        return len(self._entries)
