"""Where each replicated shard's primary serves, as etcd says: for any link to it.

A link to a replicated shard knows every place its primary may be and,
when its link fails, tries them in turn (:class:`.shardlink.ShardLink`).
Etcd knows at once: the node's supervisor watches each group's record
(:mod:`queueserver.cluster.watch`) and tells its routers and shards on their
control sockets ``["cluster", "view", runs, primaries, nodes]``. This
module is the part both take it with: the view's check, sending a link to
the primary a view names (never back to an older one), and marking the
links to shards served by a node that holds no etcd lease as down; and,
before any view, every place the cluster file says a primary may be
(:func:`shard_places`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

from ..cluster.clusterfile import MAX_SHARDS, ClusterSpec
from ..placement import SLOTS
from .shardlink import Address, Places, ShardLink, where

log = logging.getLogger("queueserver.router")


def view_problem(runs: Any, primaries: Any, nodes: Any = None) -> str:
    """What is wrong with a cluster view off the control socket ("" if nothing);
    ``nodes`` (the nodes holding a lease) may be left out."""
    if runs is not None:
        if not isinstance(runs, list):
            return f"the slot map must be a list of runs, not {type(runs).__name__}"
        for run in runs:
            if not (isinstance(run, list) and len(run) == 4 and all(type(n) is int for n in run)
                    and 0 <= run[0] < run[1] <= SLOTS and 0 <= run[2] < MAX_SHARDS and run[3] >= 0):
                return f"slot map run {run!r:.60} is not [start, end, ordinal, epoch] within {SLOTS} slots"
    if not isinstance(primaries, list):
        return f"the primaries must be a list, not {type(primaries).__name__}"
    for primary in primaries:
        if not (isinstance(primary, list) and len(primary) == 4 and type(primary[0]) is int
                and 0 <= primary[0] < MAX_SHARDS and type(primary[1]) is int and primary[1] >= 0
                and isinstance(primary[2], str) and isinstance(primary[3], bool)):
            return f"primary {primary!r:.60} is not [ordinal, epoch, node, copy]"
    if nodes is not None and not (isinstance(nodes, list) and all(isinstance(n, str) for n in nodes)):
        return f"the nodes holding a lease must be a list of names, not {nodes!r:.60}"
    return ""


def shard_places(spec: ClusterSpec, node: str, local: Callable[[int], str]) -> List[Places]:
    """Where a process of ``node`` reaches each shard of ``spec``, by ordinal:
    a shard of this node at its Unix socket (``local(index)``), any other at
    its TCP address; with replicas, every place its primary may serve (a
    follower's node, after a failover), its home first; None for a shard of
    a removed node."""
    removed = {n.name for n in spec.nodes if n.removed}
    addresses: List[Places] = []
    for shard in spec.shards():
        if shard.node in removed:
            addresses.append(None)
            continue
        here: Address = local(shard.index) if shard.node == node else (shard.host, shard.port)
        if spec.replicas:
            places: List[Address] = [here]   # its home's TCP address too: a copy taken over here
            places += [a for a in spec.candidates(shard.ordinal) if a != here]
            addresses.append(places)
        else:
            addresses.append(here)
    return addresses


class PrimaryPlaces:
    """The newest primary etcd named for each shard, and the links sent there.

    ``node``: the node this process runs on; ``local``: its own shards'
    Unix sockets by ordinal, where a primary serving from its home shard on
    this node is reached (any other place is the cluster file's TCP address
    of that node for that shard: its home link port, or a copy's)."""

    def __init__(self, spec: ClusterSpec, node: str, local: Dict[int, str]) -> None:
        self.spec = spec
        self.node = node
        self.local = local
        self.epochs: Dict[int, int] = {}
        #: ordinal -> the node etcd named its primary (else its home in the cluster file)
        self.nodes: Dict[int, str] = {}
        #: the nodes holding an etcd lease, as last told (None: not told yet)
        self.leased: Optional[Set[str]] = None
        self.switches = 0   # links sent to a new primary

    def take(self, link: ShardLink, epoch: int, node: str, copy: bool) -> None:
        """Shard ``link.index``'s primary is on ``node`` as of ``epoch``
        (``copy``: serving the copy it kept as a follower): the link goes
        there, unless etcd named a newer primary before."""
        ordinal = link.index
        if epoch < self.epochs.get(ordinal, 0) or link.path is None:   # older news; a removed node's shard
            return
        self.epochs[ordinal] = epoch
        self.nodes[ordinal] = node
        place: Address
        same_shard = False
        local = self.local.get(ordinal) if node == self.node and not copy else None
        if local is not None:
            place = local
            # Its home's TCP port here (where the link may have found it
            # before etcd's word) is served by the same process as its
            # socket while it is primary from home: no request is dropped.
            same_shard = link.up and link.path == self.spec.address(node, ordinal)
        else:
            try:
                place = self.spec.address(node, ordinal)
            except (ValueError, IndexError):   # a node the cluster file does not place there
                log.warning("etcd says node %s is shard %d's primary (epoch %d), which the cluster file "
                            "%s does not allow; its link stays at %s", node, ordinal, epoch, self.spec.path,
                            where(link.path))
                return
        if link.follow(place, same_shard):
            self.switches += 1
            log.warning("shard %d's primary is now %s (epoch %d), told by etcd: linking to %s",
                        ordinal, node, epoch, where(place))

    def leases(self, nodes: List[str], links: Iterable[ShardLink]) -> List[ShardLink]:
        """Etcd says only ``nodes`` hold a lease. A shard served by any other
        node is down, known to be (:attr:`.shardlink.ShardLink.lapsed`): nobody
        waits for its link to come up. A link still up to a node whose lease
        was held and just lapsed is dropped: a host that died without a word
        (no reset reached us) leaves it up with requests never answered; they
        are answered as when a link fails (outcome unknown) and it reconnects.
        The links now known to be down."""
        before, now = self.leased, set(nodes)
        self.leased = now
        homes = {shard.ordinal: shard.node for shard in self.spec.shards()}
        down = []
        for link in links:
            node = self.nodes.get(link.index) or homes.get(link.index)
            if node is None or node == self.node or link.path is None:   # (this node lives: we run)
                continue
            link.lapsed = node not in now
            if link.lapsed:
                if before is not None and node in before and link.up:
                    log.warning("node %s holds no etcd lease any more: dropping the link to shard %d at %s",
                                node, link.index, where(link.path))
                    link.drop()
                down.append(link)
        return down
