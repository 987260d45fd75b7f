"""A replicated node's roles in its shard groups, kept as etcd says: failover and fencing.

The supervisor runs the processes; this says which ones, from etcd's group
records (:mod:`.groups`) and the role rule of :mod:`.roles`:

- before any process starts, each group's record is read (etcd must
  answer), so the node runs its own shard, a follower, or a shard served
  from its copy, as the record says (:meth:`Failover.coordinate`);
- the node's :class:`.roles.FailoverWatch` promotes it where a primary's
  node lost its lease; each promotion it won is handed to the supervisor's
  loop (:meth:`Failover.promotions`), which stops the follower and serves
  the copy;
- a shard that finds another node its group's primary (a promotion raced
  its start) is deposed: the group's role is read again (:meth:`Failover.replan`);
- **fencing**: a node whose etcd lease may have lapsed must not acknowledge
  as a primary. Once the lease has gone unrefreshed for :data:`FENCE_AFTER`
  of its TTL (well before etcd lets it lapse and a follower is promoted:
  our clock starts later than etcd's, at the answer), its primaries stop
  and the watch pauses; once the lease is back, the roles are read again
  and only the groups whose role changed get new processes
  (:meth:`Failover.lease_back`).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from .clusterfile import ClusterSpec
from .coordination import AuthenticationError, CoordinationError, Etcd, Membership
from .groups import Group, read_all
from .roles import FOLLOWER, FailoverWatch, plan

log = logging.getLogger("queueserver.cluster")

#: Share of the etcd lease's TTL without a refresh after which a node's
#: primaries stop: well before etcd lets the lease lapse and a follower is
#: promoted (our clock starts later than etcd's, at the answer).
FENCE_AFTER = 0.6


class Failover:
    """Node ``node``'s roles in the shard groups of ``spec`` (a replicated
    cluster on etcd), by ordinal, as ``groups`` (their records) say."""

    def __init__(self, spec: ClusterSpec, node: str, etcd: Etcd, groups: Dict[int, Group]) -> None:
        assert spec.etcd is not None   # a cluster on etcd
        self.spec = spec
        self.node = node
        self.etcd = etcd
        self.lease_ttl = spec.etcd.lease_ttl
        #: what this node runs in each group it takes part in (see :func:`.roles.plan`)
        self.roles = plan(spec, node, groups)
        #: the thread that promotes this node where a primary's lease lapsed
        self.watch = FailoverWatch(etcd, node)
        self.watch.following = self._following()
        #: whether this node's primaries are stopped for want of a lease refresh
        self.fenced = False
        log.info("node %s in its shard groups: %s", node,
                 ", ".join(f"{k}: {role}" for k, role in sorted(self.roles.items())) or "none")

    @staticmethod
    def coordinate(spec: ClusterSpec, node: str, stopping: Callable[[], bool]) -> Optional[Failover]:
        """Read each group's record, waiting for etcd to answer (None: told
        to stop meanwhile); :class:`.coordination.AuthenticationError` if
        etcd refuses the cluster file's credentials."""
        assert spec.etcd is not None   # a cluster on etcd
        etcd = Etcd(spec.etcd)
        while not stopping():
            try:
                groups = read_all(etcd)
                break
            except AuthenticationError:   # etcd came back, and refuses the file's credentials
                raise
            except CoordinationError as err:
                log.warning("etcd does not answer (%s); a replicated node starts once it does", err)
                time.sleep(1.0)
        else:
            return None
        return Failover(spec, node, etcd, groups)

    def _following(self) -> List[int]:
        return [k for k, role in self.roles.items() if role == FOLLOWER]

    def start(self) -> None:
        """Watch for lapsed primaries (once the node serves)."""
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()

    def runs(self, ordinal: int, role: str) -> None:
        """The node runs ``role`` in group ``ordinal`` now (its process changed)."""
        self.roles[ordinal] = role
        self.watch.following = self._following()

    # ------------------------------------------------------------ failover
    def promotions(self) -> List[int]:
        """The groups the watch promoted this node in since last asked: the
        supervisor stops each one's follower, serves its copy
        (:data:`.roles.PRIMARY_COPY`) and says so (:meth:`runs`)."""
        won: List[int] = []
        while not self.watch.promoted.empty():
            ordinal, _group = self.watch.promoted.get()
            won.append(ordinal)
        return won

    def replan(self, ordinal: int) -> Optional[str]:
        """A shard of group ``ordinal`` found another node its primary (a
        promotion raced this node's start): the role etcd gives this node
        there now, if it is another (None: restart it as usual; it finds out
        again). The supervisor runs it and says so (:meth:`runs`)."""
        try:
            role = plan(self.spec, self.node, read_all(self.etcd)).get(ordinal)
        except CoordinationError:
            return None
        if role is None or role == self.roles.get(ordinal):
            return None
        log.warning("shard %d's primary is another node now: node %s follows it", ordinal, self.node)
        return role

    # ------------------------------------------------------------- fencing
    def silent(self, membership: Membership) -> bool:
        """Whether the node's lease went unrefreshed too long to act as a primary."""
        return membership.silent_for() > self.lease_ttl * FENCE_AFTER

    def fence(self, membership: Membership) -> None:
        """The lease went silent: this node's primaries stop (the supervisor
        kills them and starts none until the lease is back), and it promotes
        itself nowhere meanwhile."""
        self.fenced = True
        self.watch.paused.set()
        log.error("no etcd lease refresh for %.1f s: this node's primaries stop (another node "
                  "may be promoted in their place)", membership.silent_for())

    def lease_back(self) -> Optional[Dict[int, str]]:
        """The lease of a fenced node is back: the roles etcd gives it now,
        of the groups where they changed (None: etcd cannot be read yet).
        The supervisor replaces those groups' processes, lets its primaries
        run again, and then :meth:`resume`."""
        try:
            groups = read_all(self.etcd)
        except CoordinationError:
            return None
        self.fenced = False
        roles = plan(self.spec, self.node, groups)
        log.warning("etcd lease back: node %s in its shard groups: %s", self.node,
                    ", ".join(f"{k}: {role}" for k, role in sorted(roles.items())))
        changed = {ordinal: role for ordinal, role in roles.items() if role != self.roles.get(ordinal)}
        self.roles = roles
        return changed

    def resume(self) -> None:
        """Promote again where a primary's lease lapses (after :meth:`lease_back`)."""
        self.watch.following = self._following()
        self.watch.paused.clear()

