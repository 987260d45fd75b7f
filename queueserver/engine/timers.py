"""All deadlines of a shard in one ordered structure.

Every deadline of a shard is an entry with a ``due`` (microseconds) and a
``kind``: a job itself stands for its TTL (no extra object per queued job),
a :class:`Timer` for a lease's TTR or a schedule's wake-up, and a waiter for
its wait-timeout. The process shell needs exactly one greenlet sleeping
until :meth:`Timers.next_deadline`.

TTLs cost no int per job: a job's ``due`` is its schedule time plus its TTL,
so among jobs of one TTL and one priority (one *line*, ``job.line``) the
order of their ready-queue keys (``job.key``: priority, schedule, creation,
number) is the order of their deadlines. Each line is a :class:`JobLine`
sorted by those keys, which exist anyway, and stores no keys of its own;
only its first job's ``due`` is ever computed. Everything else (timers,
waiters, and jobs beyond :data:`MAX_LINES` distinct lines) is in one
:class:`DueLine`, sorted by ``due`` the same way (an entry's ``due`` must
not change while it is in). Entries fire earliest first; at equal deadlines
the general list goes first.

:class:`JobLine` also holds each queue's ready jobs, and a subclass its
sleeping ones (jobqueue.py).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort_right
from itertools import chain, islice
from operator import attrgetter
from typing import (TYPE_CHECKING, Callable, Dict, Generic, Iterator, List, Literal, Optional, Tuple,
                    TypeVar, Union, final)

if TYPE_CHECKING:
    from .engine import Waiter
    from .job import Job


#: Distinct (TTL, priority) pairs that get a line of their own; more are
#: kept like any timer (costing an int per job) so deadlines stay cheap to find.
MAX_LINES = 64

_by_due = attrgetter("due")
_by_key = attrgetter("key")

T = TypeVar("T")


class JobLine(Generic[T]):
    """Jobs sorted by their ``key`` (smallest first), keeping no keys.

    A ``SortedKeyList`` stores each element's key beside it; here the key is
    read from the job again (``keyof``: its own ``key`` attribute, in C)
    while bisecting, so the line costs one pointer per job. Like ``SortedList`` it is a list of
    sublists of at most ``2 * LOAD`` jobs with the largest key of each in
    ``_maxes``. Jobs with equal keys keep their insertion order; a job is
    found by identity among them.

    A queue adds at its end and leases from its front, so both are fast
    paths, and a sublist is short (``LOAD``) because taking the first job
    moves all the others of its sublist. A full sublist is split into two
    exact-size copies: only the last, still growing, has spare room.
    """

    __slots__ = ("_lists", "_maxes", "_len")

    LOAD = 250
    #: The attribute a line is sorted by (a C callable, no per-entry key kept).
    keyof: Callable[[T], int] = _by_key

    def __init__(self) -> None:
        self._lists: List[List[T]] = []
        self._maxes: List[int] = []
        self._len = 0

    def add(self, job: T) -> None:
        key = self.keyof(job)
        lists, maxes = self._lists, self._maxes
        if maxes and key >= maxes[-1]:  # at the end: the usual case for a queue
            i = len(maxes) - 1
            sub = lists[i]
            sub.append(job)
            maxes[i] = key
        elif maxes:
            i = bisect_right(maxes, key)
            sub = lists[i]
            insort_right(sub, job, key=self.keyof)
        else:
            lists.append([job])
            maxes.append(key)
            self._len = 1
            return
        self._len += 1
        if len(sub) > 2 * self.LOAD:
            half = len(sub) // 2
            lists[i:i + 1] = sub[:half], sub[half:]
            maxes.insert(i, self.keyof(sub[half - 1]))

    def _find(self, job: T) -> Optional[Tuple[int, int]]:
        """``(sublist index, index)`` of ``job``, or None."""
        keyof = self.keyof
        key = keyof(job)
        lists, maxes = self._lists, self._maxes
        i = bisect_left(maxes, key)
        if i == len(maxes):
            return None
        sub = lists[i]
        j = bisect_left(sub, key, key=keyof)
        while True:
            if j == len(sub):
                i += 1
                if i == len(lists):
                    return None
                sub, j = lists[i], 0
            item = sub[j]
            if item is job:
                return i, j
            if keyof(item) != key:
                return None
            j += 1

    def _delete(self, i: int, j: int) -> None:
        sub = self._lists[i]
        del sub[j]
        self._len -= 1
        if not sub:
            del self._lists[i]
            del self._maxes[i]
        elif j == len(sub):
            self._maxes[i] = self.keyof(sub[-1])

    def discard(self, job: T) -> bool:
        """Remove ``job`` if present; whether it was."""
        lists = self._lists
        if lists:
            sub = lists[0]
            if sub[0] is job:   # the first: a lease, or a deadline that fired
                del sub[0]
                self._len -= 1
                if not sub:
                    del lists[0]
                    del self._maxes[0]
                return True
            at = self._find(job)
            if at is not None:
                self._delete(*at)
                return True
        return False

    def remove(self, job: T) -> None:
        if not self.discard(job):
            raise ValueError(f"{job!r} not in line")

    def pop(self, index: int = 0) -> T:
        if index != 0:
            raise IndexError("a line pops only its first job")
        if not self._len:
            raise IndexError("pop from an empty line")
        job = self._lists[0][0]
        self._delete(0, 0)
        return job

    def __getitem__(self, index: int) -> T:
        if index == 0 and self._len:
            return self._lists[0][0]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("line index out of range")
        for sub in self._lists:
            if index < len(sub):
                return sub[index]
            index -= len(sub)
        raise IndexError("line index out of range")  # pragma: no cover

    def __contains__(self, job: T) -> bool:
        return self._find(job) is not None

    def islice(self, start: int = 0, stop: Optional[int] = None) -> Iterator[T]:
        return islice(iter(self), start, stop)

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._lists)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0


class DueLine(JobLine[T]):
    """Entries sorted by their ``due`` (which must not change while inside)."""

    __slots__ = ()

    keyof = _by_due


@final
class Timer:
    """A deadline of a job other than its TTL (TTR, or a scheduled wake-up)."""

    __slots__ = ("due", "kind", "job")

    def __init__(self, due: int, kind: Literal["wake", "ttr"], job: Optional[Job]) -> None:
        self.due = due
        self.kind = kind
        self.job = job            # None only where no engine runs (tests)


#: What the timers hold; its ``kind`` tells which: "ttl" a job, "wait" a waiter.
Entry = Union["Job", Timer, "Waiter"]
E = TypeVar("E", bound=Entry)
#: ``(due, line id or None, entry)``: the earliest entry, as :meth:`Timers._first` finds it.
_First = Tuple[int, Optional[Tuple[int, int]], Entry]


class Timers:
    __slots__ = ("_entries", "_lines")

    def __init__(self) -> None:
        self._entries: DueLine[Entry] = DueLine()
        self._lines: Dict[Tuple[int, int], JobLine[Job]] = {}

    def add(self, entry: E) -> E:
        """Add an entry (a job for its TTL, a :class:`Timer` or a waiter); returns it."""
        item: Entry = entry   # the checker narrows the union by ``kind``, not E
        if item.kind == "ttl":
            lines = self._lines
            line_id = item.line
            line = lines.get(line_id)
            if line is None and len(lines) < MAX_LINES:
                line = lines[line_id] = JobLine()
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
            if line is not None and line.discard(entry):
                if not line:
                    del self._lines[line_id]
                return
        self._entries.discard(entry)

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
