"""What a node of a replicated cluster runs for each shard group, and failover.

A node takes part in the groups of its own shards and of the shards whose
copies the cluster file places on it (``followers_of``). For each, etcd's
group record (:mod:`.groups`) says who is primary; this node then runs:

``primary-home``  its own shard, from its shard directory (the usual case);
``primary-copy``  the shard from the copy it kept as a follower
                  (``DATA/replicas/<ordinal>``), after a failover made it primary;
``follower``      a follower process keeping that copy.

:class:`FailoverWatch` is the supervisor's thread that promotes: twice a
second it reads which nodes hold a lease, and for each group this node
follows whose primary's node has none, it tries the compare-and-swap of
:func:`.groups.promote` (which succeeds only if this node is in the group's
in-sync set). Each promotion is handed to the supervisor's loop, which
stops the follower and starts the shard from its copy (:mod:`.failover`
keeps the node's roles, its promotions and its fencing).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Dict, List, Optional

from .clusterfile import ClusterSpec

if TYPE_CHECKING:   # etcd's client is imported where it is used (a single host never needs it)
    from .coordination import Etcd
    from .groups import Group

log = logging.getLogger("queueserver.cluster")

PRIMARY_HOME = "primary-home"
PRIMARY_COPY = "primary-copy"
FOLLOWER = "follower"

#: Seconds between two looks at etcd for a lapsed primary.
WATCH_EVERY = 0.5


def plan(spec: ClusterSpec, node: str, groups: Dict[int, "Group"]) -> Dict[int, str]:
    """The role ``node`` plays in each group it takes part in, by ordinal."""
    roles: Dict[int, str] = {}
    for shard in spec.shards():
        home = shard.node
        if node != home and node not in spec.followers_of(shard.ordinal):
            continue
        group = groups.get(shard.ordinal)
        primary = group["primary"] if group is not None else home
        if primary != node:
            roles[shard.ordinal] = FOLLOWER
        elif node == home and not (group is not None and group["copy"]):
            roles[shard.ordinal] = PRIMARY_HOME
        else:
            roles[shard.ordinal] = PRIMARY_COPY
    return roles


class FailoverWatch:
    """Promotes this node in the groups it follows whose primary's lease lapsed."""

    def __init__(self, etcd: "Etcd", node: str) -> None:
        self.etcd = etcd
        self.node = node
        #: ordinals this node follows now (the supervisor keeps it current)
        self.following: List[int] = []
        #: (ordinal, new record) of each promotion won, for the supervisor's loop
        self.promoted: "queue.Queue[tuple[int, Group]]" = queue.Queue()
        self.paused = threading.Event()   # set while this node is fenced (no lease)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="etcd-failover", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _run(self) -> None:
        from .coordination import CoordinationError, live_nodes
        from .groups import promote
        quiet_until = 0.0
        while not self._stop.wait(WATCH_EVERY):
            following = list(self.following)
            if not following or self.paused.is_set():
                continue
            try:
                alive = set(live_nodes(self.etcd))
                for ordinal in following:
                    group = promote(self.etcd, ordinal, self.node, alive.__contains__)
                    if group is not None:
                        log.warning("shard %d's primary has no lease: node %s is its primary now "
                                    "(epoch %d)", ordinal, self.node, group["epoch"])
                        self.promoted.put((ordinal, group))
            except (CoordinationError, ValueError, KeyError) as err:
                if time.monotonic() > quiet_until:
                    log.warning("failover watch: %s", err)
                    quiet_until = time.monotonic() + 30
