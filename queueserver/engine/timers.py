"""All deadlines of a shard in one ordered structure.

One sorted list of ``(deadline_us, seq, kind, subject)`` entries serves
every TTR, TTL, schedule and wait-timeout of a shard, so the process shell
needs exactly one greenlet sleeping until :meth:`Timers.next_deadline`.
``seq`` is unique, so comparisons never reach ``subject``.
"""
from __future__ import annotations

from itertools import count
from typing import Any, Iterator, Optional, Tuple

from sortedcontainers import SortedList

Entry = Tuple[int, int, str, Any]


class Timers:
    __slots__ = ("_entries", "_seq")

    def __init__(self) -> None:
        self._entries: SortedList = SortedList()
        self._seq = count()

    def add(self, deadline: int, kind: str, subject: Any) -> Entry:
        entry = (deadline, next(self._seq), kind, subject)
        self._entries.add(entry)
        return entry

    def cancel(self, entry: Optional[Entry]) -> None:
        if entry is not None:
            self._entries.discard(entry)

    def next_deadline(self) -> Optional[int]:
        return self._entries[0][0] if self._entries else None

    def due(self, now: int) -> Iterator[Entry]:
        """Pop and yield entries whose deadline is ``<= now``, earliest first.

        Entries added while iterating are seen if they are already due.
        """
        entries = self._entries
        while entries and entries[0][0] <= now:
            yield entries.pop(0)

    def __len__(self) -> int:
        return len(self._entries)
