"""A histogram as a bucket array: what a process updates on its hot path.

``observe`` is one C ``bisect`` and two additions: no lock (each process's
counters are touched by its one event loop), no label lookup, no
``prometheus_client`` object. Buckets are kept per bucket (not cumulative);
:meth:`Histogram.snapshot` hands them to the supervisor, which makes the
cumulative Prometheus form.

Values may be kept in any unit (shards count microseconds, as ints, on the
path of every lease); ``unit`` is how many seconds one of them is.
"""
from __future__ import annotations

from bisect import bisect_left
from typing import List, Sequence, TypedDict


class Snapshot(TypedDict):
    """A histogram as plain data: bounds and sum in seconds, counts per bucket (+Inf last)."""
    bounds: List[float]
    counts: List[int]
    sum: float


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "unit", "_seconds")

    def __init__(self, bounds_seconds: Sequence[float], unit: float = 1.0) -> None:
        self.unit = unit
        self._seconds = tuple(bounds_seconds)
        # Bounds in the unit of the observed values (µs bounds are exact ints).
        scaled = [b / unit for b in self._seconds]
        self.bounds = tuple(int(round(b)) if unit < 1 else b for b in scaled)
        self.counts = [0] * (len(self.bounds) + 1)   # the last one: above every bound (+Inf)
        # float: int µs in a shard, float seconds in the log writer (compiled,
        # the ints would be summed as floats: exact below 2**53 µs)
        self.sum: float = 0.0

    def observe(self, value: float) -> None:
        """Count one value (``le`` semantics: a value equal to a bound is in its bucket)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def unobserve(self, value: float) -> None:
        """Take back one :meth:`observe` of ``value`` (an undone event)."""
        i = bisect_left(self.bounds, value)
        if self.counts[i] > 0:
            self.counts[i] -= 1
            self.sum -= value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> Snapshot:
        """Plain data for the control socket: bounds and sum in seconds, counts per bucket."""
        return {"bounds": list(self._seconds), "counts": list(self.counts),
                "sum": self.sum * self.unit}


def empty_snapshot(bounds_seconds: Sequence[float]) -> Snapshot:
    return {"bounds": list(bounds_seconds), "counts": [0] * (len(bounds_seconds) + 1), "sum": 0.0}


def add_snapshots(into: Snapshot, other: Snapshot) -> None:
    """``into`` += ``other`` (same bounds; a mismatch keeps only the totals right)."""
    counts, more = into["counts"], other["counts"]
    if len(counts) == len(more) and into["bounds"] == other["bounds"]:
        for i, n in enumerate(more):
            counts[i] += n
    else:   # another version's buckets: count it all above the top bound
        counts[-1] += sum(more)
    into["sum"] += other["sum"]
