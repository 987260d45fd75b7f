"""Moving slots between shards, with their jobs, while traffic goes on.

One move takes a batch of slots from one shard to another in three steps,
each written to the log of the shard that takes it before it is answered:

1. ``move_out`` (giver): stop serving the slots and set their jobs aside,
   exactly as they are (ready, scheduled, leased with their deadlines,
   finished with their results); requests for them now wait.
2. ``move_in`` (receiver): take the jobs and the slots; serve them.
3. ``move_done`` (giver): drop the jobs set aside; the waiting requests are
   answered ``MOVED`` and their routers send them to the receiver.

A crash anywhere leaves exactly one shard serving the slots: before step 2
is logged the giver still holds the jobs (serving none of them), after it
the receiver serves them. Each step can be repeated harmlessly (the move's
*epoch*, one more than any the cluster has seen, names it), so an
interrupted move is finished by running the command again: it first
completes every move a giver's log shows under way. A command plans all its
moves (with their epochs) before the first one.

A cluster on etcd also keeps a *journal* of the moves (:class:`MoveJournal`,
see :mod:`.intents`): the plan, each step as it is logged, and the slot
map's record, so that a node's supervisor finishes the plan of a command
that died; without etcd, an operator runs the command again. A node that is
down simply delays a move.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from .admin import AdminError, Cluster
from .arguments import DEFAULT_BATCH
from .moves import MoveOutPart, PlannedMove, SlotsAnswer
from ..placement import SLOTS, from_ranges, to_ranges

log = logging.getLogger("queueserver.cluster")


class MoveJournal(Protocol):
    """Where a cluster on etcd writes down its moves (:class:`.intents.Driver`)."""

    def check(self) -> None:
        """Before each move: raise if this process may no longer move slots."""

    def stepped(self, move: PlannedMove, step: str) -> None:
        """``step`` ("out", "in", "done") of ``move`` is logged by its shard."""

    def finished(self, move: PlannedMove) -> None:
        """``move`` is over."""


class Rebalancer:
    def __init__(self, cluster: Cluster, say: Callable[[str], None] = log.info,
                 journal: Optional[MoveJournal] = None) -> None:
        self.cluster = cluster
        self.say = say
        self.journal = journal
        self.epoch = 0

    # ---------------------------------------------------------------- state
    def survey(self, ordinals: Optional[Sequence[int]] = None) -> Dict[int, SlotsAnswer]:
        """Every (listed) shard's slots, moves under way and job count."""
        states: Dict[int, SlotsAnswer] = {}
        for ordinal in (ordinals if ordinals is not None else self._live()):
            states[ordinal] = self.cluster.call(ordinal, "slots", [])
            self.epoch = max(self.epoch, states[ordinal]["max_epoch"],
                             *(m["epoch"] for m in states[ordinal]["moving"]))
        return states

    def _live(self) -> List[int]:
        removed = {n.name for n in self.cluster.spec.nodes if n.removed}
        return [s.ordinal for s in self.cluster.shards if s.node not in removed]

    @staticmethod
    def owners(states: Dict[int, SlotsAnswer]) -> Dict[int, int]:
        """slot -> the shard serving it."""
        owners: Dict[int, int] = {}
        for ordinal, state in states.items():
            for start, end, _ in state["served"]:
                for slot in range(start, end):
                    owners[slot] = ordinal
        return owners

    def _progress(self, move: PlannedMove) -> Optional[str]:
        """How far ``move`` got, as its shards' logs tell: "out" (the giver
        set its jobs aside), "in" (the receiver serves its slots since its
        epoch or later), "planned" (the giver still serves them all), or
        None (its slots are elsewhere: the move cannot be made)."""
        giver: SlotsAnswer = self.cluster.call(move["giver"], "slots", [])
        if any(m["epoch"] == move["epoch"] for m in giver["moving"]):
            return "out"
        slots = from_ranges(move["ranges"])
        served = {slot: epoch for start, end, epoch in giver["served"] for slot in range(start, end)}
        if all(slot in served for slot in slots):
            return "planned"
        target: SlotsAnswer = self.cluster.call(move["target"], "slots", [])
        served = {slot: epoch for start, end, epoch in target["served"] for slot in range(start, end)}
        if all(served.get(slot, -1) >= move["epoch"] for slot in slots):
            return "in"
        return None

    # ---------------------------------------------------------------- moves
    def prepare(self) -> None:
        """Learn the highest epoch, and complete every move a giver's log shows under way."""
        self.finish_pending(self.survey())

    def finish_pending(self, states: Dict[int, SlotsAnswer]) -> int:
        """Complete every move a giver's log shows under way."""
        done = 0
        for ordinal, state in states.items():
            for moving in state["moving"]:
                self.say(f"finishing the move of epoch {moving['epoch']}: "
                         f"{len(from_ranges(moving['ranges']))} slots from shard {ordinal} "
                         f"to shard {moving['target']}")
                self._steps(PlannedMove(giver=ordinal, target=moving["target"], ranges=moving["ranges"],
                                        epoch=moving["epoch"]))
                done += 1
        return done

    def _planned(self, giver: int, target: int, slots: List[int], batch: int) -> List[PlannedMove]:
        """``slots`` of ``giver`` to ``target``, ``batch`` slots a move, each with its epoch."""
        moves: List[PlannedMove] = []
        for start in range(0, len(slots), batch):
            self.epoch += 1
            moves.append(PlannedMove(giver=giver, target=target, ranges=to_ranges(slots[start:start + batch]),
                                     epoch=self.epoch))
        return moves

    def plan_move(self, slots: Sequence[int], target: int, batch: int = DEFAULT_BATCH) -> List[PlannedMove]:
        """The moves that bring ``slots`` (wherever they are) to shard ``target``."""
        owners = self.owners(self.survey())
        by_giver: Dict[int, List[int]] = {}
        for slot in sorted(set(slots)):   # a slot named twice moves once
            giver = owners.get(slot)
            if giver is None:
                raise AdminError(f"slot {slot} is served by no reachable shard")
            if giver != target:
                by_giver.setdefault(giver, []).append(slot)
        return [move for giver, theirs in by_giver.items() for move in self._planned(giver, target, theirs, batch)]

    def plan_balance(self, among: Sequence[int], batch: int = DEFAULT_BATCH) -> List[PlannedMove]:
        """The moves that even out the slots over the shards ``among`` (every
        other live shard gives all its slots away)."""
        owners = self.owners(self.survey())
        if len(owners) != SLOTS:
            raise AdminError(f"{SLOTS - len(owners)} slots are served by no reachable shard; "
                             f"start every node first")
        among = sorted(among)
        share, extra = divmod(SLOTS, len(among))
        want = {ordinal: share + (1 if i < extra else 0) for i, ordinal in enumerate(among)}
        held: Dict[int, List[int]] = {}
        for slot, ordinal in sorted(owners.items()):
            held.setdefault(ordinal, []).append(slot)
        spare: List[int] = []
        for ordinal, slots in held.items():
            keep = want.get(ordinal, 0)
            if len(slots) > keep:
                spare.extend(slots[keep:])   # a shard gives its highest slots
        moves: List[PlannedMove] = []
        for ordinal in among:
            need = want[ordinal] - len(held.get(ordinal, []))
            if need > 0:
                taking, spare = spare[:need], spare[need:]
                by_giver: Dict[int, List[int]] = {}
                for slot in sorted(taking):
                    by_giver.setdefault(owners[slot], []).append(slot)
                for giver, theirs in by_giver.items():
                    moves += self._planned(giver, ordinal, theirs, batch)
        return moves

    def run(self, moves: Sequence[PlannedMove]) -> Tuple[int, int]:
        """Make ``moves`` in order; the slots and the jobs moved."""
        slots = jobs = 0
        for move in moves:
            if self.journal is not None:
                self.journal.check()
            jobs += self._moved(move, self._steps(move))
            slots += len(from_ranges(move["ranges"]))
        return slots, jobs

    def resume(self, moves: Sequence[PlannedMove], recorded: Dict[int, str]) -> Tuple[int, int]:
        """Make the rest of a plan whose driver died: each move from where its
        shards show it got (``recorded``: the step its etcd key says, for
        the log); the slots and the jobs moved."""
        slots = jobs = 0
        for move in moves:
            if self.journal is not None:
                self.journal.check()
            where = self._progress(move)
            self.say(f"resuming the move of epoch {move['epoch']} (shard {move['giver']} to shard "
                     f"{move['target']}): {where or 'impossible'} by its shards' logs, "
                     f"{recorded.get(move['epoch'], 'not begun')} by etcd")
            if where is None:
                self.say(f"skipped the move of epoch {move['epoch']}: its slots are no longer where its "
                         f"plan had them (moved by hand?); `queueserver cluster status` shows who serves them")
                if self.journal is not None:
                    self.journal.finished(move)
                continue
            jobs += self._moved(move, self._steps(move, received=where == "in"))
            slots += len(from_ranges(move["ranges"]))
        return slots, jobs

    def _moved(self, move: PlannedMove, jobs: int) -> int:
        self.say(f"moved {len(from_ranges(move['ranges']))} slots with {jobs} jobs from shard "
                 f"{move['giver']} to shard {move['target']} (epoch {move['epoch']})")
        return jobs

    def _note(self, move: PlannedMove, step: str) -> None:
        if self.journal is not None:
            self.journal.stepped(move, step)

    def _steps(self, move: PlannedMove, received: bool = False) -> int:
        """Copy (in parts of a few MiB), switch, delete (from the delete on
        when the receiver has it already); the jobs moved."""
        call = self.cluster.call
        giver, target, ranges, epoch = move["giver"], move["target"], move["ranges"], move["epoch"]
        moved = 0
        start: Optional[int] = None if received else 0
        while start is not None:
            part: MoveOutPart = call(giver, "move_out", [ranges, target, epoch, start])
            if start == 0:
                self._note(move, "out")
            start = part["next"]
            call(target, "move_in", [ranges, epoch, part["jobs"], start is None, part.get("homes", [])])
            moved += len(part["jobs"])
        self._note(move, "in")   # the receiver serves the slots: etcd's slot map says so (slotstore)
        call(giver, "move_done", [epoch])
        self._note(move, "done")
        if self.journal is not None:
            self.journal.finished(move)
        return moved
