"""A router's map of the cluster: which shard serves each of the 16,384 slots.

It starts as the cluster file's initial map and follows what shards say:
the slots each serves when its link comes up, a slot taken or given in a
move, and a ``MOVED`` answer to a request that reached a former owner; and,
on etcd, the map etcd holds, passed on by the node's supervisor. Each
slot keeps the epoch of what was last learned about it, so older news (a
shard that reconnects late, an answer overtaken by a move) never undoes
newer.
"""
from __future__ import annotations

from array import array
from typing import Iterable, List, Sequence

from ..placement import SLOTS, from_ranges, initial_owners, owner_runs


class SlotMap:
    def __init__(self, founders: Sequence[int]) -> None:
        owners = initial_owners(len(founders))
        self.owners = array("H", (founders[position] for position in owners))
        self.epochs = array("Q", bytes(8 * SLOTS))

    def set(self, slots: Iterable[int], owner: int, epoch: int, force: bool = False) -> int:
        """``owner`` serves ``slots`` as of ``epoch`` (ignored where newer is
        known, unless ``force``: a fact just asked of the owner); how many
        slots changed owner."""
        owners, epochs = self.owners, self.epochs
        changed = 0
        for slot in slots:
            if force or epoch >= epochs[slot]:
                if owners[slot] != owner:
                    changed += 1
                owners[slot] = owner
                epochs[slot] = epoch
        return changed

    def runs(self) -> List[List[int]]:
        """The map as ``[start, end, owner, epoch]`` runs of slots (as etcd's record has it)."""
        return owner_runs(self.owners, self.epochs)

    def served(self, owner: int, runs: Sequence[Sequence[int]], force: bool = False) -> None:
        """A shard's ``[start, end, epoch]`` runs of slots it serves."""
        for start, end, epoch in runs:
            self.set(range(start, end), owner, epoch, force)

    def hinted(self, hints: Sequence[Sequence[int]]) -> None:
        """``[slot, owner, epoch]`` of slots a shard gave away."""
        for slot, owner, epoch in hints:
            self.set((slot,), owner, epoch)

    def ranges_set(self, ranges: Sequence[Sequence[int]], owner: int, epoch: int) -> None:
        self.set(from_ranges(ranges), owner, epoch)
