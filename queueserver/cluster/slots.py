"""Which slot a queue is in, and slot sets written as ranges.

A queue name hashes (xxhash, as for shards on one host) to one of
:data:`SLOTS` slots; slots, not names, are what a cluster gives to shards and
moves between them (as Redis Cluster does with its 16,384 slots). Sets of
slots travel and are logged as sorted ``[start, end)`` ranges, which stay
short because slots are given out in runs.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import xxhash

# MAX_SHARDS: job numbers are made with this stride in a cluster, so that a
# number tells which shard made it (as the shard count does on one host) even
# as shards are added; it also bounds a cluster's shards (the routers' job
# directory keeps a shard in one byte). Defined with the file's checks.
from .clusterfile import MAX_SHARDS as MAX_SHARDS  # noqa: F401  (re-exported)

SLOTS = 16384
_MASK = SLOTS - 1
_hash = xxhash.xxh64_intdigest


Ranges = List[List[int]]


def slot_of(name: str) -> int:
    """The slot of queue ``name``."""
    return _hash(name.encode()) & _MASK


def to_ranges(slots: Iterable[int]) -> Ranges:
    """Sorted ``[start, end)`` runs covering ``slots``."""
    ranges: Ranges = []
    for slot in sorted(set(slots)):
        if ranges and ranges[-1][1] == slot:
            ranges[-1][1] = slot + 1
        else:
            ranges.append([slot, slot + 1])
    return ranges


def from_ranges(ranges: Sequence[Sequence[int]]) -> List[int]:
    """The slots ``ranges`` cover; a range outside ``[0, SLOTS)`` is refused."""
    slots: List[int] = []
    for start, end in ranges:
        if not (0 <= start < end <= SLOTS):
            raise ValueError(f"slot range [{start}, {end}) is outside 0..{SLOTS}")
        slots.extend(range(start, end))
    return slots


def owner_runs(owners: Sequence[int], epochs: Sequence[int]) -> List[List[int]]:
    """A whole map (slot -> owner, and the epoch it is known as of) as
    ``[start, end, owner, epoch]`` runs, in slot order."""
    runs: List[List[int]] = []
    for slot in range(len(owners)):
        owner, epoch = owners[slot], epochs[slot]
        if runs and runs[-1][2] == owner and runs[-1][3] == epoch:
            runs[-1][1] = slot + 1
        else:
            runs.append([slot, slot + 1, owner, epoch])
    return runs


def initial_owners(shards: int) -> List[int]:
    """A new cluster's map: slot -> founding shard (by position), in even runs."""
    return [slot * shards // SLOTS for slot in range(SLOTS)]
