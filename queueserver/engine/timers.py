"""All deadlines of a shard in one ordered structure.

Every deadline of a shard is an entry with a ``due`` (microseconds) and a
``kind``: a job itself stands for its TTL (no extra object per queued job),
a :class:`Timer` for a lease's TTR or a schedule's wake-up, and a waiter for
its wait-timeout. The process shell needs exactly one greenlet sleeping
until :meth:`Timers.next_deadline`.

TTLs cost no int per job: a job's ``due`` is its schedule time plus its TTL,
so among jobs of one TTL and one priority (one *line*, ``job.line``) the
order of the jobs themselves (``Job.__lt__``: their ready-queue keys,
priority, schedule, creation, number) is the order of their deadlines. Each
line is a :func:`job_line`, which stores no keys of its own; only its first
job's ``due`` is ever computed. Everything else (timers, waiters, and jobs
beyond :data:`MAX_LINES` distinct lines) is in one ``SortedKeyList`` by
``due``, which keeps each entry's ``due`` beside it (a timer's or waiter's
own int; a job's is made for it). Entries fire earliest first; at equal
deadlines the general list goes first.

The sorted lists are sortedcontainers' (see :func:`job_line` for the choice
between ``SortedList`` and ``SortedKeyList``); :class:`Line` is the part of
their interface the engine uses, typed, since sortedcontainers ships no
annotations.
"""
from __future__ import annotations

from operator import attrgetter
from typing import (TYPE_CHECKING, Dict, Iterator, Literal, Optional, Protocol, Tuple, TypeVar, Union,
                    final)

from sortedcontainers import SortedKeyList, SortedList

if TYPE_CHECKING:
    from .engine import Waiter
    from .job import Job


#: Distinct (TTL, priority) pairs that get a line of their own; more are
#: kept like any timer (costing an int per job) so deadlines stay cheap to find.
MAX_LINES = 64

T = TypeVar("T")


class Line(Protocol[T]):
    """What the engine uses of a ``SortedList`` or ``SortedKeyList``.

    ``add`` puts an element after those that sort equal to it; ``discard``
    and ``remove`` find it by equality among those (identity, for jobs,
    timers and waiters); ``pop(0)`` and ``line[0]`` are their fast paths.
    """

    def add(self, value: T) -> None: ...
    def discard(self, value: T) -> None: ...
    def remove(self, value: T) -> None: ...
    def pop(self, index: int = -1) -> T: ...
    def islice(self, start: Optional[int] = None, stop: Optional[int] = None,
               reverse: bool = False) -> Iterator[T]: ...
    def __getitem__(self, index: int) -> T: ...
    def __contains__(self, value: object) -> bool: ...
    def __iter__(self) -> Iterator[T]: ...
    def __len__(self) -> int: ...


def job_line() -> Line[Job]:
    """Jobs in their own order (``Job.__lt__``: by ``key``), smallest first.

    A ``SortedList`` of the jobs themselves, not a ``SortedKeyList`` by
    ``attrgetter("key")``: that one keeps a second list of the keys beside
    the jobs (the key ints are the jobs' own, but one more pointer per job
    and line: ~18 B a job instead of ~9, and a queued job with a TTL is in
    two lines), which would take a shard past 350 B per queued job. The
    price is a Python ``__lt__`` call per bisect step (~70 ns against ~30
    for two ints): measured with loadtests/sorted_line_bench.py, an add at
    the end of a line of 10^6 jobs takes ~1.0 µs against ~0.6, a removal
    inside it ~6 against ~4; taking the first job is a ``pop(0)`` either
    way (see :meth:`JobQueue.remove` and :meth:`Timers.cancel`).

    Jobs must not sort equal (keys are unique: they end with the job's
    number), since ``remove`` looks for a job only where it would be first.
    """
    line: Line[Job] = SortedList()
    return line


def remove_from(line: Line[T], value: T) -> None:
    """``line.remove(value)``, the first element by ``pop(0)``, without a
    search (a lease takes a queue's first job; a wake-up mostly its first
    sleeping one)."""
    if line and line[0] is value:
        line.pop(0)
    else:
        line.remove(value)


def discarded(line: Line[T], value: T) -> bool:
    """Remove ``value`` from ``line`` if it is there; whether it was. The
    first element goes by ``pop(0)``, without a search."""
    if not line:
        return False
    if line[0] is value:
        line.pop(0)
        return True
    before = len(line)
    line.discard(value)
    return len(line) != before


@final
class Timer:
    """A deadline of a job other than its TTL (TTR, or a scheduled wake-up).

    It names its job by id, not by reference: the job holds its timer, and a
    timer holding the job back would make a cycle, which a job, kept out of
    the cyclic GC (job.py), must never be part of.
    """

    __slots__ = ("due", "kind", "job_id")

    def __init__(self, due: int, kind: Literal["wake", "ttr"], job_id: Optional[str]) -> None:
        self.due = due
        self.kind = kind
        self.job_id = job_id      # None only where no engine runs (tests)


#: What the timers hold; its ``kind`` tells which: "ttl" a job, "wait" a waiter.
Entry = Union["Job", Timer, "Waiter"]
E = TypeVar("E", bound=Entry)
#: ``(due, line id or None, entry)``: the earliest entry, as :meth:`Timers._first` finds it.
_First = Tuple[int, Optional[Tuple[int, int]], Entry]

_by_due = attrgetter("due")


class Timers:
    __slots__ = ("_entries", "_lines")

    def __init__(self) -> None:
        # Sorted by due, kept beside each entry: timers of equal due are
        # common, and a SortedList would find only the first of them.
        self._entries: Line[Entry] = SortedKeyList(key=_by_due)
        self._lines: Dict[Tuple[int, int], Line[Job]] = {}

    def add(self, entry: E) -> E:
        """Add an entry (a job for its TTL, a :class:`Timer` or a waiter); returns it."""
        item: Entry = entry   # the checker narrows the union by ``kind``, not E
        if item.kind == "ttl":
            lines = self._lines
            line_id = item.line
            line = lines.get(line_id)
            if line is None and len(lines) < MAX_LINES:
                line = lines[line_id] = job_line()
            if line is not None:
                line.add(item)
                return entry
        self._entries.add(item)
        return entry

    def cancel(self, entry: Optional[Entry]) -> None:
        """Remove an entry; one already fired or never added is ignored."""
        if entry is None:
            return
        if entry.kind == "ttl":
            line_id = entry.line
            line = self._lines.get(line_id)
            if line is not None and discarded(line, entry):
                if not line:
                    del self._lines[line_id]
                return
        discarded(self._entries, entry)

    def _first(self) -> Optional[_First]:
        """``(due, line id or None, entry)`` of the earliest entry, or None."""
        first: Optional[_First] = None
        entries = self._entries
        if entries:
            entry = entries[0]
            due = entry.due
            assert due is not None   # set while it is in (a TTL job's: it has a TTL)
            first = (due, None, entry)
        for line_id, line in self._lines.items():
            job = line[0]
            due = job.due
            assert due is not None   # a job in a line has a TTL
            if first is None or due < first[0]:
                first = (due, line_id, job)
        return first

    def next_deadline(self) -> Optional[int]:
        first = self._first()
        return None if first is None else first[0]

    def due(self, now: int) -> Iterator[Entry]:
        """Pop and yield entries due at ``now`` or earlier, earliest first.

        Entries added while iterating are seen if they are already due.
        """
        while True:
            first = self._first()
            if first is None or first[0] > now:
                return
            _, line_id, entry = first
            if line_id is None:
                self._entries.pop(0)
            else:
                line = self._lines[line_id]
                line.pop(0)
                if not line:
                    del self._lines[line_id]
            yield entry

    def __len__(self) -> int:
        return len(self._entries) + sum(len(line) for line in self._lines.values())
