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
completes every move a giver's log shows under way.

There is no consensus and no automatic failover: the operator (or a
script) runs these commands; a node that is down simply delays a move.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence

from .admin import AdminError, Cluster
from .command import DEFAULT_BATCH   # slots per move: a move pauses its slots for one round of steps
from .slots import SLOTS, MoveOutPart, Ranges, SlotsAnswer, from_ranges, to_ranges

log = logging.getLogger("queueserver.cluster")


class Rebalancer:
    def __init__(self, cluster: Cluster, say: Callable[[str], None] = log.info) -> None:
        self.cluster = cluster
        self.say = say
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

    # ---------------------------------------------------------------- moves
    def finish_pending(self, states: Dict[int, SlotsAnswer]) -> int:
        """Complete every move a giver's log shows under way."""
        done = 0
        for ordinal, state in states.items():
            for move in state["moving"]:
                self.say(f"finishing the move of epoch {move['epoch']}: "
                         f"{len(from_ranges(move['ranges']))} slots from shard {ordinal} "
                         f"to shard {move['target']}")
                self._steps(ordinal, move["target"], move["ranges"], move["epoch"])
                done += 1
        return done

    def move(self, slots: Sequence[int], target: int, batch: int = DEFAULT_BATCH) -> int:
        """Move ``slots`` (wherever they are) to shard ``target``; the jobs moved."""
        states = self.survey()
        self.finish_pending(states)
        owners = self.owners(self.survey())
        by_giver: Dict[int, List[int]] = {}
        for slot in sorted(set(slots)):   # a slot named twice moves once
            giver = owners.get(slot)
            if giver is None:
                raise AdminError(f"slot {slot} is served by no reachable shard")
            if giver != target:
                by_giver.setdefault(giver, []).append(slot)
        moved = 0
        for giver, theirs in by_giver.items():
            theirs.sort()
            for start in range(0, len(theirs), batch):
                moved += self._move(giver, target, theirs[start:start + batch])
        return moved

    def _move(self, giver: int, target: int, slots: List[int]) -> int:
        self.epoch += 1
        ranges = to_ranges(slots)
        jobs = self._steps(giver, target, ranges, self.epoch)
        self.say(f"moved {len(slots)} slots with {jobs} jobs from shard {giver} to shard {target} "
                 f"(epoch {self.epoch})")
        return jobs

    def _steps(self, giver: int, target: int, ranges: Ranges, epoch: int) -> int:
        """Copy (in parts of a few MiB), switch, delete."""
        call = self.cluster.call
        start: Optional[int] = 0
        moved = 0
        while start is not None:
            part: MoveOutPart = call(giver, "move_out", [ranges, target, epoch, start])
            start = part["next"]
            call(target, "move_in", [ranges, epoch, part["jobs"], start is None, part.get("homes", [])])
            moved += len(part["jobs"])
        call(giver, "move_done", [epoch])
        return moved

    # ------------------------------------------------------------- balancing
    def balance(self, among: Sequence[int], batch: int = DEFAULT_BATCH) -> int:
        """Even out the slots over the shards ``among`` (every other live
        shard gives all its slots away); the number of slots moved."""
        states = self.survey()
        self.finish_pending(states)
        states = self.survey()
        owners = self.owners(states)
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
        moved = 0
        for ordinal in among:
            need = want[ordinal] - len(held.get(ordinal, []))
            if need > 0:
                taking, spare = spare[:need], spare[need:]
                self.move(taking, ordinal, batch)
                moved += len(taking)
        return moved
