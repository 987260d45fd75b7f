"""Where a queue lives: the one rule that the engine, routers, shards and
the cluster share.

On one host a queue name hashes (xxhash) to one of the server's shards
(:func:`shard_for`). In a cluster it hashes to one of :data:`SLOTS` slots
(:func:`slot_of`); slots, not names, are what a cluster gives to shards and
moves between them (as Redis Cluster does with its 16,384 slots). Sets of
slots travel and are logged as sorted ``[start, end)`` ranges, which stay
short because slots are given out in runs.

Pure arithmetic, below the engine (which checks the slot of every queue it
serves in a cluster) and imported by everything that routes.
"""
from __future__ import annotations

from typing import Final, Iterable, List, Sequence

import xxhash

SLOTS: Final = 16384
_MASK: Final = SLOTS - 1
_hash: Final = xxhash.xxh64_intdigest


Ranges = List[List[int]]


def shard_for(name: str, shards: int) -> int:
    """The shard (of ``shards``) that owns queue ``name`` on one host."""
    return _hash(name.encode()) % shards


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
