"""The cluster's slot map in etcd: which shard serves each slot, as of which move.

``<prefix>/slotmap`` holds, as JSON::

    {"owners": [[start, end, ordinal, epoch], ...]}

runs of slots ``[start, end)`` served by shard ``ordinal`` since the move of
``epoch`` (0: since the cluster was founded), covering all
:data:`~queueserver.placement.SLOTS` slots in order.

The shards' logs stay the truth of what each serves (a shard answers a slot
it no longer serves with ``MOVED``); etcd's copy is what a router or a
command reads to know the whole map at once and is told of at once when it
changes. Writes are compare-and-swap on the key's revision and merge by
epoch, slot by slot: news older than what etcd holds never undoes newer, so
two writers racing (a move's command and another resuming it) converge.
"""
from __future__ import annotations

import json
from array import array
from typing import Any, List, Optional, Sequence, Tuple

from .coordination import Etcd, compare_and_put, read_with_revision
from ..placement import SLOTS, from_ranges, initial_owners, owner_runs

#: ``[start, end, ordinal, epoch]``
Run = List[int]


class SlotTable:
    """Owner and epoch of every slot (what the etcd record says, unpacked)."""

    __slots__ = ("owners", "epochs")

    def __init__(self, owners: Sequence[int], epochs: Sequence[int]) -> None:
        if len(owners) != SLOTS or len(epochs) != SLOTS:
            raise ValueError(f"a slot table has {SLOTS} slots, not {len(owners)}")
        self.owners = array("H", owners)
        self.epochs = array("Q", epochs)

    @classmethod
    def founded(cls, founders: Sequence[int]) -> "SlotTable":
        """A new cluster's map: the founding shards share the slots in even runs."""
        return cls([founders[position] for position in initial_owners(len(founders))], [0] * SLOTS)

    def runs(self) -> List[Run]:
        return owner_runs(self.owners, self.epochs)

    def set(self, ranges: Sequence[Sequence[int]], owner: int, epoch: int) -> bool:
        """``owner`` serves the slots of ``ranges`` as of ``epoch`` (kept
        only where nothing newer is known); whether anything changed."""
        changed = False
        for slot in from_ranges(ranges):
            if epoch >= self.epochs[slot] and (self.owners[slot], self.epochs[slot]) != (owner, epoch):
                self.owners[slot], self.epochs[slot] = owner, epoch
                changed = True
        return changed

    def encode(self) -> str:
        return json.dumps({"owners": self.runs()}, separators=(",", ":"))

    @classmethod
    def decode(cls, value: bytes) -> "SlotTable":
        """The record's table; ValueError if it does not cover every slot once, in order."""
        record: Any = json.loads(value)
        owners: List[int] = []
        epochs: List[int] = []
        for start, end, owner, epoch in record["owners"]:
            if start != len(owners) or not start < end <= SLOTS or owner < 0 or epoch < 0:
                raise ValueError(f"slot map run {[start, end, owner, epoch]} does not follow slot {len(owners)}")
            owners.extend([int(owner)] * (end - start))
            epochs.extend([int(epoch)] * (end - start))
        return cls(owners, epochs)


def key(etcd: Etcd) -> str:
    return etcd.key("slotmap")


def read(etcd: Etcd) -> Tuple[Optional[SlotTable], int]:
    """The map etcd holds and its modification revision; (None, 0) if none yet."""
    value, revision = read_with_revision(etcd, key(etcd))
    return (None, 0) if value is None else (SlotTable.decode(value), revision)


def ensure(etcd: Etcd, founders: Sequence[int]) -> SlotTable:
    """The map etcd holds, written first as the founders' map if there is none."""
    while True:
        table, revision = read(etcd)
        if table is not None:
            return table
        table = SlotTable.founded(founders)
        if compare_and_put(etcd, key(etcd), 0, table.encode()):
            return table


def record(etcd: Etcd, ranges: Sequence[Sequence[int]], owner: int, epoch: int,
           founders: Sequence[int]) -> SlotTable:
    """Say in etcd that ``owner`` serves ``ranges`` since the move of
    ``epoch`` (merged by epoch; retried on a concurrent write); the map after."""
    while True:
        table, revision = read(etcd)
        if table is None:
            table = SlotTable.founded(founders)
        if not table.set(ranges, owner, epoch):
            return table
        if compare_and_put(etcd, key(etcd), revision, table.encode()):
            return table
