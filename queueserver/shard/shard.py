"""The shard: one engine, its Unix socket, its one timer greenlet (the process
around it is :mod:`.process`).

The router sends ``[request_id, op, args]`` frames; the shard answers
``[request_id, reply]`` as soon as the engine has an answer, which for a
parked lease may be much later. Frames with request id 0 are events: the
shard's ``hello`` (on connect; in a cluster, its slots), and a router's
control frames ``cancel`` (withdraw a parked request), ``closed`` (a client
connection is gone) and ``clients`` (how many clients it serves).

Each shard is also the *home* of the job ids that hash to it
(:mod:`.idhome`): other shards claim new ids there and say when their jobs
leave, and routers ask it where a job lives (``locate``); it links to the
other shards for that (:mod:`.peers`). Nobody hears of jobs as they are
made: a router learns where a job is from the answers it carries, and asks
the id's home about any other.

When a router's link is lost, every connection of that router is treated
as closed: its parked requests are withdrawn and jobs leased to its
connections with close semantics (goqueue) are ready again.
"""
from __future__ import annotations

import gc
import itertools
import logging
import os
import time
import uuid
from functools import partial
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Set, Tuple, TypedDict

import gevent
from gevent import socket
from gevent.event import Event
from gevent.pool import Group

from ..engine import Engine
from ..engine.effects import Effects
from ..engine.job import LEASED as JOB_LEASED
from ..engine.ops import CLUSTER_OPS, ID_HOME_OPS, MAKES_JOBS
from ..engine.ownership import OutgoingMove, SlotOwnership
from ..engine.status import NOT_FOUND, OK, SERVER_ERROR, Reply
from .durability import Durability
from .replication import Replicator
from .idhome import IdHome
from .hostids import HostIds, key_of
from ..links.directory import SHARED
from ..links.primaries import PrimaryPlaces
from .peers import DUPLICATE, GRANTED, Peers
from ..links.shardlink import STOPPING, Address, Places
from .direct import DirectHost, DirectServer, Token
from ..links.slotmap import SlotMap
from .history import Context, HistoryWriter
from ..links.clients import VIA_ROUTER, ClientRecord
from ..net.channel import FrameChannel
from ..net.handoff import HandoffChannel, handoff_path, listen_seqpacket
from .stats import ShardStats
from .clustering import ShardInCluster
from ..cluster.clusterfile import MAX_SHARDS, load_cluster
from ..net import faults, linkauth
from ..placement import from_ranges, shard_for, slot_of
from ..jobnumbers import Blocks, NumberFile, NumbersError

log: Final = logging.getLogger("queueserver.shard")
UNCHECKED_PRUNE: Final = 4096   # ids kept for a home out of reach before those gone are dropped


class Retention(TypedDict, total=False):
    """How long a shard keeps its history files (see :class:`.history.HistoryWriter`)."""
    max_bytes: Optional[int]
    max_age: Optional[float]
    checkpoint: Optional[str]


def now_us() -> int:
    return time.time_ns() // 1000


class Shard(DirectHost):
    def __init__(self, index: int, path: str, max_queues: Optional[int] = None,
                 queue_idle: float = 0.0, shards: int = 1, direct_path: bool = False,
                 data_dir: Optional[str] = None, fsync: str = "always",
                 fsync_interval: float = 1000.0, compact_after_bytes: int = 64 << 20,
                 history_dir: Optional[str] = None, cluster: Optional[ShardInCluster] = None,
                 history_retention: Optional[Retention] = None, numbers: Optional[str] = None,
                 host_ids: Optional[HostIds] = None) -> None:
        #: in a cluster: its TCP links and its slots (None: one host)
        self.cluster = cluster
        if cluster is not None:   # known by its ordinal; numbers stride over any cluster's shards
            index, shards = cluster.me.ordinal, MAX_SHARDS
        self.index = index
        self.path = path
        self.shards = shards
        self.direct_path = direct_path
        self.engine = Engine(shard=index, max_queues=max_queues,
                             queue_idle=int(queue_idle * 1_000_000) or None, shards=shards)
        self.channels: Dict[int, FrameChannel] = {}
        #: channel -> [router key, its clients], as the router sent it
        self.router_clients: Dict[int, List[Any]] = {}
        self.router_channels: Dict[int, int] = {}   # router index -> its channel
        #: what the engine's steps caused that is still to be carried out
        self._later: List[Tuple[Token, Reply]] = []   # answers to parked requests
        #: the registry of the job ids homed here, and the links to the other shards
        self.home = IdHome(index, self.engine.jobs.__contains__, self._ask_peer)
        #: on one host: the table of every job id its shards share (None: ids
        #: are claimed at their homes by messages, as between hosts)
        self.host_ids = host_ids if cluster is None else None
        self.peers: Optional[Peers] = None
        #: whether the id home waits (a while) for every other shard's job list before it answers
        self.await_peers = True
        self._homed: Dict[int, List[str]] = {}   # shard -> ids listed for it, page by page
        #: home -> ids of jobs made here while it could not be asked (see _home_unreachable)
        self._unchecked: Dict[int, Set[str]] = {}
        self._unchecked_prune: Dict[int, int] = {}
        self._unchecked_logged = 0.0
        #: the shard's log, when it is durable (None: jobs live in memory only)
        self.durability: Optional[Durability] = None
        if data_dir is not None:
            durability = self.durability = Durability(data_dir, index, shards, fsync, fsync_interval,
                                                      compact_after_bytes)
            if cluster is not None and cluster.spec.replicas:
                # the primary of its group: every answer waits for the in-sync followers too
                durability.replicator = Replicator(self.engine.snapshot, lambda: durability.appended,
                                                   durability.release, cluster.me.name,
                                                   backlog_limit=cluster.spec.replica_backlog)
        #: the job history (None: not kept), and who is behind parked requests
        self.history: Optional[HistoryWriter] = None
        self._contexts: Dict[Token, Context] = {}
        #: who each leased job's lease went to (job id -> its client's record), for
        #: the console: set on every lease; an entry whose job is no longer leased
        #: is stale and swept away (see :meth:`_held`)
        self.holders: Dict[str, ClientRecord] = {}
        self._sweep_holders_at = HOLDERS_SWEEP
        #: the clients of parked lease requests (token -> record), until they are answered
        self._lessees: Dict[Token, ClientRecord] = {}
        #: the clients each router's channel told of (channel -> connection id -> record)
        self.clients: Dict[int, Dict[int, ClientRecord]] = {}
        if history_dir is not None:
            self.history = HistoryWriter(history_dir, index, **(history_retention or {}))
            self.engine.history = True
        #: where this shard takes blocks of job numbers (None: its residue class, as in a cluster)
        self.blocks: Optional[Blocks] = None
        if numbers is not None and cluster is None:
            self.blocks = Blocks(NumberFile(numbers, durable=data_dir is not None), index)
            self.engine.give_numbers(0, 0)   # the first job that needs one takes a block
        self._numbers_refused = 0.0
        self.direct = DirectServer(self)
        self.stats = ShardStats(self.index)   # /metrics: counts once attached, after recovery
        self._ids = itertools.count(1)
        self._rearm = Event()
        self._armed: Optional[int] = None
        self._after_batch_scheduled = False
        #: requests executed that came over a socket (a client's, directly or
        #: through a router, or another shard's ask), and the event-loop turns
        #: that executed any (for ``/status``: requests per turn; see :meth:`_count_turn`)
        self.requests_run = 0
        self.request_turns = 0
        self._turn_requests = 0      # requests_run as the last turn counted left it
        self._turn_iteration = -1    # the hub loop's iteration that turn was counted in
        #: every greenlet that may run a request or a timer, stopped before the log closes
        self._tasks = Group()
        self.stopping = False

    @staticmethod
    def now() -> int:
        return now_us()

    def execute(self, op: str, args: Sequence[Any], token: Optional[Token] = None,
                client: Optional[ClientRecord] = None) -> Optional[Reply]:
        """Run one request on the engine and take in its effects; its own
        reply, or None when it waits under ``token``. ``client``: whose
        request it is, if known: a lease's holder, and who the history names."""
        if self.stopping:   # the log may be closing: change nothing
            return [SERVER_ERROR, "Shard is stopping"]
        if token is not None:   # one that came over a socket (the shard's own steps carry none)
            self.requests_run += 1
        if op in MAKES_JOBS and self.engine.needs_numbers():
            refused = self._take_numbers()
            if refused is not None:
                return refused
        if self.durability is not None:
            refused = self.durability.refusal(op)
            if refused is not None:
                return refused
        now = now_us()
        fx = self.engine.execute(op, args, now, token)
        self.take_effects(fx)
        reply = fx.reply
        if op == "lease" and client is not None:   # who holds it, for the console
            if reply is None:
                if token is not None:
                    self._lessees[token] = client   # parked: its answer names the job
            elif reply[0] == OK:
                holders = self.holders
                holders[reply[1][0]] = client   # (inline: one dict entry is all a lease costs)
                if len(holders) >= self._sweep_holders_at:
                    self._sweep_holders()
        if fx.placed and op in MAKES_JOBS and token is not None:
            reply = self._claim(fx.placed[0], token, reply)
        if fx.history is not None and self.history is not None:   # (the engine's is on only then)
            context = client.context if client is not None else None
            if reply is None and context is not None and token is not None:
                self._contexts[token] = context   # parked: a lease may go to it later
            if fx.history:
                self.history.record(fx.history, now, context, self._lessee(token, context))
        return reply

    def _held(self, id: str, client: ClientRecord) -> None:
        """Job ``id`` was leased to ``client`` (a parked lease answered; an
        immediate one does this inline in :meth:`execute`)."""
        holders = self.holders
        holders[id] = client
        if len(holders) >= self._sweep_holders_at:
            self._sweep_holders()

    def _sweep_holders(self) -> None:
        """Entries of ``holders`` are not removed when a lease ends (no cost
        on that path): once they are twice as many as were left last time,
        those whose job is no longer leased are swept (amortized: a lookup
        per lease)."""
        jobs = self.engine.jobs
        kept: Dict[str, ClientRecord] = {}
        for held, record in self.holders.items():
            job = jobs.get(held)
            if job is not None and job.state == JOB_LEASED:
                kept[held] = record
        self.holders = kept
        self._sweep_holders_at = max(HOLDERS_SWEEP, 2 * len(kept))

    def holder(self, id: str) -> Optional[ClientRecord]:
        """Who holds leased job ``id`` (None: not leased, or not known)."""
        job = self.engine.jobs.get(id)
        if job is None or job.state != JOB_LEASED:
            return None
        return self.holders.get(id)

    # ------------------------------------------------------------- id homes
    def cluster_view(self, request: List[Any]) -> Dict[str, Any]:
        """The control socket's ``["cluster", ...]``: what the supervisor's
        watch on etcd says (see :meth:`.peers.Peers.cluster_view`)."""
        if self.peers is None:
            return {"error": "this shard links to no other shard", "status": 400}
        return self.peers.cluster_view(request)

    def home_of(self, id: str) -> int:
        """The shard where job id ``id`` is at home (:mod:`.idhome`)."""
        if self.peers is not None:
            return self.peers.home_of(id)
        return shard_for(id, self.shards) if self.cluster is None else self.index

    def _claim(self, id: str, token: Token, reply: Optional[Reply]) -> Optional[Reply]:
        """A job was just made with ``id``: unless its home is sure no other
        job has it, hold the answer (``reply``; None for a ``run``, which
        waits anyway) until the home grants the id; if it refuses, the job
        goes and the answer is the refusal."""
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

        def verdict(result: Reply) -> None:
            if result[0] == SERVER_ERROR:
                # The home is out of reach: a shard that is down must not stop
                # adds to every live queue. The id is taken as new; the home
                # learns of the job when its link is back (_peer_up).
                self._home_unreachable(home, result, (id,))
                result = GRANTED
            if result[0] != OK:
                self.execute("withdraw_new", (id,))
                if reply is not None:
                    self._later.append((token, result))
            elif reply is not None:
                self._later.append((token, reply))
            self.schedule_after_batch()

        if host_ids is not None:
            self._check_others(id, key, others, [], verdict)
        elif home == self.index:
            self.home.claim(id, self.index, lambda granted: verdict(GRANTED if granted else DUPLICATE))
        elif self.peers is None:
            return reply
        else:
            self.peers.claim(id, verdict)
        return None

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

    def take_host_ids(self) -> None:
        """Before serving: the host's table says exactly which jobs are here
        (what a restart recovered, not what an earlier run left)."""
        if self.host_ids is not None:
            started = time.monotonic()
            self.host_ids.replace_owner(self.index, [key_of(id) for id in self.engine.jobs])
            log.info("shard %d: %d job ids in the host's table (%.2f s)", self.index, len(self.engine.jobs),
                     time.monotonic() - started)

    def _home_unreachable(self, home: int, error: Reply, ids: Sequence[str]) -> None:
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

    def _home_batch(self, op: str, ids: List[str], results: Callable[[List[Reply]], None]) -> None:
        """Claims of (or jobs moved in with) ids homed here, from this very shard."""
        if op == "register":
            self.home.register(ids, self.index)
            results([[OK, True]] * len(ids))
            return
        out: List[Reply] = [GRANTED] * len(ids)
        left = [len(ids)]

        def one(i: int, granted: bool) -> None:
            out[i] = GRANTED if granted else DUPLICATE
            left[0] -= 1
            if left[0] == 0:
                results(out)

        for i, id in enumerate(ids):
            self.home.claim(id, self.index, partial(one, i))

    def _ask_peer(self, shard: int, op: str, args: List[Any], callback: Callable[[Reply], None]) -> None:
        if self.peers is None:
            callback([NOT_FOUND, ""])
        else:
            self.peers.ask(shard, op, args, callback)

    def _link_peers(self) -> Optional[Peers]:
        """Links to the other shards: this host's over their Unix sockets, a
        cluster's others over authenticated TCP (None: the only shard)."""
        directory = os.path.dirname(self.path)
        cluster = self.cluster
        if cluster is None:
            if self.shards == 1:
                return None
            return Peers(self.index, [os.path.join(directory, f"shard-{i}.sock") for i in range(self.shards)],
                         self._peer_up, self._home_batch)
        spec = cluster.spec
        removed = {node.name for node in spec.nodes if node.removed}
        addresses: List[Places] = []
        for shard in spec.shards():
            if shard.node in removed:
                addresses.append(None)
                continue
            here: Address = (os.path.join(directory, f"shard-{shard.index}.sock") if shard.node == cluster.node
                             else (shard.host, shard.port))
            if spec.replicas:   # its primary may serve on a follower's node (a failover)
                places: List[Address] = [here]   # its home's TCP address too: a copy taken over here
                places += [a for a in spec.candidates(shard.ordinal) if a != here]
                addresses.append(places)
            else:
                addresses.append(here)
        peers = Peers(self.index, addresses, self._peer_up, self._home_batch,
                      linkauth.client_credentials(spec.secret_file, spec.tls), SlotMap(spec.founders()),
                      self._more_peers)
        if spec.etcd is not None:   # where the primaries are (with replicas) and which nodes are alive
            peers.primaries = PrimaryPlaces(spec, cluster.node, {
                shard.ordinal: os.path.join(directory, f"shard-{shard.index}.sock")
                for shard in spec.shards_of(cluster.node)})
        summary = self._slots().summary()
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

    def new_id(self) -> str:
        """A fresh job id at home here (a server-made id: its home is its job's shard)."""
        while True:
            id = str(uuid.uuid4())
            if self.home_of(id) == self.index:
                return id

    def _home_ticks(self) -> None:
        """Until every other shard has listed its jobs at home here (or too long went by)."""
        while not self.home.ready:
            gevent.sleep(1.0)
            self.home.tick()

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

    def _home_op(self, channel: FrameChannel, req_id: int, op: str, args: Any) -> None:
        """A request about ids homed here, or about this shard's jobs of another home."""
        send = partial(_send_reply, channel, req_id)
        if op == "register":   # jobs of another shard that moved there (a slot move)
            self.home.register(args[1], args[0])
            send([OK, [True] * len(args[1])])
        elif op == "claims":
            shard, ids = args
            verdicts: List[Optional[bool]] = [None] * len(ids)   # each set before they are sent
            left = [len(ids)]

            def one(i: int, granted: bool) -> None:
                verdicts[i] = granted
                left[0] -= 1
                if left[0] == 0:
                    send([OK, verdicts])

            for i, id in enumerate(ids):
                self.home.claim(id, shard, partial(one, i))
            if not ids:
                send([OK, []])
        elif op == "locate":
            def located(shard: Optional[int]) -> None:
                send([OK, shard] if shard is not None else [NOT_FOUND, ""])
            if self.host_ids is not None:
                located(self._locate_here(args[0]))
            else:
                self.home.locate(args[0], located)
        elif op == "homed":   # the jobs here whose home is ``home``, a page at a time
            home, start = args
            if start == 0:
                self._homed[home] = [id for id in self.engine.jobs if self.home_of(id) == home]
            ids = self._homed.get(home, [])
            end = start + HOMED_PAGE
            if end >= len(ids):
                self._homed.pop(home, None)
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

    def _take_numbers(self) -> Optional[Reply]:
        """A fresh block of job numbers, before a request that makes a job;
        the request's error when none can be had."""
        blocks = self.blocks
        assert blocks is not None   # the engine needs numbers only where blocks give them
        try:
            self.engine.give_numbers(*blocks.take(self.engine.last_number))
        except (NumbersError, OSError) as err:
            now = time.monotonic()
            if now - self._numbers_refused > 10:
                self._numbers_refused = now
                log.error("shard %d cannot take job numbers: %s", self.index, err)
            return [SERVER_ERROR, "Cannot number jobs now; try again"]
        return None

    def makes(self, number: int) -> bool:
        """Whether job ``number`` would be here (a goqueue DELETE served directly)."""
        blocks = self.blocks
        if blocks is None:   # numbers of this shard's residue class; in a cluster, maybe moved here
            return (number - 1) % self.shards == self.index and (
                self.cluster is None or self.engine.has_number(number))
        if blocks.numbers.is_old(number):
            return self.engine.has_number(number)
        return blocks.numbers.owner(number) == self.index

    def _lessee(self, token: Optional[Token], context: Context) -> Callable[[Any], Context]:
        """The context of the request a lease went to (by its token)."""
        contexts = self._contexts
        return lambda lessee: context if lessee == token else contexts.get(lessee)

    def take_effects(self, fx: Effects) -> None:
        """Keep what a step caused, to be carried out at the end of the batch
        (a durable shard's log gets its events at once); jobs that left are
        forgotten at their ids' homes."""
        if self.durability is not None:
            self.durability.record(fx)
        if fx.later:
            self._later += fx.later
        if fx.forgotten and self.host_ids is not None:
            forget, index = self.host_ids.forget, self.index
            for id in fx.forgotten:
                forget(key_of(id), index)
        elif fx.forgotten and self.peers is not None:
            home_of, index = self.home_of, self.index
            away: Optional[Dict[int, List[str]]] = None
            for id in fx.forgotten:
                home = home_of(id)
                if home != index:
                    if away is None:
                        away = {}
                    away.setdefault(home, []).append(id)
            if away:
                for home, ids in away.items():
                    self.peers.forget(home, ids)

    def answer(self, send: Callable[[Reply], None], reply: Reply) -> None:
        """``send(reply)``; on a durable shard, once the log holds every
        change made before it."""
        if self.durability is None:
            send(reply)
        else:
            self.durability.answer(send, reply)

    def recover(self) -> None:
        """A durable shard, before serving: rebuild the engine from its log.
        Nobody holds a lease any more, so leased jobs are ready again: the
        history says they were ``released``."""
        started = time.monotonic()
        # Replaying makes objects by the million and frees none: the cycle
        # collector would only rescan them. Afterwards they are frozen out
        # of its sight (they are freed by reference counting as usual).
        durability = self.durability
        assert durability is not None   # only a durable shard recovers
        gc.disable()
        try:
            records, _ = durability.recover(self.engine)
        finally:
            gc.enable()
        gc.freeze()
        if self.blocks is not None and self.blocks.numbers.upgrading():
            # an older data directory: say the highest number made here before blocks
            self.blocks.numbers.raise_floor(self.engine.last_number, self.index)
        now = now_us()
        fx = self.engine.recovered(now)
        self.take_effects(fx)
        if fx.history and self.history is not None:
            self.history.record(fx.history, now, None, self._contexts.get)
        durability.commit()
        log.info("shard %d recovered %d jobs in %d queues from %d log records in %.2f s",
                 self.index, len(self.engine.jobs), len(self.engine.queues), records,
                 time.monotonic() - started)

    def join_cluster(self) -> None:
        """A shard that never served in its cluster takes its starting slots
        (logged, so a restart never changes what it owns)."""
        cluster = self.cluster
        assert cluster is not None   # called in a cluster only
        if self.engine.slots is None:
            self.take_effects(self.engine.execute("claim", [cluster.initial_slots()], now_us()))
            if self.durability is not None:
                self.durability.commit()
        log.info("shard %s serves %d of the cluster's slots", cluster.me.name, self._slots().owned())

    def _slots(self) -> SlotOwnership:
        """The engine's slots: a cluster's shard has them once it joined (or recovered)."""
        slots = self.engine.slots
        assert slots is not None, "a cluster's shard serves once it holds its slots"
        return slots

    def serves(self, name: str) -> bool:
        """Whether queue ``name`` is this shard's to serve now."""
        if self.cluster is not None:
            slots = self.engine.slots
            assert slots is not None   # a cluster's shard serves once it holds its slots
            return slots.serving(slot_of(name))
        return shard_for(name, self.shards) == self.index

    # ---------------------------------------------------------------- serving
    def serve(self) -> None:
        self.take_host_ids()   # before listening: no claim may miss a job recovered here
        if self.direct_path:   # ready before the link, which routers connect to first
            self._tasks.spawn(self._serve_handoffs, listen_seqpacket(handoff_path(self.path), socket))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(self.path):
            os.unlink(self.path)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        listener.listen(64)
        log.info("shard %d listening on %s (pid %d)", self.index, self.path, os.getpid())
        # The supervisor publishes the ports once every shard is ready.
        open(self.path + ".ready", "w").close()
        self._tasks.spawn(self._timer_loop)
        self.peers = self._link_peers()
        if self.peers is not None and self.await_peers and self.host_ids is None:
            self.home.expect(self.peers.links)
            self._tasks.spawn(self._home_ticks)
        else:
            self.home.expect(())
        if self.cluster is not None:
            self._tasks.spawn(self.cluster.listen, self._serve_channel)
            if faults.CUT_OFF_FILE is not None:
                self._tasks.spawn(faults.watch, self._cut)
        if self.durability is not None and self.durability.replicator is not None:
            self.durability.replicator.start()
        while True:
            sock, _ = listener.accept()
            self._tasks.spawn(self._serve_channel, sock)

    def _cut(self) -> None:
        """Fault injection: links from other nodes (TCP) go down while this node is cut off."""
        for channel in list(self.channels.values()):
            if channel.sock.family != socket.AF_UNIX:
                channel.close()

    def _serve_handoffs(self, listener: socket.socket) -> None:
        """Routers connect here to hand client connections over (the direct path)."""
        while True:
            sock, _ = listener.accept()
            self._tasks.spawn(self._serve_handoff_channel, HandoffChannel(sock))

    def _serve_handoff_channel(self, channel: HandoffChannel) -> None:
        try:
            channel.receive(lambda fd, move: self.direct.arrived(channel, fd, move), self.direct.on_gone)
        finally:
            self.direct.gone_router(channel)
            channel.close()

    def _serve_channel(self, sock: socket.socket) -> None:
        cid = next(self._ids)
        channel = FrameChannel(sock)
        self.channels[cid] = channel
        self._hello(channel)
        execute = self.execute
        durability = self.durability
        cluster = self.cluster
        engine = self.engine
        replicator = durability.replicator if durability is not None else None

        known: Dict[int, ClientRecord] = {}   # the clients this channel's router told of
        self.clients[cid] = known

        def handle(frame: Any) -> None:   # [request id, op, args, client?, slots?] (msgpack)
            req_id, op, args = frame[0], frame[1], frame[2]
            if req_id == 0:  # a control frame from a router (or, forget, another shard)
                if op == "client":  # who a connection of that router is (its requests name it by id)
                    known[args[0]] = ClientRecord.from_description(args, VIA_ROUTER)
                elif op == "left":  # that connection closed (a lease may still name it)
                    record = known.pop(args, None)
                    if record is not None:
                        record.left = now_us()
                elif op == "forget":  # jobs of another shard that left it, ids homed here
                    self.home.forget(args[1], args[0])
                elif op == "cancel":  # withdraw this channel's parked request
                    execute("cancel", ((cid, args),))
                elif op == "closed":  # a client connection of that router is gone
                    execute("disown", ((cid, args),))
                elif op == "clients":  # how many clients that router serves
                    self.router_clients[cid] = args
                elif op == "router":  # which router this channel belongs to
                    self.router_channels[args] = cid
                elif op == "ack" and replicator is not None:   # a follower holds the stream up to args
                    replicator.acked(channel, args)
                elif op == "replicate" and replicator is not None:   # a follower asks for the stream
                    replicator.attach(channel, args[0])
                return
            if op == "homed":   # a home lists the jobs of its ids here (no slot: never MOVED)
                self._home_op(channel, req_id, op, args)
                return
            if cluster is not None:
                if op in CLUSTER_OPS:
                    self._cluster_op(channel, req_id, op, args)
                    return
                slots = frame[4] if len(frame) > 4 else None
                if slots is not None or op not in ID_HOME_OPS:
                    verdict = cluster.verdict(engine, args, slots)
                    if verdict is not None:
                        if isinstance(verdict, list):
                            channel.send([req_id, verdict])
                        else:
                            cluster.hold(verdict, partial(_send_reply, channel, req_id))
                        return
            if op in ID_HOME_OPS:
                self._home_op(channel, req_id, op, args)
                return
            try:
                reply = execute(op, args, (cid, req_id), known.get(frame[3]) if len(frame) > 3 else None)
            except Exception as err:  # a bug must not take the shard down
                log.exception("shard %d: %s %r failed", self.index, op, args)
                reply = [SERVER_ERROR, f"{type(err).__name__}"]
            if reply is not None:
                if op == "inspect_server" and reply[0] == 0:
                    reply[1]["router-clients"] = list(self.router_clients.values())
                if durability is None:
                    channel.send([req_id, reply])
                else:
                    durability.answer(partial(_send_reply, channel, req_id), reply)

        try:
            channel.receive(handle, self._after_batch)
        except Exception:  # an undecodable stream: drop this channel only
            log.exception("shard %d: channel %d sent what cannot be decoded", self.index, cid)
        finally:
            if replicator is not None:
                replicator.detach(channel)
            del self.channels[cid]
            self.router_clients.pop(cid, None)
            gone = now_us()
            for record in self.clients.pop(cid, {}).values():   # its router's connections are gone
                record.left = gone
            for router in [r for r, c in self.router_channels.items() if c == cid]:
                del self.router_channels[router]
            # The router is gone: so is every connection it served.
            engine = self.engine
            for token in [t for t in engine.waiters if t[0] == cid]:
                execute("cancel", (token,))
            for owner in [o for o in engine.owned if o[0] == cid]:
                execute("disown", (owner,))
            self._after_batch()
            channel.close()

    def _hello(self, channel: FrameChannel) -> None:
        """Greet a (re)connected router or shard (in a cluster, with the
        slots served here: routers keep their slot maps from these)."""
        hello: Dict[str, object] = {"shard": self.index}
        if self.engine.slots is not None:
            hello["slots"] = self.engine.slots.summary()
        channel.send([0, "hello", hello])

    def _cluster_op(self, channel: FrameChannel, req_id: int, op: str, args: Any) -> None:
        """A request of ``queueserver cluster`` (or a router asking for the map)."""
        slots = self._slots()
        if op == "slots":
            answer: Dict[str, Any] = {"shard": self.index, **slots.summary(), "jobs": len(self.engine.jobs)}
            if self.durability is not None and self.durability.replicator is not None:
                answer["followers"] = self.durability.replicator.status()
            channel.send([req_id, [OK, answer]])
            return
        move = slots.moves.get(args[0]) if op == "move_done" else None
        named: Sequence[int] = from_ranges(args[0]) if op in ("move_in", "move_out") else ()
        fresh = op == "move_in" and any(slots.epochs[slot] < args[1] for slot in named)
        homes = args[4] if op == "move_in" and len(args) > 4 else None
        reply = self.execute(op, args[:4] if op == "move_in" else args)
        assert reply is not None   # asked with no token: never parked
        if reply[0] == OK and op == "move_out" and (len(args) < 4 or args[3] == 0):
            # the ids homed in these slots go along with them (their home moves)
            reply[1]["homes"] = self.home.entries.export(set(named))
        if reply[0] == OK and op == "move_in":
            if homes:
                self.home.entries.import_(homes)
            if fresh and (len(args) < 4 or args[3]) and self.peers is not None and self.peers.slots is not None:
                self.peers.slots.ranges_set(args[0], self.index, args[1])
            ids = [event[1] for event in args[2]]
            if ids and self.peers is not None:   # their homes learn they live here before the move ends
                self.peers.register(ids, lambda replies: self._moved_in(channel, req_id, op, args, reply,
                                                                        fresh, named, replies))
                return
        if reply[0] == OK and move is not None:
            self.home.entries.export(set(from_ranges(move.ranges)), drop=True)
            if self.peers is not None and self.peers.slots is not None:
                self.peers.slots.ranges_set(move.ranges, move.target, move.epoch)
        self._cluster_answer(channel, req_id, op, args, reply, fresh, named, move)

    def _moved_in(self, channel: FrameChannel, req_id: int, op: str, args: Any, reply: Reply, fresh: bool,
                  named: Sequence[int], registered: List[Reply]) -> None:
        failed = [r for r in registered if r[0] != OK]
        if failed:   # a home out of reach learns of them once its link is back
            self._home_unreachable(-1, failed[0], [event[1] for event, r in zip(args[2], registered)
                                                   if r[0] != OK])
        self._cluster_answer(channel, req_id, op, args, reply, fresh, named, None)

    def _cluster_answer(self, channel: FrameChannel, req_id: int, op: str, args: Any, reply: Reply,
                        fresh: bool, named: Sequence[int], move: Optional[OutgoingMove]) -> None:
        slots, cluster = self._slots(), self.cluster
        assert cluster is not None   # a cluster's request
        if reply[0] == OK:
            if fresh and (len(args) < 4 or args[3]):   # the last part: the slots are ours now
                log.info("shard %s took %d slots (epoch %d), %d jobs in the last part",
                         cluster.me.name, len(named), args[1], reply[1])
                self._broadcast([0, "owns", [self.index, args[0], args[1]]])
                self.stats.slots_moved("in", len(named))
            elif op == "move_out" and (len(args) < 4 or args[3] == 0):
                log.info("shard %s is giving %d slots to shard %d (epoch %d): %d jobs set aside",
                         cluster.me.name, len(named), args[1], args[2],
                         len(slots.moves[args[2]].jobs))
            elif move is not None:
                given = len(from_ranges(move.ranges))
                log.info("shard %s gave %d slots to shard %d (epoch %d)", cluster.me.name,
                         given, move.target, move.epoch)
                self._broadcast([0, "gave", [move.ranges, move.target, move.epoch]])
                self.stats.slots_moved("out", given)
                # Its waiting requests go to the new owner once the log says so.
                self.answer(partial(_released, cluster, move), reply)
        self.answer(partial(_send_reply, channel, req_id), reply)
        self._after_batch()

    def _broadcast(self, frame: List[Any]) -> None:
        for channel in self.channels.values():
            channel.send(frame)

    def say_stopping(self) -> None:
        """Tell every router and shard linked here that this one stops
        cleanly (they log its going as such, not as a lost shard); sent now,
        before the loop that would send it ends."""
        self._broadcast([0, STOPPING, None])
        gevent.sleep(0)   # one loop turn: the writers send what is queued

    def stop(self) -> None:
        """Take no more requests and run no more timers, before the history
        and the log close: nothing may be appended to them afterwards (a
        request that still arrives on a handed-over connection is refused)."""
        self.stopping = True
        self._tasks.kill()
        if self.durability is not None and self.durability.replicator is not None:
            self.durability.replicator.stop()
        if self.peers is not None:
            self.peers.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def schedule_after_batch(self) -> None:
        """Run :meth:`_after_batch` once at the end of this loop turn."""
        if not self._after_batch_scheduled:
            self._after_batch_scheduled = True
            gevent.get_hub().loop.run_callback(self._after_batch)

    def flush_links(self) -> None:
        """Carry out now what the engine produced (before a hand-back)."""
        self._after_batch()

    def _after_batch(self) -> None:
        """Carry out what the engine's steps caused beside their own replies:
        answer parked requests, tell routers of jobs made and gone; re-arm
        the timer."""
        self._after_batch_scheduled = False
        if self.requests_run != self._turn_requests:
            self._count_turn()
        if self.stopping:
            return
        engine = self.engine
        while self._later:   # a delivery may execute held requests, which may answer more
            later, self._later = self._later, []
            contexts, lessees = self._contexts, self._lessees
            for token, reply in later:
                if contexts:
                    contexts.pop(token, None)
                if lessees:   # a parked lease answered: who holds the job
                    client = lessees.pop(token, None)
                    if client is not None and reply[0] == OK:
                        self._held(reply[1][0], client)
                cid = token[0]
                if cid < 0:
                    self.answer(partial(self.direct.deliver, token), reply)
                    continue
                channel = self.channels.get(cid)
                if channel is not None:
                    self.answer(partial(_send_reply, channel, token[1]), reply)
        if self.durability is not None:
            self.durability.commit()
            self.durability.maybe_compact(engine)
        deadline = engine.next_deadline()
        if deadline is not None and (self._armed is None or deadline < self._armed):
            self._rearm.set()

    def _count_turn(self) -> None:
        """Requests ran since the last :meth:`_after_batch`: count the loop
        turn they ran in, once however many times it runs in that turn (it
        follows each read of a router's or shard's link, and once more in the
        turn's callbacks). A turn is one iteration of the hub's libev loop:
        the requests of every socket one poll found readable; where the loop
        tells no iteration (libuv), each such run counts."""
        self._turn_requests = self.requests_run
        iteration: int = getattr(gevent.get_hub().loop, "iteration", -1)
        if iteration < 0 or iteration != self._turn_iteration:
            self._turn_iteration = iteration
            self.request_turns += 1

    def _timer_loop(self) -> None:
        engine = self.engine
        while True:
            deadline = engine.next_deadline()
            self._armed = deadline
            timeout = None if deadline is None else max(0.0, (deadline - now_us()) / 1e6)
            self._rearm.wait(timeout)
            self._rearm.clear()
            try:
                now = now_us()
                fx = engine.advance(now)
                self.take_effects(fx)
                if fx.history and self.history is not None:
                    self.history.record(fx.history, now, None, self._contexts.get)
            except Exception:
                log.exception("shard %d: timer failed", self.index)
            self._after_batch()


#: entries of ``Shard.holders`` below which stale ones are not swept
HOLDERS_SWEEP: Final = 4096
HOMED_PAGE: Final = 50000   # ids per page of a "homed" answer


def _send_reply(channel: FrameChannel, req_id: int, reply: Reply) -> None:
    channel.send([req_id, reply])


def _released(cluster: ShardInCluster, move: OutgoingMove, reply: Reply) -> None:
    """``move`` is over (its answer is durable): the requests it held go to the new owner."""
    cluster.released(move)
