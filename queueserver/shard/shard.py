"""The shard: one engine, its Unix socket, its one timer greenlet (the process
around it is :mod:`.process`).

The router sends ``[request_id, op, args]`` frames; the shard answers
``[request_id, reply]`` as soon as the engine has an answer, which for a
parked lease may be much later. Frames with request id 0 are events: the
shard's ``hello`` (on connect; in a cluster, its slots), and a router's
control frames ``cancel`` (withdraw a parked request), ``closed`` (a client
connection is gone) and ``clients`` (how many clients it serves). What a
frame asks is looked up once, by its op: in :data:`EVENTS` for an event, in
:data:`HOST_SHELL` or :data:`CLUSTER_SHELL` for the requests the shell
serves beside the engine (those the ops table,
:data:`~queueserver.engine.ops.OPS`, flags as the id home's or the
cluster's); every other request is the engine's.

Beside the engine the shard composes: the *homes* of job ids
(:mod:`.homes`: each shard is the home of the ids that hash to it, and
claims the ids of the jobs it makes at theirs, over the links of
:mod:`.peers`), its job numbers (:mod:`.numbering`) and, in a cluster, the
operations on its slots (:mod:`.clusterops`). Nobody hears of jobs as they
are made: a router learns where a job is from the answers it carries, and
asks the id's home about any other.

When a router's link is lost, every connection of that router is treated
as closed: its parked requests are withdrawn and jobs leased to its
connections with close semantics (goqueue) are ready again.

Why one module, though over 600 lines: what is left here is the serving
itself (the channels and their frames, ``execute``, the answers at the end
of a batch, the timer), one path that every request takes.
"""
from __future__ import annotations

import gc
import itertools
import logging
import os
import time
from functools import partial
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Tuple, TypedDict

import gevent
from gevent import socket
from gevent.event import Event
from gevent.pool import Group

from ..engine import Engine
from ..engine.effects import Effects
from ..engine.job import LEASED as JOB_LEASED
from ..engine.ops import CLUSTER_OPS, ID_HOME_OPS, MAKES_JOBS
from ..engine.requests import IN_QUEUE
from ..engine.status import NOT_FOUND, OK, SERVER_ERROR, Reply
from .durability import Durability
from .replication import Replicator
from .hostids import HostIds
from .homes import REQUESTS as HOME_REQUESTS, Homes
from .numbering import Numbering
from .clusterops import REQUESTS as CLUSTER_REQUESTS, ClusterOps
from ..links.shardlink import STOPPING
from .direct import DirectHost, DirectServer, Token
from .history import Context, HistoryWriter
from ..links.clients import VIA_ROUTER, ClientRecord
from ..net.channel import FrameChannel
from ..net.handoff import HandoffChannel, handoff_path, listen_seqpacket
from .stats import ShardStats
from .clustering import ShardInCluster
from ..cluster.clusterfile import MAX_SHARDS
from ..net import faults
from ..placement import shard_for, slot_of
from ..store.writer import SLOW_SYNC_MS

log: Final = logging.getLogger("queueserver.shard")


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
                 host_ids: Optional[HostIds] = None, fsync_in_loop: float = SLOW_SYNC_MS) -> None:
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
        #: the ids homed here, the claims of the ids made here, the links to the other shards
        self.homes = Homes(index, shards, self.engine, cluster, host_ids, self._claimed)
        #: the shard's log, when it is durable (None: jobs live in memory only)
        self.durability: Optional[Durability] = None
        if data_dir is not None:
            durability = self.durability = Durability(data_dir, index, shards, fsync, fsync_interval,
                                                      compact_after_bytes, fsync_in_loop)
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
        #: how its jobs are numbered
        self.numbering = Numbering(index, shards, self.engine, numbers, data_dir is not None,
                                   cluster is not None)
        #: in a cluster: the operations on its slots (None: one host)
        self.cluster_ops = ClusterOps(self, cluster) if cluster is not None else None
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
            refused = self.numbering.take()
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
            reply = self.homes.claim(fx.placed[0], token, reply)
        if fx.history is not None and self.history is not None:   # (the engine's is on only then)
            context = client.context if client is not None else None
            if reply is None and context is not None and token is not None:
                self._contexts[token] = context   # parked: a lease may go to it later
            if fx.history:
                self.history.record(fx.history, now, context, self._lessee(token, context))
        return reply

    def _claimed(self, id: str, token: Token, reply: Optional[Reply], verdict: Reply) -> None:
        """The home's verdict on the id of job ``id``, made by the request
        under ``token`` (its answer ``reply`` held; None for a ``run``): if
        refused, the job goes and the answer is the refusal."""
        if verdict[0] != OK:
            self.execute("withdraw_new", (id,))
            if reply is not None:
                self._later.append((token, verdict))
        elif reply is not None:
            self._later.append((token, reply))
        self.schedule_after_batch()

    def new_id(self) -> str:
        """A fresh job id at home here (a server-made id: its home is its job's shard)."""
        return self.homes.new_id()

    def makes(self, number: int) -> bool:
        """Whether job ``number`` would be here (a goqueue DELETE served directly)."""
        return self.numbering.makes(number)

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
        if fx.forgotten:
            self.homes.left(fx.forgotten)

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
        self.numbering.recovered()
        now = now_us()
        fx = self.engine.recovered(now)
        self.take_effects(fx)
        if fx.history and self.history is not None:
            self.history.record(fx.history, now, None, self._contexts.get)
        durability.commit()
        log.info("shard %d recovered %d jobs in %d queues from %d log records in %.2f s",
                 self.index, len(self.engine.jobs), len(self.engine.queues), records,
                 time.monotonic() - started)

    def serves(self, name: str) -> bool:
        """Whether queue ``name`` is this shard's to serve now."""
        if self.cluster is not None:
            slots = self.engine.slots
            assert slots is not None   # a cluster's shard serves once it holds its slots
            return slots.serving(slot_of(name))
        return shard_for(name, self.shards) == self.index

    # ---------------------------------------------------------------- serving
    def serve(self) -> None:
        self.homes.take_host_ids()   # before listening: no claim may miss a job recovered here
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
        if self.homes.link(os.path.dirname(self.path)):
            self._tasks.spawn(self.homes.ticks)
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
        shell = CLUSTER_SHELL if cluster is not None else HOST_SHELL
        known: Dict[int, ClientRecord] = {}   # the clients this channel's router told of
        self.clients[cid] = known
        inbound = Inbound(cid, channel, known)

        def handle(frame: Any) -> None:   # [request id, op, args, client?, slots?] (msgpack)
            req_id, op, args = frame[0], frame[1], frame[2]
            if req_id == 0:  # an event: a router's control frame (or, forget, another shard's)
                on_event = EVENTS.get(op)
                if on_event is not None:
                    on_event(self, inbound, args)
                return
            on_request = shell.get(op)
            if on_request is not None:   # the id home's or the cluster's, not the engine's
                on_request(self, inbound, req_id, op, args, frame[4] if len(frame) > 4 else None)
                return
            queue: Optional[str] = None
            if args.__class__ is list and len(args) == 1 and args[0].__class__ is dict:   # requests.in_queue
                queue, args = args[0][IN_QUEUE], args[0]["args"]
            if cluster is not None and self._misplaced(channel, req_id, args,
                                                       frame[4] if len(frame) > 4 else None):
                return
            if queue is not None and self.engine.queue_of(args[0]) != queue:
                reply: Optional[Reply] = [NOT_FOUND, ""]   # that job is gone: not this one
            else:
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
            replicator = self._replicator()
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

    def _misplaced(self, channel: FrameChannel, req_id: int, args: Any, slots: Any) -> bool:
        """In a cluster: whether a request is not this shard's to serve now
        (see :meth:`.clustering.ShardInCluster.verdict`): its slot another's
        (answered ``MOVED``), or being moved away (held until the move ends)."""
        cluster = self.cluster
        assert cluster is not None   # asked in a cluster only
        verdict = cluster.verdict(self.engine, args, slots)
        if verdict is None:
            return False
        if isinstance(verdict, list):
            channel.send([req_id, verdict])
        else:
            cluster.hold(verdict, partial(_send_reply, channel, req_id))
        return True

    def _replicator(self) -> Optional[Replicator]:
        """The stream to the followers (a replicated cluster's primary), if any."""
        return self.durability.replicator if self.durability is not None else None

    # ---------------------------------------------------------------- events
    def _on_client(self, inbound: Inbound, args: Any) -> None:
        """Who a connection of that router is (its requests name it by id)."""
        inbound.clients[args[0]] = ClientRecord.from_description(args, VIA_ROUTER)

    def _on_left(self, inbound: Inbound, args: Any) -> None:
        """That connection closed (a lease may still name it)."""
        record = inbound.clients.pop(args, None)
        if record is not None:
            record.left = now_us()

    def _on_forget(self, inbound: Inbound, args: Any) -> None:
        """Jobs of another shard that left it, ids homed here."""
        self.homes.home.forget(args[1], args[0])

    def _on_cancel(self, inbound: Inbound, args: Any) -> None:
        """Withdraw this channel's parked request."""
        self.execute("cancel", ((inbound.cid, args),))

    def _on_closed(self, inbound: Inbound, args: Any) -> None:
        """A client connection of that router is gone."""
        self.execute("disown", ((inbound.cid, args),))

    def _on_clients(self, inbound: Inbound, args: Any) -> None:
        """How many clients that router serves."""
        self.router_clients[inbound.cid] = args

    def _on_router(self, inbound: Inbound, args: Any) -> None:
        """Which router this channel belongs to."""
        self.router_channels[args] = inbound.cid

    def _on_ack(self, inbound: Inbound, args: Any) -> None:
        """A follower holds the stream up to ``args``."""
        replicator = self._replicator()
        if replicator is not None:
            replicator.acked(inbound.channel, args)

    def _on_replicate(self, inbound: Inbound, args: Any) -> None:
        """A follower asks for the stream."""
        replicator = self._replicator()
        if replicator is not None:
            replicator.attach(inbound.channel, args[0])

    # ---------------------------------------------------- the shell's requests
    def _home_request(self, inbound: Inbound, req_id: int, op: str, args: Any, slots: Any) -> None:
        """A request about ids homed here, or about this shard's jobs of
        another home (:data:`.homes.REQUESTS`); in a cluster, one that names
        its ids' slots is this shard's only while it serves them."""
        channel = inbound.channel
        if slots is not None and self.cluster is not None and self._misplaced(channel, req_id, args, slots):
            return
        HOME_REQUESTS[op](self.homes, partial(_send_reply, channel, req_id), args)

    def _cluster_request(self, inbound: Inbound, req_id: int, op: str, args: Any, slots: Any) -> None:
        """An operation on a cluster's slots (:data:`.clusterops.REQUESTS`):
        about the slots themselves, never answered ``MOVED``."""
        cluster_ops = self.cluster_ops
        assert cluster_ops is not None   # in a cluster's table only
        CLUSTER_REQUESTS[op](cluster_ops, partial(_send_reply, inbound.channel, req_id), args)

    def _hello(self, channel: FrameChannel) -> None:
        """Greet a (re)connected router or shard (in a cluster, with the
        slots served here: routers keep their slot maps from these)."""
        hello: Dict[str, object] = {"shard": self.index}
        if self.engine.slots is not None:
            hello["slots"] = self.engine.slots.summary()
        channel.send([0, "hello", hello])

    def broadcast(self, frame: List[Any]) -> None:
        """``frame`` to every router and shard linked here."""
        for channel in self.channels.values():
            channel.send(frame)

    def say_stopping(self) -> None:
        """Tell every router and shard linked here that this one stops
        cleanly (they log its going as such, not as a lost shard); sent now,
        before the loop that would send it ends."""
        self.broadcast([0, STOPPING, None])
        gevent.sleep(0)   # one loop turn: the writers send what is queued

    def stop(self) -> None:
        """Take no more requests and run no more timers, before the history
        and the log close: nothing may be appended to them afterwards (a
        request that still arrives on a handed-over connection is refused)."""
        self.stopping = True
        self._tasks.kill()
        if self.durability is not None and self.durability.replicator is not None:
            self.durability.replicator.stop()
        self.homes.stop()
        if self.cluster is not None:
            self.cluster.stop()

    def schedule_after_batch(self) -> None:
        """Run :meth:`_after_batch` once at the end of this loop turn."""
        if not self._after_batch_scheduled:
            self._after_batch_scheduled = True
            gevent.get_hub().loop.run_callback(self._after_batch)

    def flush_links(self) -> None:
        """Carry out now what the engine produced (before a hand-back, after a slot operation)."""
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


class Inbound:
    """A channel that sends this shard frames (a router's link, or another
    shard's): its number here, and the clients its router told of."""

    def __init__(self, cid: int, channel: FrameChannel, clients: Dict[int, ClientRecord]) -> None:
        self.cid = cid
        self.channel = channel
        self.clients = clients


#: entries of ``Shard.holders`` below which stale ones are not swept
HOLDERS_SWEEP: Final = 4096


def _send_reply(channel: FrameChannel, req_id: int, reply: Reply) -> None:
    channel.send([req_id, reply])


#: What an event (a frame with request id 0) asks, by its op:
#: ``handler(shard, inbound, args)``; an event of any other op is ignored.
#: Module-level tables, as the engine's: what mypyc compiles keeps no dicts
#: of methods in a class body.
EVENTS: Final[Dict[str, Callable[[Shard, Inbound, Any], None]]] = {
    "client": Shard._on_client, "left": Shard._on_left, "forget": Shard._on_forget,
    "cancel": Shard._on_cancel, "closed": Shard._on_closed, "clients": Shard._on_clients,
    "router": Shard._on_router, "ack": Shard._on_ack, "replicate": Shard._on_replicate,
}

#: ``handler(shard, inbound, request id, op, args, slots)``
ShellRequest = Callable[[Shard, Inbound, int, str, Any, Any], None]
#: The requests a shard of one host serves beside its engine, by op: the id
#: home's (those the ops table flags ``ID_HOME``). Every other request is the engine's.
HOST_SHELL: Final[Dict[str, ShellRequest]] = {op: Shard._home_request for op in ID_HOME_OPS}
#: What a cluster's shard serves beside its engine: the id home's requests and
#: the operations on its slots (flagged ``CLUSTER``; on one host those go to
#: the engine as any other request).
CLUSTER_SHELL: Final[Dict[str, ShellRequest]] = {**HOST_SHELL,
                                                 **{op: Shard._cluster_request for op in CLUSTER_OPS}}
