"""A shard's dealings with the homes of job ids (:mod:`.idhome`), both ways.

As a home, the shard keeps the registry of the ids homed here
(:class:`.idhome.IdHome`) and answers the other shards' requests about them
(:data:`REQUESTS`: claims of new ids, jobs that moved in, lookups, and the
list of its own jobs whose ids another shard is home to). As a maker of
jobs, it claims each new id at its home before the client hears back
(:meth:`Homes.claim`), tells homes when its jobs leave (:meth:`Homes.left`),
and keeps the links to the other shards this traffic goes over
(:mod:`.peers`).

On one host the shards share one table of every job id instead
(:mod:`.hostids`): a claim is settled there, and a home never needs to hear
of a job. A home out of reach (its shard down) must not stop adds to every
live queue: the id is taken as new, kept as *unchecked*, and registered at
its home once its link is back.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from functools import partial
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Set

import gevent

from ..cluster.clusterfile import load_cluster
from ..engine import Engine
from ..engine.status import NOT_FOUND, OK, SERVER_ERROR, Reply
from ..links.directory import SHARED
from ..links.primaries import PrimaryPlaces, shard_places
from ..links.slotmap import SlotMap
from ..net import linkauth
from ..placement import shard_for
from .clustering import Send, ShardInCluster
from .direct import Token
from .hostids import HostIds, key_of
from .idhome import IdHome
from .peers import DUPLICATE, GRANTED, Peers

log: Final = logging.getLogger("queueserver.shard")
UNCHECKED_PRUNE: Final = 4096   # ids kept for a home out of reach before those gone are dropped
HOMED_PAGE: Final = 50000   # ids per page of a "homed" answer

#: ``settle(id, token, reply, verdict)``: the home's verdict on the id of a
#: job just made (the request under ``token``, whose answer ``reply`` was
#: held: None for a ``run``): GRANTED, or the refusal to answer instead.
Settle = Callable[[str, Token, Optional[Reply], Reply], None]


class Homes:
    """The id homes as shard ``index`` (of ``shards``, or of ``cluster``)
    sees them; ``host_ids``: the host's shared table (one host only)."""

    def __init__(self, index: int, shards: int, engine: Engine, cluster: Optional[ShardInCluster],
                 host_ids: Optional[HostIds], settle: Settle) -> None:
        self.index = index
        self.shards = shards
        self.engine = engine
        self.cluster = cluster
        self._settle = settle
        #: the registry of the job ids homed here
        self.home = IdHome(index, engine.jobs.__contains__, self._ask_peer)
        #: the server's only shard (one host, no cluster): its engine, which
        #: refuses an id it holds, sees every job id there is; nothing to claim
        self.alone = cluster is None and shards == 1
        #: on one host of several shards: the table of every job id they share
        #: (None: ids are claimed at their homes by messages, as between hosts;
        #: or the only shard, which needs no table: a claim costs it two locks)
        self.host_ids = host_ids if cluster is None and not self.alone else None
        #: the links to the other shards (None: not linked yet, or the only shard)
        self.peers: Optional[Peers] = None
        #: whether the id home waits (a while) for every other shard's job list before it answers
        self.await_peers = True
        self._pages: Dict[int, List[str]] = {}   # shard -> ids listed for it, page by page
        #: home -> ids of jobs made here while it could not be asked (see unreachable)
        self._unchecked: Dict[int, Set[str]] = {}
        self._unchecked_prune: Dict[int, int] = {}
        self._unchecked_logged = 0.0

    def home_of(self, id: str) -> int:
        """The shard where job id ``id`` is at home (:mod:`.idhome`)."""
        if self.peers is not None:
            return self.peers.home_of(id)
        return shard_for(id, self.shards) if self.cluster is None else self.index

    def new_id(self) -> str:
        """A fresh job id at home here (a server-made id: its home is its job's shard)."""
        while True:
            id = str(uuid.uuid4())
            if self.home_of(id) == self.index:
                return id

    # ------------------------------------------------------------- claiming
    def claim(self, id: str, token: Token, reply: Optional[Reply]) -> Optional[Reply]:
        """A job was just made with ``id``: unless its home is sure no other
        job has it, hold the answer (``reply``; None for a ``run``, which
        waits anyway: None is returned) until the home grants the id; its
        verdict goes to ``settle``."""
        if self.alone:
            return reply   # its engine holds every job id there is, and refused a duplicate
        host_ids = self.host_ids
        if host_ids is not None:
            key = key_of(id)
            others = host_ids.claim(key, self.index)
            if not others:
                return reply   # no other shard of this host has a job with this key
        home = self.home_of(id)
        if host_ids is None and home == self.index and self.home.ready \
                and self.home.entries.shard_of(id) is None:
            return reply   # at home here, and no other shard's job has the id
        if host_ids is not None:
            self._check_others(id, key, others, [], partial(self._verdict, home, id, token, reply))
        elif home == self.index:
            self.home.claim(id, self.index, partial(self._home_verdict, id, token, reply))
        elif self.peers is None:
            return reply
        else:
            self.peers.claim(id, partial(self._verdict, home, id, token, reply))
        return None

    # (bound methods in partials, not closures: see idhome's claims)
    def _home_verdict(self, id: str, token: Token, reply: Optional[Reply], granted: bool) -> None:
        self._settle(id, token, reply, GRANTED if granted else DUPLICATE)

    def _verdict(self, home: int, id: str, token: Token, reply: Optional[Reply], result: Reply) -> None:
        if result[0] == SERVER_ERROR:
            # The home is out of reach: a shard that is down must not stop
            # adds to every live queue. The id is taken as new; the home
            # learns of the job when its link is back (_peer_up).
            self.unreachable(home, result, (id,))
            result = GRANTED
        self._settle(id, token, reply, result)

    def _check_others(self, id: str, key: int, others: List[int], checked: List[int],
                      verdict: Callable[[Reply], None]) -> None:
        """Other shards' entries in the host's table have the key of new job
        ``id``: a duplicate if one of them holds the id (or cannot say), else
        (a twin key, or an entry a restarted shard left) the key is taken
        beside theirs, unless yet another shard took it meanwhile: it is
        asked in turn."""
        host_ids = self.host_ids
        assert host_ids is not None   # called in the host table's claims only

        def checked_them(found: bool) -> None:
            if found:
                verdict(DUPLICATE)
                return
            checked.extend(others)
            more = host_ids.claim(key, self.index, checked)
            if more:
                self._check_others(id, key, more, checked, verdict)
            else:
                verdict(GRANTED)

        self.home.any_holds(others, id, checked_them)

    def left(self, ids: List[str]) -> None:
        """Jobs ``ids`` left this shard: forgotten at their ids' homes."""
        host_ids = self.host_ids
        if host_ids is not None:
            forget, index = host_ids.forget, self.index
            for id in ids:
                forget(key_of(id), index)
        elif self.peers is not None:
            home_of, index = self.home_of, self.index
            away: Optional[Dict[int, List[str]]] = None
            for id in ids:
                home = home_of(id)
                if home != index:
                    if away is None:
                        away = {}
                    away.setdefault(home, []).append(id)
            if away:
                for home, ids in away.items():
                    self.peers.forget(home, ids)

    def take_host_ids(self) -> None:
        """Before serving: the host's table says exactly which jobs are here
        (what a restart recovered, not what an earlier run left)."""
        if self.host_ids is not None:
            started = time.monotonic()
            self.host_ids.replace_owner(self.index, [key_of(id) for id in self.engine.jobs])
            log.info("shard %d: %d job ids in the host's table (%.2f s)", self.index, len(self.engine.jobs),
                     time.monotonic() - started)

    # ------------------------------------------------- homes out of reach
    def unreachable(self, home: int, error: Reply, ids: Sequence[str]) -> None:
        """Jobs ``ids`` were made (or moved in) while their home (-1: some
        home) could not be asked: kept to be registered there once its link
        is back (see :meth:`_register_unchecked`)."""
        for id in ids:
            at = home if home >= 0 else self.home_of(id)
            unchecked = self._unchecked.setdefault(at, set())
            unchecked.add(id)
            if len(unchecked) >= self._unchecked_prune.get(at, UNCHECKED_PRUNE):
                # a home down for long: forget the jobs that left meanwhile
                jobs = self.engine.jobs
                unchecked.intersection_update(jobs)
                self._unchecked_prune[at] = max(UNCHECKED_PRUNE, 2 * len(unchecked))
        now = time.monotonic()
        if now - self._unchecked_logged > 10:
            self._unchecked_logged = now
            log.warning("shard %d: the home of some job ids (%s) cannot be asked (%s); it learns of "
                        "their jobs from this shard once it is back, and new ids are taken as new "
                        "unchecked until then", self.index, f"shard {home}" if home >= 0 else "a shard",
                        error[1])

    def _register_unchecked(self, home: int) -> None:
        """The link to ``home`` is up again: the jobs made here while it was
        out of reach, still here, are registered there (its own listing of
        this shard may have been taken before they were made)."""
        peers = self.peers
        assert peers is not None   # its link calls this
        unchecked = self._unchecked.pop(home, None)
        if not unchecked:
            return
        jobs = self.engine.jobs
        ids = [id for id in unchecked if id in jobs]

        def registered(replies: List[Reply]) -> None:
            left = [id for id, reply in zip(ids, replies) if reply[0] != OK]
            if left:   # down again already: next time
                self._unchecked.setdefault(home, set()).update(left)

        if ids:
            peers.register(ids, registered)

    # ------------------------------------------------------------ the links
    def link(self, directory: str) -> bool:
        """Link to the other shards (whose sockets on this host are in
        ``directory``), and say whose job lists the home waits for: True if
        it waits, and :meth:`ticks` must then run."""
        peers = self.peers = self._link_peers(directory)
        if peers is not None and self.await_peers and self.host_ids is None:
            self.home.expect(peers.links)
            return True
        self.home.expect(())
        return False

    def ticks(self) -> None:
        """Until every other shard has listed its jobs at home here (or too long went by)."""
        while not self.home.ready:
            gevent.sleep(1.0)
            self.home.tick()

    def _link_peers(self, directory: str) -> Optional[Peers]:
        """Links to the other shards: this host's over their Unix sockets, a
        cluster's others over authenticated TCP (None: the only shard)."""
        cluster = self.cluster
        if cluster is None:
            if self.shards == 1:
                return None
            return Peers(self.index, [os.path.join(directory, f"shard-{i}.sock") for i in range(self.shards)],
                         self._peer_up, self._home_batch)
        spec = cluster.spec
        addresses = shard_places(spec, cluster.node,
                                 lambda index: os.path.join(directory, f"shard-{index}.sock"))
        peers = Peers(self.index, addresses, self._peer_up, self._home_batch,
                      linkauth.client_credentials(spec.secret_file, spec.tls), SlotMap(spec.founders()),
                      self._more_peers)
        if spec.etcd is not None:   # where the primaries are (with replicas) and which nodes are alive
            peers.primaries = PrimaryPlaces(spec, cluster.node, {
                shard.ordinal: os.path.join(directory, f"shard-{shard.index}.sock")
                for shard in spec.shards_of(cluster.node)})
        slots = self.engine.slots
        assert slots is not None, "a cluster's shard serves once it holds its slots"
        summary = slots.summary()
        peers.learn(self.index, summary["served"], summary["hints"])
        return peers

    def _more_peers(self) -> None:
        """Nodes appended to the cluster file since the start (``cluster
        add-node``): their shards are linked to, as they are to routers."""
        cluster, peers = self.cluster, self.peers
        assert cluster is not None and peers is not None   # the cluster's shards' links call this
        try:
            spec = load_cluster(cluster.spec.path)
        except ValueError as err:
            log.warning("shard %d: a shard is new, and the cluster file cannot be read: %s", self.index, err)
            return
        for shard in spec.shards():
            if shard.ordinal not in peers.links and shard.ordinal != self.index and not any(
                    node.removed for node in spec.nodes if node.name == shard.node):
                log.info("shard %d: linking to shard %s (ordinal %d) of node %s", self.index, shard.name,
                         shard.ordinal, shard.node)
                peers.add(shard.ordinal, (shard.host, shard.port))

    def _peer_up(self, shard: int) -> None:
        """A link to ``shard`` came up: it lists its jobs at home here, page by page."""
        peers = self.peers
        assert peers is not None   # its link calls this
        if self.host_ids is not None:
            return   # this host's jobs are all in its table: nothing to hear
        self.home.listing(shard)
        ids: List[str] = []

        def page(reply: Reply) -> None:
            if reply[0] != OK:   # gone again: it lists them when it is back
                return
            ids.extend(reply[1]["ids"])
            if reply[1]["next"] is None:
                self.home.listed(shard, ids)
                log.info("shard %d: shard %d has %d jobs with ids at home here", self.index, shard, len(ids))
            else:
                peers.ask(shard, "homed", [self.index, reply[1]["next"]], page)

        peers.ask(shard, "homed", [self.index, 0], page)
        self._register_unchecked(shard)

    def _ask_peer(self, shard: int, op: str, args: List[Any], callback: Callable[[Reply], None]) -> None:
        if self.peers is None:
            callback([NOT_FOUND, ""])
        else:
            self.peers.ask(shard, op, args, callback)

    def _home_batch(self, op: str, ids: List[str], results: Callable[[List[Reply]], None]) -> None:
        """Claims of (or jobs moved in with) ids homed here, from this very shard."""
        if op == "register":
            self.home.register(ids, self.index)
            results([[OK, True]] * len(ids))
            return
        home, index = self.home, self.index
        verdicts = [home.claim_now(id, index) for id in ids]
        ClaimVerdicts(verdicts, partial(_as_replies, results)).ask_the_rest(home, ids, index)

    def cluster_view(self, request: List[Any]) -> Dict[str, Any]:
        """The control socket's ``["cluster", ...]``: what the supervisor's
        watch on etcd says (see :meth:`.peers.Peers.cluster_view`)."""
        if self.peers is None:
            return {"error": "this shard links to no other shard", "status": 400}
        return self.peers.cluster_view(request)

    def stop(self) -> None:
        if self.peers is not None:
            self.peers.stop()

    # ------------------------------------------------------ as their home
    def _register(self, send: Send, args: Any) -> None:
        """Jobs of another shard that moved there (a slot move)."""
        self.home.register(args[1], args[0])
        send([OK, [True] * len(args[1])])

    def _claims(self, send: Send, args: Any) -> None:
        """Another shard made jobs with ids homed here: a verdict for each."""
        shard, ids = args
        home = self.home
        verdicts = [home.claim_now(id, shard) for id in ids]
        ClaimVerdicts(verdicts, partial(_send_verdicts, send)).ask_the_rest(home, ids, shard)

    def _locate(self, send: Send, args: Any) -> None:
        """Which shard holds the job of an id homed here (a router asks)."""
        def located(shard: Optional[int]) -> None:
            send([OK, shard] if shard is not None else [NOT_FOUND, ""])
        if self.host_ids is not None:
            located(self._locate_here(args[0]))
        else:
            self.home.locate(args[0], located)

    def _homed(self, send: Send, args: Any) -> None:
        """The jobs here whose home is ``home``, a page at a time."""
        home, start = args
        if start == 0:
            self._pages[home] = [id for id in self.engine.jobs if self.home_of(id) == home]
        ids = self._pages.get(home, [])
        end = start + HOMED_PAGE
        if end >= len(ids):
            self._pages.pop(home, None)
        send([OK, {"ids": ids[start:end], "next": end if end < len(ids) else None}])

    def _locate_here(self, id: str) -> Optional[int]:
        """Where job ``id`` is, by the host's table (SHARED: more than one
        shard has an entry with its key; None: no job has it)."""
        if id in self.engine.jobs:
            return self.index
        assert self.host_ids is not None   # asked only when there is one
        owners = self.host_ids.owners(key_of(id))
        if not owners:
            return None
        return owners[0] if len(owners) == 1 else SHARED


class ClaimVerdicts:
    """The verdicts on one batch of claims: most are given at once
    (:meth:`.idhome.IdHome.claim_now`); the rest (a home not ready yet, an
    entry to check) come later, and ``done(verdicts)`` is called once all
    are in."""

    def __init__(self, verdicts: List[Optional[bool]], done: Callable[[List[Optional[bool]]], None]) -> None:
        self.verdicts = verdicts
        self.done = done
        self.left = 0

    def ask_the_rest(self, home: IdHome, ids: List[str], shard: int) -> None:
        """Claim at ``home``, for ``shard``, each id with no verdict yet."""
        verdicts = self.verdicts
        rest = [i for i, verdict in enumerate(verdicts) if verdict is None]
        if not rest:
            self.done(verdicts)
            return
        self.left = len(rest)
        for i in rest:
            home.claim(ids[i], shard, partial(self._one, i))

    def _one(self, i: int, granted: bool) -> None:
        self.verdicts[i] = granted
        self.left -= 1
        if self.left == 0:
            self.done(self.verdicts)


def _send_verdicts(send: Send, verdicts: List[Optional[bool]]) -> None:
    send([OK, verdicts])


def _as_replies(results: Callable[[List[Reply]], None], verdicts: List[Optional[bool]]) -> None:
    results([GRANTED if granted else DUPLICATE for granted in verdicts])


#: The requests a shard answers as the home of ids (the operations
#: :data:`queueserver.engine.ops.OPS` flags ``ID_HOME``), by name:
#: ``handler(homes, send, args)``. Module-level, as the engine's
#: ``REQUESTS``: what mypyc compiles keeps no dicts of methods in a class body.
REQUESTS: Final[Dict[str, Callable[[Homes, Send, Any], None]]] = {
    "claims": Homes._claims, "register": Homes._register, "locate": Homes._locate, "homed": Homes._homed,
}
