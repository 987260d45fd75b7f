"""A shard as one member of a cluster: its TCP link port and its slots.

Routers of other hosts reach the shard over TCP: a link is served only once
it passed the HMAC challenge-response with the cluster's secret (inside TLS
when the cluster file has a ``[tls]`` block); anything else is refused and
logged. Frames are msgpack, never pickle.

Every request a router routes by queue name carries the queue's slot. The
shard serves it if it serves the slot; if the slot is being moved away, the
request waits until the move is over (then it is answered ``MOVED`` to the
new owner) or, should the move stall, gets an error after
:data:`HOLD_LIMIT`; if the slot is another shard's, it is answered ``MOVED``
at once with what the shard knows of the owner. A request naming a job the
shard is giving away waits the same way.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Union

import gevent
from gevent import socket

from ..cluster.clusterfile import ClusterSpec, ShardSpec
from ..placement import SLOTS, initial_owners, slot_of, to_ranges
from ..engine import Engine
from ..engine.ownership import MOVING, SERVING, OutgoingMove
from ..engine.status import MOVED, SERVER_ERROR, Reply
from ..net import faults, linkauth

log = logging.getLogger("queueserver.shard")

HOLD_LIMIT = 10.0        # seconds a request waits for a stalled move before an error
HANDSHAKE_TIMEOUT = 5.0
MAX_HANDSHAKES = 64      # connections proving themselves at once; more are closed unanswered

Send = Callable[[Reply], None]
#: what :meth:`ShardInCluster.verdict` says of a request: None (serve it), a
#: reply (MOVED: answer that), or the move it must wait for
Verdict = Union[None, Reply, OutgoingMove]


class ShardInCluster:
    def __init__(self, spec: ClusterSpec, me: ShardSpec, secret: bytes) -> None:
        self.spec = spec
        self.me = me
        #: the node this process runs on (``me.node``, unless it serves a copy it took over)
        self.node = me.node
        self.secret = secret
        self.tls = (linkauth.server_context(spec.tls.cert, spec.tls.key, spec.tls.ca)
                    if spec.tls is not None else None)
        #: epoch -> how to answer each request waiting for that move to end
        self.held: Dict[int, List[Send]] = {}
        self._timers: Dict[int, gevent.Greenlet[[int], None]] = {}
        self.refused = 0
        self._listener: Optional[socket.socket] = None
        self._handshakes = 0
        self._crowd_logged = 0.0

    # ------------------------------------------------------------ start-up
    def initial_slots(self) -> List[List[int]]:
        """The slots a shard of a brand-new cluster starts with (none for a joiner)."""
        founders = self.spec.founders()
        if self.me.ordinal not in founders:
            return []
        position = founders.index(self.me.ordinal)
        owners = initial_owners(len(founders))
        return to_ranges(slot for slot in range(SLOTS) if owners[slot] == position)

    # ------------------------------------------------------------- serving
    def bind(self) -> None:
        """Take this shard's link port (before serving: a port in use stops
        the start with one line, as a client port does)."""
        listener = socket.socket(socket.AF_INET6 if ":" in self.me.host else socket.AF_INET,
                                 socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.me.host, self.me.port))
            listener.listen(128)
        except OSError as err:
            listener.close()
            raise LinkPortError(f"cannot take link port {self.me.host}:{self.me.port} of shard "
                                f"{self.me.name}: {(err.strerror or str(err)).lower()} (check "
                                f"link_port and host of node {self.me.node} in {self.spec.path})") from None
        self._listener = listener

    def listen(self, serve_channel: Callable[[socket.socket], None]) -> None:
        """Accept links on this shard's TCP port until killed."""
        listener = self._listener
        assert listener is not None   # bound before serving
        log.info("shard %s (ordinal %d) takes links on %s:%d%s", self.me.name, self.me.ordinal,
                 self.me.host, self.me.port, " with TLS" if self.tls is not None else "")
        while True:
            sock, peer = listener.accept()
            if self._handshakes >= MAX_HANDSHAKES:   # a flood of silent connections costs one close each
                sock.close()
                self.refused += 1
                now = time.monotonic()
                if now - self._crowd_logged > 10:
                    self._crowd_logged = now
                    log.warning("%d link connections are still proving themselves; refusing more "
                                "(the latest from %s:%d)", MAX_HANDSHAKES, *peer[:2])
                continue
            gevent.spawn(self._admit, sock, f"{peer[0]}:{peer[1]}", serve_channel)

    def _admit(self, sock: socket.socket, peer: str, serve_channel: Callable[[socket.socket], None]) -> None:
        if faults.cut_off():   # fault injection: nothing from other nodes gets through
            sock.close()
            return
        self._handshakes += 1
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = linkauth.wrap_server(sock, self.tls, HANDSHAKE_TIMEOUT)
            admitted = linkauth.serve_handshake(sock, self.secret, peer, HANDSHAKE_TIMEOUT)
        except Exception as err:   # a TLS failure, a reset: this connection only
            log.warning("link from %s refused: %s", peer, err)
            admitted = False
        finally:
            self._handshakes -= 1
        if not admitted:
            self.refused += 1
            try:
                sock.close()
            except OSError:
                pass
            return
        log.info("link from %s authenticated", peer)
        serve_channel(sock)

    # -------------------------------------------------------------- verdicts
    def verdict(self, engine: Engine, args: Any, slots: Any) -> Verdict:
        """None: serve it. A reply: answer that (MOVED). A move: wait for it.
        ``args`` and ``slots`` (a slot, or a list of them) as the frame had them."""
        table = engine.slots
        assert table is not None   # a cluster's shard serves once it holds its slots
        if slots is not None:
            state = table.state
            for slot in (slots if slots.__class__ is list else (slots,)):
                here = state[slot]
                if here == SERVING:
                    continue
                if here == MOVING:
                    return table.move_of(slot)
                target, epoch = table.hints.get(slot, (None, 0))
                return [MOVED, [slot, target, epoch]]
            return None
        if not args:
            return None
        key = args[0]
        if table.moves and (key.__class__ is str or key.__class__ is int):
            move = table.holding(key)
            if move is not None:
                return move
        if key.__class__ is str:
            job = engine.jobs.get(key)
            if job is not None:   # a job of a slot not (yet) served here: a move brings it
                slot = slot_of(job.name)
                if table.state[slot] != SERVING:
                    target, epoch = table.hints.get(slot, (None, 0))
                    return [MOVED, [slot, target, epoch]]
        return None

    def hold(self, move: OutgoingMove, send: Send) -> None:
        """``send`` the request's answer once ``move`` is over."""
        self.held.setdefault(move.epoch, []).append(send)
        if move.epoch not in self._timers:
            self._timers[move.epoch] = gevent.spawn_later(HOLD_LIMIT, self._stalled, move.epoch)

    def released(self, move: OutgoingMove) -> None:
        """``move`` is over: its waiting requests go to the new owner."""
        timer = self._timers.pop(move.epoch, None)
        if timer is not None:
            timer.kill(block=False)
        for send in self.held.pop(move.epoch, ()):
            send([MOVED, [None, move.target, move.epoch]])

    def _stalled(self, epoch: int) -> None:
        self._timers.pop(epoch, None)
        waiting = self.held.pop(epoch, ())
        if waiting:
            log.warning("a slot move (epoch %d) has not finished in %.0f s; %d requests answered with "
                        "an error (run `queueserver cluster rebalance` to finish it)",
                        epoch, HOLD_LIMIT, len(waiting))
        for send in waiting:
            send([SERVER_ERROR, "Queue is moving to another shard; try again"])

    def stop(self) -> None:
        for timer in self._timers.values():
            timer.kill(block=False)


class LinkPortError(ValueError):
    """The link port cannot be had; one line."""
