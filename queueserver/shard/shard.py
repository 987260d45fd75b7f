"""The shard process: one engine, its Unix socket, its one timer greenlet.

The router sends ``[request_id, op, args]`` frames; the shard answers
``[request_id, reply]`` as soon as the engine has an answer, which for a
parked lease may be much later. Frames with request id 0 are shard events:
``hello`` (on connect: the jobs it holds, for the router's directory) and
``forgotten`` (jobs that left the shard). A router's control frames (id 0)
are ``cancel`` (withdraw a parked request), ``closed`` (a client connection
is gone) and ``clients`` (how many clients it serves).

When a router's link is lost, every connection of that router is treated
as closed: its parked requests are withdrawn and jobs leased to its
connections with close semantics (goqueue) are ready again.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import logging
import os
import sys
import time
from functools import partial
from typing import Callable, Dict, Optional

import gevent
from gevent import socket
from gevent.event import Event
from gevent.pool import Group

from ..engine import Engine
from ..engine.effects import Effects
from ..engine.status import OK, SERVER_ERROR, Reply
from ..lifecycle import EXIT_REFUSED
from ..store import StoreError
from .durability import Durability
from .history import Context, HistoryWriter
from ..net.channel import FrameChannel
from ..net.handoff import HandoffChannel, handoff_path, listen_seqpacket
from .direct import DirectServer
from .stats import ShardStats
from ..metrics.control import control_path, serve_control
from .clustering import ShardInCluster
from ..cluster.clusterfile import load_cluster
from ..net import linkauth
from ..cluster.slots import MAX_SHARDS, from_ranges, slot_of
from ..sharding import shard_for
from ..numbers import Blocks, NumberFile, NumbersError
from ..lifecycle import die_with_supervisor, setup_logging, stop_event

log = logging.getLogger("queueserver.shard")

HELLO_CHUNK = 10000


def now_us() -> int:
    return time.time_ns() // 1000


class Shard:
    def __init__(self, index: int, path: str, max_queues: Optional[int] = None,
                 queue_idle: float = 0.0, shards: int = 1, direct_path: bool = False,
                 data_dir: Optional[str] = None, fsync: str = "always",
                 fsync_interval: float = 1000.0, compact_after_bytes: int = 64 << 20,
                 history_dir: Optional[str] = None, cluster: Optional[ShardInCluster] = None,
                 history_retention: Optional[dict] = None, numbers: Optional[str] = None) -> None:
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
        self.router_clients: Dict[int, list] = {}   # channel -> [router index, clients]
        self.router_channels: Dict[int, int] = {}   # router index -> its channel
        #: what the engine's steps caused that is still to be carried out
        self._later: list = []          # (token, reply) answers to parked requests
        self._placed: list = []         # ids of jobs made here, for the routers' directories
        self._forgotten: list = []      # ids of jobs that left
        #: whether routers must hear of the jobs made here (several routers, or the direct path)
        self._tell_placed = self._routers_need_placed()
        #: the shard's log, when it is durable (None: jobs live in memory only)
        self.durability: Optional[Durability] = None
        if data_dir is not None:
            self.durability = Durability(data_dir, index, shards, fsync, fsync_interval,
                                         compact_after_bytes)
        #: the job history (None: not kept), and who is behind parked requests
        self.history: Optional[HistoryWriter] = None
        self._contexts: Dict[object, Context] = {}
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
        #: every greenlet that may run a request or a timer, stopped before the log closes
        self._tasks = Group()
        self.stopping = False

    @staticmethod
    def now() -> int:
        return now_us()

    def execute(self, op: str, args, token=None, context: Context = None) -> Optional[Reply]:
        """Run one request on the engine and take in its effects; its own
        reply, or None when it waits under ``token``. ``context``: the
        client's (protocol, connection), for the history."""
        if self.stopping:   # the log may be closing: change nothing
            return [SERVER_ERROR, "Shard is stopping"]
        if op in _NUMBERED and self.engine.needs_numbers():
            refused = self._take_numbers()
            if refused is not None:
                return refused
        if self.durability is not None:
            refused = self.durability.refusal(op)
            if refused is not None:
                return refused
        now = now_us()
        fx = self.engine.execute(op, args, now, token)
        self._take(fx)
        if fx.history is not None:
            if fx.reply is None and context is not None:
                self._contexts[token] = context   # parked: a lease may go to it later
            if fx.history:
                self.history.record(fx.history, now, context, self._lessee(token, context))
        return fx.reply

    def _take_numbers(self) -> Optional[Reply]:
        """A fresh block of job numbers, before a request that makes a job;
        the request's error when none can be had."""
        try:
            self.engine.give_numbers(*self.blocks.take(self.engine.last_number))
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

    def _lessee(self, token, context: Context):
        contexts = self._contexts
        return lambda lessee: context if lessee == token else contexts.get(lessee)

    def _take(self, fx: Effects) -> None:
        """Keep what a step caused, to be carried out at the end of the batch
        (a durable shard's log gets its events at once)."""
        if self.durability is not None:
            self.durability.record(fx)
        if fx.later:
            self._later += fx.later
        if fx.placed and self._tell_placed:
            self._placed += fx.placed
        if fx.forgotten:
            self._forgotten += fx.forgotten

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
        gc.disable()
        try:
            records, _ = self.durability.recover(self.engine)
        finally:
            gc.enable()
        gc.freeze()
        if self.blocks is not None and self.blocks.numbers.upgrading():
            # an older data directory: say the highest number made here before blocks
            self.blocks.numbers.raise_floor(self.engine.last_number, self.index)
        now = now_us()
        fx = self.engine.recovered(now)
        self._take(fx)
        if fx.history:
            self.history.record(fx.history, now, None, self._contexts.get)
        self.durability.commit()
        log.info("shard %d recovered %d jobs in %d queues from %d log records in %.2f s",
                 self.index, len(self.engine.jobs), len(self.engine.queues), records,
                 time.monotonic() - started)

    def join_cluster(self) -> None:
        """A shard that never served in its cluster takes its starting slots
        (logged, so a restart never changes what it owns)."""
        if self.engine.slots is None:
            self._take(self.engine.execute("claim", [self.cluster.initial_slots()], now_us()))
            if self.durability is not None:
                self.durability.commit()
        log.info("shard %s serves %d of the cluster's slots", self.cluster.me.name,
                 self.engine.slots.owned())

    def serves(self, name: str) -> bool:
        """Whether queue ``name`` is this shard's to serve now."""
        if self.cluster is not None:
            return self.engine.slots.serving(slot_of(name))
        return shard_for(name, self.shards) == self.index

    # ---------------------------------------------------------------- serving
    def serve(self) -> None:
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
        if self.cluster is not None:
            self._tasks.spawn(self.cluster.listen, self._serve_channel)
        while True:
            sock, _ = listener.accept()
            self._tasks.spawn(self._serve_channel, sock)

    def _serve_handoffs(self, listener) -> None:
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

    def _serve_channel(self, sock) -> None:
        cid = next(self._ids)
        channel = FrameChannel(sock)
        self.channels[cid] = channel
        # With several routers, or connections served here directly, every
        # router must hear of the jobs made without it.
        self._tell_placed = self._routers_need_placed()
        self._hello(channel)
        execute = self.execute
        durability = self.durability
        cluster = self.cluster
        engine = self.engine

        def handle(frame: list) -> None:
            req_id, op, args = frame[0], frame[1], frame[2]
            if req_id == 0:  # a control frame from the router
                if op == "cancel":  # withdraw this channel's parked request
                    execute("cancel", ((cid, args),))
                elif op == "closed":  # a client connection of that router is gone
                    execute("disown", ((cid, args),))
                elif op == "clients":  # how many clients that router serves
                    self.router_clients[cid] = args
                elif op == "router":  # which router this channel belongs to
                    self.router_channels[args] = cid
                return
            if cluster is not None:
                if op in _CLUSTER_OPS:
                    self._cluster_op(channel, req_id, op, args)
                    return
                verdict = cluster.verdict(engine, args, frame[4] if len(frame) > 4 else None)
                if verdict is not None:
                    if verdict.__class__ is list:
                        channel.send([req_id, verdict])
                    else:
                        cluster.hold(verdict, partial(_send_reply, channel, req_id))
                    return
            try:
                reply = execute(op, args, (cid, req_id), frame[3] if len(frame) > 3 else None)
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
            del self.channels[cid]
            self.router_clients.pop(cid, None)
            for router in [r for r, c in self.router_channels.items() if c == cid]:
                del self.router_channels[router]
            self._tell_placed = self._routers_need_placed()
            # The router is gone: so is every connection it served.
            engine = self.engine
            for token in [t for t in engine.waiters if t[0] == cid]:
                execute("cancel", (token,))
            for owner in [o for o in engine.owned if o[0] == cid]:
                execute("disown", (owner,))
            self._after_batch()
            channel.close()

    def _routers_need_placed(self) -> bool:
        """Whether routers must hear of every job made here: when some job is
        made without them (several routers, the direct path, a cluster's
        routers on other hosts)."""
        return len(self.channels) > 1 or self.direct_path or self.cluster is not None

    def _hello(self, channel: FrameChannel) -> None:
        """Tell a (re)connected router which jobs live here (and, in a
        cluster, which slots: routers keep their slot maps from these)."""
        jobs = list(self.engine.jobs)
        for start in range(0, max(len(jobs), 1), HELLO_CHUNK):
            hello = {"shard": self.index, "jobs": jobs[start:start + HELLO_CHUNK]}
            if start == 0 and self.engine.slots is not None:
                hello["slots"] = self.engine.slots.summary()
            channel.send([0, "hello", hello])

    def _cluster_op(self, channel: FrameChannel, req_id: int, op: str, args) -> None:
        """A request of ``queueserver cluster`` (or a router asking for the map)."""
        slots = self.engine.slots
        if op == "slots":
            channel.send([req_id, [OK, {"shard": self.index, **slots.summary(),
                                        "jobs": len(self.engine.jobs)}]])
            return
        move = slots.moves.get(args[0]) if op == "move_done" else None
        named = from_ranges(args[0]) if op in ("move_in", "move_out") else ()
        fresh = op == "move_in" and any(slots.epochs[slot] < args[1] for slot in named)
        reply = self.execute(op, args)
        if reply[0] == OK:
            if fresh and (len(args) < 4 or args[3]):   # the last part: the slots are ours now
                log.info("shard %s took %d slots (epoch %d), %d jobs in the last part",
                         self.cluster.me.name, len(named), args[1], reply[1])
                self._broadcast([0, "owns", [self.index, args[0], args[1]]])
                self.stats.slots_moved("in", len(named))
            elif op == "move_out" and (len(args) < 4 or args[3] == 0):
                log.info("shard %s is giving %d slots to shard %d (epoch %d): %d jobs set aside",
                         self.cluster.me.name, len(named), args[1], args[2],
                         len(slots.moves[args[2]].jobs))
            elif move is not None:
                given = len(from_ranges(move.ranges))
                log.info("shard %s gave %d slots to shard %d (epoch %d)", self.cluster.me.name,
                         given, move.target, move.epoch)
                self._broadcast([0, "gave", [move.ranges, move.target, move.epoch]])
                self.stats.slots_moved("out", given)
                # Its waiting requests go to the new owner once the log says so.
                self.answer(lambda _: self.cluster.released(move), reply)
        self.answer(partial(_send_reply, channel, req_id), reply)
        self._after_batch()

    def _broadcast(self, frame: list) -> None:
        for channel in self.channels.values():
            channel.send(frame)

    def stop(self) -> None:
        """Take no more requests and run no more timers, before the history
        and the log close: nothing may be appended to them afterwards (a
        request that still arrives on a handed-over connection is refused)."""
        self.stopping = True
        self._tasks.kill()
        if self.cluster is not None:
            self.cluster.stop()

    def schedule_after_batch(self) -> None:
        """Run :meth:`_after_batch` once at the end of this loop turn."""
        if not self._after_batch_scheduled:
            self._after_batch_scheduled = True
            gevent.get_hub().loop.run_callback(self._after_batch)

    def flush_links(self) -> None:
        """Send what the engine produced for the routers now (before a hand-back)."""
        self._after_batch()

    def send_placed(self) -> None:
        """Tell every router of the jobs made here without it (its directory)."""
        if self._placed:
            placed, self._placed = self._placed, []
            self._broadcast([0, "placed", placed])

    def frames_sent(self, router: int) -> int:
        channel = self.channels.get(self.router_channels.get(router, -1))
        return channel.sent if channel is not None else 0

    def _after_batch(self) -> None:
        """Carry out what the engine's steps caused beside their own replies:
        answer parked requests, tell routers of jobs made and gone; re-arm
        the timer."""
        self._after_batch_scheduled = False
        if self.stopping:
            return
        engine = self.engine
        while self._later:   # a delivery may execute held requests, which may answer more
            later, self._later = self._later, []
            contexts = self._contexts
            for token, reply in later:
                if contexts:
                    contexts.pop(token, None)
                cid = token[0]
                if cid < 0:
                    self.answer(partial(self.direct.deliver, token), reply)
                    continue
                channel = self.channels.get(cid)
                if channel is not None:
                    self.answer(partial(_send_reply, channel, token[1]), reply)
        if self._placed:
            self.send_placed()
        if self._forgotten:
            forgotten, self._forgotten = self._forgotten, []
            self._broadcast([0, "forgotten", forgotten])
        if self.durability is not None:
            self.durability.commit()
            self.durability.maybe_compact(engine)
        deadline = engine.next_deadline()
        if deadline is not None and (self._armed is None or deadline < self._armed):
            self._rearm.set()

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
                self._take(fx)
                if fx.history:
                    self.history.record(fx.history, now, None, self._contexts.get)
            except Exception:
                log.exception("shard %d: timer failed", self.index)
            self._after_batch()


#: requests that make a job, and so a job number
_NUMBERED = frozenset(("add", "run"))

#: requests of the ``cluster`` command and of routers about slots
_CLUSTER_OPS = frozenset(("slots", "move_out", "move_in", "move_done"))


def _send_reply(channel: FrameChannel, req_id: int, reply: Reply) -> None:
    channel.send([req_id, reply])


def main(argv=None) -> None:
    die_with_supervisor()   # first: a supervisor gone before we run must not leave us behind
    parser = argparse.ArgumentParser(prog="queueserver-shard")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--max-queues", type=int, default=None,
                        help="queues this shard may hold (default: no cap)")
    parser.add_argument("--queue-idle-timeout", type=float, default=0.0, metavar="SECONDS",
                        help="remove a queue with no jobs and no waiters after this long (0: never)")
    parser.add_argument("--shards", type=int, default=1, help="how many shards the server runs")
    parser.add_argument("--direct-path", action="store_true",
                        help="take client connections that routers hand over")
    parser.add_argument("--data-dir", metavar="DIR", help="this shard's log directory (default: none, "
                                                          "jobs live in memory only)")
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="always")
    parser.add_argument("--fsync-interval", type=float, default=1000.0, metavar="MS")
    parser.add_argument("--compact-after-bytes", type=int, default=64 << 20, metavar="BYTES")
    parser.add_argument("--no-metrics", action="store_true",
                        help="count nothing for /metrics (spares the per-event hooks)")
    parser.add_argument("--cluster", metavar="FILE", help="the cluster file (with --node)")
    parser.add_argument("--node", metavar="NAME", help="this shard's node in the cluster file")
    parser.add_argument("--numbers", metavar="FILE",
                        help="the server's file of job number blocks (default: numbers of this "
                             "shard's residue class)")
    parser.add_argument("--history-dir", metavar="DIR",
                        help="write the job history (JSON Lines) here (default: none)")
    parser.add_argument("--history-max-bytes", type=int, metavar="BYTES",
                        help="keep this shard's history files within BYTES (default: any size)")
    parser.add_argument("--history-max-age", type=float, metavar="SECONDS",
                        help="drop history files last written more than SECONDS ago (default: never)")
    parser.add_argument("--history-checkpoint", metavar="PATH",
                        help="the checkpoint of `queueserver history`: dropping a file it has not "
                             "read is a warning")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, f"shard-{args.index}")
    cluster = None
    try:
        if args.cluster:
            spec = load_cluster(args.cluster)
            me = spec.shards_of(args.node)[args.index]
            cluster = ShardInCluster(spec, me, linkauth.load_secret(spec.secret_file))
        shard = Shard(args.index, args.socket, args.max_queues, args.queue_idle_timeout, args.shards,
                      args.direct_path, args.data_dir, args.fsync, args.fsync_interval,
                      args.compact_after_bytes, args.history_dir, cluster,
                      {"max_bytes": args.history_max_bytes, "max_age": args.history_max_age,
                       "checkpoint": args.history_checkpoint}, args.numbers)
        if shard.durability is not None:
            shard.recover()
        if cluster is not None:
            shard.join_cluster()
            cluster.bind()
    except (StoreError, ValueError, OSError) as err:   # a damaged or unusable log, a bad cluster file, secret or cert
        log.error("shard %d cannot start: %s", args.index, err)
        with open(args.socket + ".refused", "w") as f:
            f.write(str(err))   # for the supervisor's one line
        sys.exit(EXIT_REFUSED)
    if not args.no_metrics:
        shard.stats.attach(shard.engine)   # from here on; replaying the log counted nothing
    serve_control(control_path(args.socket), lambda: shard.stats.snapshot(shard))
    stop = stop_event()
    server = gevent.spawn(shard.serve)
    server.link(lambda g: stop.set())
    stop.wait()
    server.kill()
    shard.stop()
    if shard.history is not None:
        shard.history.close()
        log.info("shard %d history: %d records written, %d write errors", args.index,
                 shard.history.records, shard.history.write_errors)
    if shard.durability is not None:
        shard.durability.close()
        stats = shard.durability.stats()
        log.info("shard %d log: %d records appended, %d fsyncs, %d records fsynced (at most %d "
                 "in one), %d write errors, %d compactions, worst compaction pause %.1f ms",
                 args.index, stats["appended_records"], stats["fsyncs"], stats["fsynced_records"],
                 stats["max_records_per_fsync"], stats["write_errors"], stats["compactions"],
                 stats["worst-compaction-pause-ms"])
    for path in (args.socket, handoff_path(args.socket), args.socket + ".ready", control_path(args.socket)):
        if os.path.exists(path):
            os.unlink(path)
    log.info("shard %d exiting", args.index)
