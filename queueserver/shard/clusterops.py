"""A cluster's shard serving the operations on its slots: the first slots it
takes, the ``queueserver cluster`` command's slot moves, and what a router
(or another shard) asks of the slots it serves.

A move takes three requests (:mod:`queueserver.cluster.rebalance`):
``move_out`` on the giver sets its jobs aside (in parts), ``move_in`` on the
taker takes them with the ids homed in those slots, and ``move_done`` on the
giver lets them go. Each answer leaves once the log holds it; the slots'
new owner is told to every router and shard linked here (``owns``,
``gave``), and the requests the giver held for those slots go to it.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, Final, List, Sequence

from ..engine.ownership import OutgoingMove, SlotOwnership
from ..engine.status import OK, Reply
from ..placement import from_ranges
from .clustering import Send, ShardInCluster

if TYPE_CHECKING:   # the shard makes these and hands itself over: it is not imported back
    from .shard import Shard

log: Final = logging.getLogger("queueserver.shard")


class ClusterOps:
    """The slot operations of ``shard``, a cluster's shard."""

    def __init__(self, shard: Shard, cluster: ShardInCluster) -> None:
        self.shard = shard
        self.cluster = cluster

    def _slots(self) -> SlotOwnership:
        """The engine's slots: a cluster's shard has them once it joined (or recovered)."""
        slots = self.shard.engine.slots
        assert slots is not None, "a cluster's shard serves once it holds its slots"
        return slots

    def join(self) -> None:
        """A shard that never served in its cluster takes its starting slots
        (logged, so a restart never changes what it owns)."""
        shard, cluster = self.shard, self.cluster
        if shard.engine.slots is None:
            shard.take_effects(shard.engine.execute("claim", [cluster.initial_slots()], shard.now()))
            if shard.durability is not None:
                shard.durability.commit()
        log.info("shard %s serves %d of the cluster's slots", cluster.me.name, self._slots().owned())

    # ------------------------------------------------------------ requests
    def _served(self, send: Send, args: Any) -> None:
        """The slots served here (a router asking for the map, or ``cluster status``)."""
        shard = self.shard
        answer: Dict[str, Any] = {"shard": shard.index, **self._slots().summary(), "jobs": len(shard.engine.jobs)}
        if shard.durability is not None and shard.durability.replicator is not None:
            answer["followers"] = shard.durability.replicator.status()
        send([OK, answer])

    def _move_out(self, send: Send, args: Any) -> None:
        """Set aside a part of the jobs of slots given to another shard; with
        the first part go the ids homed in those slots (their home moves)."""
        slots = self._slots()
        named = from_ranges(args[0])
        reply = self._execute("move_out", args)
        if reply[0] == OK and (len(args) < 4 or args[3] == 0):
            reply[1]["homes"] = self.shard.homes.home.entries.export(set(named))
            log.info("shard %s is giving %d slots to shard %d (epoch %d): %d jobs set aside",
                     self.cluster.me.name, len(named), args[1], args[2], len(slots.moves[args[2]].jobs))
        self._answer(send, reply)

    def _move_in(self, send: Send, args: Any) -> None:
        """Take a part of the jobs of slots another shard gives; the ids homed
        in them come with the first, and with the last the slots are ours.
        The homes of the jobs' ids learn they live here before it answers."""
        shard = self.shard
        named = from_ranges(args[0])
        fresh = any(self._slots().epochs[slot] < args[1] for slot in named)
        homes = args[4] if len(args) > 4 else None
        reply = self._execute("move_in", args[:4])
        if reply[0] == OK:
            if homes:
                shard.homes.home.entries.import_(homes)
            peers = shard.homes.peers
            if fresh and (len(args) < 4 or args[3]) and peers is not None and peers.slots is not None:
                peers.slots.ranges_set(args[0], shard.index, args[1])
            ids = [event[1] for event in args[2]]
            if ids and peers is not None:
                peers.register(ids, lambda replies: self._moved_in(send, args, reply, fresh, named, replies))
                return
        self._moved_in(send, args, reply, fresh, named, [])

    def _moved_in(self, send: Send, args: Any, reply: Reply, fresh: bool, named: Sequence[int],
                  registered: List[Reply]) -> None:
        failed = [r for r in registered if r[0] != OK]
        if failed:   # a home out of reach learns of them once its link is back
            self.shard.homes.unreachable(-1, failed[0], [event[1] for event, r in zip(args[2], registered)
                                                         if r[0] != OK])
        if reply[0] == OK and fresh and (len(args) < 4 or args[3]):   # the last part: the slots are ours now
            shard = self.shard
            log.info("shard %s took %d slots (epoch %d), %d jobs in the last part",
                     self.cluster.me.name, len(named), args[1], reply[1])
            shard.broadcast([0, "owns", [shard.index, args[0], args[1]]])
            shard.stats.slots_moved("in", len(named))
        self._answer(send, reply)

    def _move_done(self, send: Send, args: Any) -> None:
        """The move of ``args[0]``'s epoch is over: its jobs and the ids homed
        in its slots go; once the log says so, the requests held for those
        slots go to the new owner."""
        shard, cluster = self.shard, self.cluster
        move = self._slots().moves.get(args[0])
        reply = self._execute("move_done", args)
        if reply[0] == OK and move is not None:
            shard.homes.home.entries.export(set(from_ranges(move.ranges)), drop=True)
            peers = shard.homes.peers
            if peers is not None and peers.slots is not None:
                peers.slots.ranges_set(move.ranges, move.target, move.epoch)
            given = len(from_ranges(move.ranges))
            log.info("shard %s gave %d slots to shard %d (epoch %d)", cluster.me.name,
                     given, move.target, move.epoch)
            shard.broadcast([0, "gave", [move.ranges, move.target, move.epoch]])
            shard.stats.slots_moved("out", given)
            # Its waiting requests go to the new owner once the log says so.
            shard.answer(partial(_released, cluster, move), reply)
        self._answer(send, reply)

    def _execute(self, op: str, args: Any) -> Reply:
        reply = self.shard.execute(op, args)
        assert reply is not None   # asked with no token: never parked
        return reply

    def _answer(self, send: Send, reply: Reply) -> None:
        self.shard.answer(send, reply)
        self.shard.flush_links()


def _released(cluster: ShardInCluster, move: OutgoingMove, reply: Reply) -> None:
    """``move`` is over (its answer is durable): the requests it held go to the new owner."""
    cluster.released(move)


#: The requests a cluster's shard serves on its slots (the operations
#: :data:`queueserver.engine.ops.OPS` flags ``CLUSTER``), by name:
#: ``handler(ops, send, args)``.
REQUESTS: Final[Dict[str, Callable[[ClusterOps, Send, Any], None]]] = {
    "slots": ClusterOps._served, "move_out": ClusterOps._move_out, "move_in": ClusterOps._move_in,
    "move_done": ClusterOps._move_done,
}
