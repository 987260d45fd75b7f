"""The router of one node of a cluster.

It reaches every shard of every node: those of its own node over their Unix
sockets (with the direct path), the others over authenticated TCP links. A
queue name hashes to one of 16,384 slots and the :class:`SlotMap` says which
shard serves the slot; the slot goes along with the request, so a shard
that no longer serves it answers ``MOVED`` instead of serving it. The router
then corrects its map and sends the request again, to the new owner, at
most :data:`MAX_REDIRECTS` times: a client sees the owner's answer, never
the redirection.

A job id the directory places on a shard that no longer has it (it moved,
or it was made before the directory heard of it) is asked of every shard;
so is a job number, first at the shard that made it.

On etcd, the node's supervisor watches the cluster's state there and tells
its routers on their control sockets (:mod:`queueserver.cluster.watch`):
``["cluster", "view", runs, primaries, nodes]`` with etcd's slot map (taken
in by epoch, as a shard's news is), each shard group's primary (its link
goes there at once) and the nodes holding a lease (a link to a shard of any
other node is down). ``["cluster", "state"]`` answers what the router holds.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Dict, Final, List, Optional, Sequence, Tuple

import gevent

from ..cluster.clusterfile import MAX_SHARDS, ClusterSpec, load_cluster
from ..cluster.moves import SlotsSummary
from ..placement import slot_of
from ..engine.status import MOVED, NOT_FOUND, SERVER_ERROR, Reply
from ..net import linkauth
from ..protocols.base import BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, Command
from .fanout import FirstFound, Gather, SpreadLease
from ..links.primaries import PrimaryPlaces, shard_places, view_problem
from .router import Located, Pending, Router
from ..links.shardlink import Address, Auth, Places, ShardLink, where
from ..links.slotmap import SlotMap

if TYPE_CHECKING:
    from .config import ClusterPlace

log: Final = logging.getLogger("queueserver.router")

MAX_REDIRECTS: Final = 8
RETRY_DELAY: Final = 0.005      # seconds before a redirect with no new owner to try (doubles each time)

Callback = Callable[[Reply], None]


class ClusterRouter(Router):
    @classmethod
    def from_config(cls, cluster: "ClusterPlace", sockets: List[str],
                    options: Optional[Dict[str, Dict[str, Any]]] = None, index: int = 0, routers: int = 1,
                    limits: Optional[Dict[str, int]] = None, direct_path: bool = False,
                    history: bool = False) -> "ClusterRouter":
        """Links to every shard of ``cluster["file"]``, seen from node ``cluster["node"]``."""
        spec = load_cluster(cluster["file"])
        secret, tls = linkauth.client_credentials(spec.secret_file, spec.tls)
        addresses = shard_places(spec, cluster["node"], sockets.__getitem__)
        router = cls(spec, addresses, options, index, routers, limits, direct_path, history, auth=(secret, tls))
        router.key = f"{cluster['node']}/{router.index}"   # router 0 of every node: told apart
        router.node = router.primaries.node = cluster["node"]
        router.primaries.local = {shard.ordinal: sockets[shard.index] for shard in spec.shards_of(cluster["node"])}
        return router

    def __init__(self, spec: ClusterSpec, addresses: Sequence[Places],
                 options: Optional[Dict[str, Dict[str, Any]]] = None, index: int = 0, routers: int = 1,
                 limits: Optional[Dict[str, int]] = None, direct_path: bool = False, history: bool = False,
                 auth: Optional[Auth] = None) -> None:
        super().__init__(addresses, options, index, routers, limits, direct_path, history, auth)
        self.spec = spec
        self._auth = auth
        self.share_clients = True   # active-clients counts the whole cluster's
        self.map = SlotMap(spec.founders())
        #: shards that may hold a job (a removed node's shards have no link)
        self.reachable = [link for link in self.links if link.path is not None]
        #: this router's node
        self.node = ""
        #: what etcd said, through the supervisor: each group's primary (and
        #: this node's own shards' Unix sockets, where a primary at home here
        #: is reached), and the slot map last taken in
        self.primaries = PrimaryPlaces(spec, "", {})
        self._etcd_runs: List[List[int]] = []
        self.etcd_views = 0              # views told
        self.etcd_slots_changed = 0      # slots whose owner changed as etcd's map said

    # --------------------------------------------------------------- routing
    def shard_for(self, name: str) -> int:
        return self.map.owners[slot_of(name)]

    def home_of(self, id: str) -> int:
        return self.map.owners[slot_of(id)]

    def reachable_links(self) -> List[ShardLink]:
        return self.reachable

    def route(self, command: Command, callback: Callback, owner: Optional[int] = None,
              attempt: int = 0) -> Optional[Pending]:
        route, op = command.route, command.op
        assert op is not None   # a command that is routed has one (a LOCAL one has none)
        if route == BY_NAME:
            slot = slot_of(command.key)
            link = self.links[self.map.owners[slot]]
            answered = self._redirected(command, callback, owner, attempt, (slot,))
            if command.new_id is not None:
                return self._create(command, link, answered, slot)
            args = command.args if owner is None else (*command.args, owner)
            return link, link.call(op, args, answered, slot)
        if route == BY_NAMES:
            groups: Dict[ShardLink, List[str]] = {}
            slots: Dict[ShardLink, List[int]] = {}
            for name in command.key:
                slot = slot_of(name)
                link = self.links[self.map.owners[slot]]
                groups.setdefault(link, []).append(name)
                slots.setdefault(link, []).append(slot)
            every = [slot for group in slots.values() for slot in group]
            answered = self._redirected(command, callback, owner, attempt, every)
            if len(groups) == 1:
                link, names = next(iter(groups.items()))
                return link, link.call(op, [names] + list(command.args[1:]), answered, slots[link])
            return SpreadLease(groups, command.args[-1], answered, slots)
        if route == BY_ID:
            return self._by_id(command, self._redirected(command, callback, owner, attempt, ()))
        if route == BY_NUMBER:
            answered = self._redirected(command, callback, owner, attempt, ())
            maker = (command.key - 1) % MAX_SHARDS
            if maker >= len(self.links) or self.links[maker].path is None:
                return FirstFound(self.reachable, op, command.args, answered)
            return self._directed(self.links[maker], command, answered)
        return super().route(command, callback, owner)

    def _ask_home(self, id: str, located: Callback, pending: Located, attempt: int = 0) -> None:
        """``locate`` at the id's home, the owner of its slot (following
        ``MOVED`` as requests do)."""
        slot = slot_of(id)
        home = self.links[self.map.owners[slot]]

        def answered(reply: Reply) -> None:
            if reply[0] != MOVED or attempt >= MAX_REDIRECTS:
                located(reply if reply[0] != MOVED else [SERVER_ERROR, "Queue is moving between shards; try again"])
                return
            _, target, epoch = reply[1]
            again = lambda: self._ask_home(id, located, pending, attempt + 1)  # noqa: E731
            if target is not None and self._knows(target):
                self.map.set((slot,), target, epoch)
                self._later(attempt, again)
            else:
                self._refresh(again)

        pending.inner = (home, home.call("locate", [id], answered, slot))

    def _directed(self, link: ShardLink, command: Command, callback: Callback) -> Tuple[ShardLink, int]:
        """Ask the shard the job should be on; if it has no such job (any
        more), ask every shard."""
        op = command.op
        assert op is not None   # routed

        def answered(reply: Reply) -> None:
            if reply[0] == NOT_FOUND:
                others = [each for each in self.reachable if each is not link]
                if others:
                    FirstFound(others, op, command.args, callback)
                    return
            callback(reply)
        return link, link.call(op, command.args, answered)

    def _redirected(self, command: Command, callback: Callback, owner: Optional[int], attempt: int,
                    slots: Sequence[int]) -> Callback:
        """``callback``, unless the answer is MOVED: then the map is corrected
        and the request sent again."""
        def answered(reply: Reply) -> None:
            if reply[0] != MOVED:
                callback(reply)
                return
            if attempt >= MAX_REDIRECTS:
                log.warning("%s of %r: still redirected after %d tries; asking every shard for its "
                            "slots", command.op, command.key, attempt)
                self._refresh(lambda: None)   # whatever misled the map, the next request finds the owner
                callback([SERVER_ERROR, "Queue is moving between shards; try again"])
                return
            slot, target, epoch = reply[1]
            again = lambda: self.route(command, callback, owner, attempt + 1)  # noqa: E731
            if target is not None and 0 <= target and self._knows(target):
                # A MOVED speaks for the slot it names. One that names none
                # (a request held by a move, answered when the move ended)
                # speaks for a request of one slot; of several, which of them
                # moved is not said: the shards are asked instead.
                if slot is not None:
                    self.map.set((slot,), target, epoch)
                elif len(slots) == 1:
                    self.map.set(slots, target, epoch)
                elif slots:
                    self._refresh(again)
                    return
                if command.route in (BY_ID, BY_NUMBER):
                    self._later(attempt, lambda: self._directed_again(self.links[target], command,
                                                                       callback, owner, attempt + 1))
                    return
            if target is None:   # the shard cannot say who has it now: ask them all
                self._refresh(again)
            else:
                self._later(attempt, again)
        return answered

    def _refresh(self, then: Callable[[], object]) -> None:
        """Learn every reachable shard's slots, then ``then()``."""
        def merge(answers: List[Any]) -> Reply:   # the shards' SlotsAnswer, off the wire
            for answer in answers:
                self._learn(answer["shard"], answer, authoritative=True)
            return [0, None]

        def learnt(reply: Reply) -> None:
            gevent.spawn_later(RETRY_DELAY, then)
        Gather(self.reachable, "slots", [], merge, learnt)

    def _learn(self, shard: int, slots: SlotsSummary, authoritative: bool = False) -> None:
        """Take in a shard's account of its slots (its hello, or an answer to
        "slots"). ``authoritative``: asked of every shard just now, what a
        shard serves is the truth even where the map holds a newer epoch (a
        map gone wrong heals at the first refresh)."""
        self.map.served(shard, slots["served"], force=authoritative)
        self.map.hinted([hint for hint in slots["hints"] if self._knows(hint[1])])

    def _directed_again(self, link: ShardLink, command: Command, callback: Callback,
                        owner: Optional[int], attempt: int) -> None:
        self._directed(link, command, self._redirected(command, callback, owner, attempt, ()))

    @staticmethod
    def _later(attempt: int, retry: Callable[[], object]) -> None:
        """Right away the first time (the map was just corrected), then backing off."""
        if attempt == 0:
            retry()
        else:
            gevent.spawn_later(RETRY_DELAY * (1 << (attempt - 1)), retry)

    # ------------------------------------------------------------ new nodes
    def _knows(self, ordinal: Optional[int]) -> bool:
        """Whether there is a link to shard ``ordinal``; if not, the cluster
        file is read again for nodes appended since the start (a node added
        with ``cluster add-node``: the first news of it is a move to it)."""
        if ordinal is None or ordinal < len(self.links):
            return True
        try:
            spec = load_cluster(self.spec.path)
        except ValueError as err:
            log.warning("shard %d is new to this router, and the cluster file cannot be read: %s",
                        ordinal, err)
            return False
        for shard in spec.shards()[len(self.links):]:
            candidates: List[Address] = list(spec.candidates(shard.ordinal))
            link = ShardLink(shard.ordinal, candidates if spec.replicas else (shard.host, shard.port),
                             self._shard_event, self._shard_down,
                             self._link_up, None, self._context, self._auth)
            self.links.append(link)
            self.reachable.append(link)
            log.info("shard %s (ordinal %d) of node %s is new in %s: linking to %s:%d", shard.name,
                     shard.ordinal, shard.node, spec.path, shard.host, shard.port)
        self.spec = self.primaries.spec = spec
        return ordinal < len(self.links)

    # ------------------------------------------------------------ etcd's state
    def cluster_request(self, request: List[Any]) -> Dict[str, Any]:
        """``["cluster", "view", runs, primaries, nodes]`` (the supervisor's
        watch on etcd; ``nodes`` may be left out) or ``["cluster", "state"]``."""
        what = request[1] if len(request) > 1 else None
        if what == "state":
            return self._state()
        if what != "view" or len(request) not in (4, 5):
            return {"error": f"a router answers [\"cluster\", \"view\", runs, primaries, nodes] or "
                             f"[\"cluster\", \"state\"], not {request!r:.100}", "status": 400}
        runs, primaries = request[2], request[3]
        nodes = request[4] if len(request) == 5 else None
        problem = view_problem(runs, primaries, nodes)
        if problem:
            log.warning("cluster view refused: %s", problem)
            return {"error": f"cluster view refused: {problem}", "status": 400}
        self.etcd_views += 1
        if runs is not None and runs != self._etcd_runs:
            self._take_map(runs)
        for ordinal, epoch, node, copy in primaries:
            if self._knows(ordinal):
                self.primaries.take(self.links[ordinal], epoch, node, copy)
        if nodes is not None:
            self.primaries.leases(nodes, self.links)
        return {"taken": True}

    def _take_map(self, runs: List[List[int]]) -> None:
        """Etcd's ``[start, end, ordinal, epoch]`` runs, merged by epoch (a
        slot whose news here is newer keeps it)."""
        self._etcd_runs = runs
        changed = 0
        for start, end, owner, epoch in runs:
            if self._knows(owner):
                changed += self.map.set(range(start, end), owner, epoch)
        if changed:
            self.etcd_slots_changed += changed
            log.info("%d slots change shard as etcd's slot map says", changed)

    def _state(self) -> Dict[str, Any]:
        """What this router holds: its slot map as runs, each link's places,
        and what etcd told it."""
        return {"node": self.node, "slots": self.map.runs(),
                "links": [[link.index, where(link.paths[0]), where(link.path), link.up,
                           self.primaries.epochs.get(link.index, 0)] for link in self.links],
                **self.cluster_counts()}

    def cluster_counts(self) -> Dict[str, int]:
        return {"etcd_views": self.etcd_views, "etcd_slots_changed": self.etcd_slots_changed,
                "etcd_primary_switches": self.primaries.switches}

    # ----------------------------------------------------------- shard events
    def _shard_event(self, link: ShardLink, kind: str, body: Any) -> None:
        if kind == "hello" and "slots" in body:
            self._learn(link.index, body["slots"])
        elif kind == "owns":
            owner, ranges, epoch = body
            self.map.ranges_set(ranges, owner, epoch)
            return
        elif kind == "gave":
            ranges, target, epoch = body
            if self._knows(target):
                self.map.ranges_set(ranges, target, epoch)
            return
        super()._shard_event(link, kind, body)
