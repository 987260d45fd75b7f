"""Which slots a shard of a cluster serves, gives away, and gave to whom.

A slot is served by one shard. A move (see :mod:`queueserver.cluster.rebalance`)
goes copy, switch, delete: the giving shard stops serving the slots and sets
their jobs aside (``moving``), the receiving shard takes the jobs and the
slots (``own``), then the giver drops what it set aside (``gave``). Every
step is an engine event, so it is logged and replayed: a shard that dies
mid-move comes back still holding the jobs it was giving, serving none of
them, until the move is finished. Slots given away keep a hint (the new
owner and the move's epoch) for routers that still hold an old map.
"""
from __future__ import annotations

from array import array
from typing import Dict, Final, List, Optional, Sequence, Set, Tuple, TypedDict, Union

from ..placement import SLOTS, Ranges, from_ranges, to_ranges
from .effects import Event, JobEvent

NOT_OURS: Final = 0
SERVING: Final = 1
MOVING: Final = 2


class OutgoingMove:
    """Slots being given to ``target``, and their jobs set aside meanwhile."""

    __slots__ = ("epoch", "ranges", "target", "jobs", "ids", "numbers")

    def __init__(self, epoch: int, ranges: Ranges, target: int) -> None:
        self.epoch = epoch
        self.ranges = ranges
        self.target = target
        self.jobs: List[JobEvent] = []   # "job" events (see Engine.job_event)
        self.ids: Set[str] = set()
        self.numbers: Set[int] = set()


class MoveSummary(TypedDict):
    epoch: int
    ranges: Ranges
    target: int
    jobs: int


class SlotSummary(TypedDict):
    """:meth:`SlotOwnership.summary`: ``[start, end, epoch]`` runs served,
    the moves under way, ``[slot, target, epoch]`` hints, the highest epoch."""
    served: List[List[int]]
    moving: List[MoveSummary]
    hints: List[List[int]]
    max_epoch: int


class SlotOwnership:
    def __init__(self) -> None:
        self.state = bytearray(SLOTS)
        self.epochs = array("Q", bytes(8 * SLOTS))
        #: slot -> (ordinal of the shard it went to, epoch of that move)
        self.hints: Dict[int, Tuple[int, int]] = {}
        #: epoch -> the move under way
        self.moves: Dict[int, OutgoingMove] = {}

    def serving(self, slot: int) -> bool:
        return self.state[slot] == SERVING

    def owned(self) -> int:
        return self.state.count(SERVING)

    def move_of(self, slot: int) -> Optional[OutgoingMove]:
        for move in self.moves.values():
            for start, end in move.ranges:
                if start <= slot < end:
                    return move
        return None

    def holding(self, key: Union[str, int]) -> Optional[OutgoingMove]:
        """The move whose jobs include the one with id (or number) ``key``."""
        for move in self.moves.values():
            if key in move.ids or key in move.numbers:
                return move
        return None

    # ------------------------------------------------------------- changes
    def own(self, ranges: Sequence[Sequence[int]], epoch: int) -> None:
        state, epochs, hints = self.state, self.epochs, self.hints
        for slot in from_ranges(ranges):
            state[slot] = SERVING
            epochs[slot] = epoch
            hints.pop(slot, None)

    def begin(self, ranges: Sequence[Sequence[int]], target: int, epoch: int) -> OutgoingMove:
        move = self.moves[epoch] = OutgoingMove(epoch, [list(r) for r in ranges], target)
        for slot in from_ranges(ranges):
            self.state[slot] = MOVING
        return move

    def finish(self, epoch: int) -> OutgoingMove:
        move = self.moves.pop(epoch)
        for slot in from_ranges(move.ranges):
            self.state[slot] = NOT_OURS
            self.epochs[slot] = epoch
            self.hints[slot] = (move.target, epoch)
        return move

    def set_hints(self, hints: Sequence[Sequence[int]]) -> None:
        for slot, target, epoch in hints:
            self.hints[slot] = (target, epoch)
            self.epochs[slot] = max(self.epochs[slot], epoch)

    # ------------------------------------------------------------- reading
    def served_ranges(self) -> List[List[int]]:
        """``[start, end, epoch]`` runs of the slots served here."""
        runs: List[List[int]] = []
        state, epochs = self.state, self.epochs
        for slot in range(SLOTS):
            if state[slot] != SERVING:
                continue
            if runs and runs[-1][1] == slot and runs[-1][2] == epochs[slot]:
                runs[-1][1] = slot + 1
            else:
                runs.append([slot, slot + 1, epochs[slot]])
        return runs

    def summary(self) -> SlotSummary:
        """What routers and the ``cluster`` command need to know (msgpack-able)."""
        return {"served": self.served_ranges(),
                "moving": [{"epoch": m.epoch, "ranges": m.ranges, "target": m.target,
                            "jobs": len(m.jobs)} for m in self.moves.values()],
                "hints": [[slot, target, epoch] for slot, (target, epoch) in self.hints.items()],
                "max_epoch": max(self.epochs)}

    def snapshot(self) -> List[Event]:
        """Events that rebuild this state (a compacted log's base)."""
        events: List[Event] = [("own", [], 0)]   # a shard of a cluster, even owning nothing
        by_epoch: Dict[int, List[int]] = {}
        for slot in range(SLOTS):
            if self.state[slot] == SERVING:
                by_epoch.setdefault(self.epochs[slot], []).append(slot)
        for epoch, slots in sorted(by_epoch.items()):
            events.append(("own", to_ranges(slots), epoch))
        if self.hints:
            events.append(("hints", [[slot, t, e] for slot, (t, e) in self.hints.items()]))
        for move in self.moves.values():
            events.append(("moving", move.ranges, move.target, move.epoch))
            for job in move.jobs:
                events.append(("exported", move.epoch, job))
        return events
