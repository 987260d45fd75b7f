"""The asking end of a link to one shard: a router's to each shard, a
shard's to each other shard (:mod:`queueserver.shard.peers`).

``call`` tags a request, queues its frame and remembers the callback; the
reader greenlet calls it back when the answer comes, in whatever order the
shard answers. While the shard is down every call is answered at once with a
server error, and the link keeps trying to reconnect.

With the direct path, the link also holds the shard's handoff socket, over
which client connections move to the shard and back
(:mod:`queueserver.net.handoff`).

In a cluster, a shard of another host is reached over TCP: the link proves
it knows the cluster's secret (and checks that the shard does too) before
any frame, inside TLS when the cluster has certificates. A shard of a node
taken out of the cluster has no address: its link never connects.

A request that fails with its link is answered with one of two server
errors: :func:`unavailable` when it was never sent (the link was down:
certainly not done), :func:`outcome_unknown` when it was sent and the link
was lost before its answer came (the shard may have done it, and a
replicated shard may have passed it to the follower that takes its place).

A replicated shard's link holds every place its primary may be and tries
them in turn while none answers; when etcd names the primary (through the
node's supervisor), :meth:`ShardLink.follow` puts that place first and goes
there at once.
"""
from __future__ import annotations

import logging
import ssl
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Set, Tuple, Union

import gevent
from gevent import socket
from gevent.event import Event

from ..engine.status import SERVER_ERROR, Reply
from ..net.channel import FrameChannel
from ..net.handoff import Gone, HandoffChannel, Move, connect_seqpacket, handoff_path
from ..net import faults, linkauth

log: Final = logging.getLogger("queueserver.router")

Callback = Callable[[Reply], None]
RECONNECT_DELAY: Final = 0.05
LINK_TIMEOUT: Final = 5.0         # seconds to connect and authenticate to a shard of another host
REFUSED_DELAY: Final = 1.0        # after a refused or failed TCP link: another host, be gentle
Address = Union[str, Tuple[str, int], None]
#: one place, or the places tried in turn (a replicated cluster's shard)
Places = Union[Address, List[Address]]
LINK_PRIORITY: Final = 2          # libev's highest: before client sockets' watchers
#: the note a shard sends its links as it stops cleanly (its drop is then no news)
STOPPING: Final = "stopping"
#: seconds a link moving to another way to the same shard waits for its
#: requests in flight to be answered before it moves anyway
MOVE_GRACE: Final = 5.0

#: the client behind a request: its router's description of the connection
#: (:data:`queueserver.links.clients.Description`, whose first item is its id);
#: None when there is none to name
Context = Optional[List[Any]]
#: what a TCP link presents: the cluster's shared secret and its TLS client context, if any
Auth = Tuple[bytes, Optional[ssl.SSLContext]]
#: a request's slot, or its queues' slots (in a cluster), sent along with it
Slots = Union[int, Sequence[int], None]
#: ``(on_move(link, fd, move), on_gone(link, gone))``: the handoff socket's messages
Handoffs = Tuple[Callable[["ShardLink", int, Move], None], Callable[["ShardLink", Gone], None]]


def unavailable(index: int) -> Reply:
    """A request not sent: shard ``index``'s link is down (nothing was done)."""
    return [SERVER_ERROR, f"Shard {index} unavailable"]


def outcome_unknown(index: int) -> Reply:
    """A request sent whose answer never came: shard ``index``'s link was
    lost meanwhile, so whether it took effect is not known."""
    return [SERVER_ERROR, f"Outcome unknown: shard {index} went down before answering"]


def where(path: Address) -> str:
    """How a log line names a shard's address."""
    if path is None or isinstance(path, str):
        return str(path)
    return "%s:%d" % path


class ShardLink:
    def __init__(self, index: int, path: Places, on_event: Callable[["ShardLink", str, Any], None],
                 on_down: Callable[["ShardLink"], None],
                 on_up: Callable[["ShardLink"], None] = lambda link: None,
                 handoffs: Optional[Handoffs] = None,
                 context: Optional[List[Context]] = None, auth: Optional[Auth] = None) -> None:
        """``path``: a Unix socket path, a ``(host, port)`` over TCP, or None
        (never connects). ``handoffs``: ``(on_move(link, fd, move),
        on_gone(link, gone))`` to serve the shard's handoff socket (the direct
        path), or None. ``context``: a one-item list the router fills with
        the client behind the request being routed: the shard is sent its
        description once (``[0, "client", description]``), then its id
        along with each request (who holds a lease; the job history). ``auth``: ``(secret, TLS client context or
        None)`` for a TCP link."""
        self.index = index
        #: where the shard may be, tried in turn while it cannot be reached (a
        #: replicated cluster's shard: its home, then the nodes that may take it over)
        self.paths: List[Address] = list(path) if isinstance(path, list) else [path]
        self.path: Address = self.paths[0]
        self._auth = auth
        self.context: List[Context] = context if context is not None else [None]
        #: the connections (ids at the router) the shard was told of on this link's channel
        self.introduced: Set[int] = set()
        self.pending: Dict[int, Callback] = {}
        self.channel: Optional[FrameChannel] = None
        self.handoff: Optional[HandoffChannel] = None
        #: ids (at this router) of the connections this router handed to the shard
        self.moved: Set[int] = set()
        self._handoffs = handoffs
        self._next_id = 1
        self._on_event = on_event
        self._on_down = on_down
        self._on_up = on_up
        self._refusal_logged = False   # a failed TCP link is logged once until it works again
        #: why a link that drops now is no news: we stop, or the shard said it
        #: stops (until its next greeting); None: a drop is a lost shard
        self._clean_stop: Optional[str] = None
        #: its link was lost, and the tries since failed: it is down (not
        #: just starting), so nobody should wait for it to come up
        self.failed = False
        self._was_up = False
        #: etcd says the node serving it holds no lease (see :mod:`.primaries`)
        self.lapsed = False
        self._wake = Event()           # set: the pause between two tries ends now (a new place)
        #: where the link moves once no request is in flight (see :meth:`follow`)
        self._moving_to: Address = None
        self.move_grace = MOVE_GRACE
        self._move_later: Optional["gevent.Greenlet[..., None]"] = None
        self._greenlet = gevent.spawn(self._run) if self.path is not None else None
        if faults.CUT_OFF_FILE is not None and any(isinstance(p, tuple) for p in self.paths):
            gevent.spawn(faults.watch, self._cut)

    def _cut(self) -> None:
        """Fault injection: a link over TCP goes down while this node is cut off."""
        if self.channel is not None and isinstance(self.path, tuple):
            self.channel.shut()

    @property
    def local(self) -> bool:
        """A shard of this host (a router waits for these before serving)."""
        return isinstance(self.path, str)

    @property
    def up(self) -> bool:
        return self.channel is not None

    @property
    def known_down(self) -> bool:
        """Down, and known to be: its link was lost (and not back), or
        etcd says its node is gone (unlike a link still making its first try)."""
        return self.channel is None and (self.failed or self.lapsed)

    def call(self, op: str, args: Sequence[Any], callback: Callback, slot: Slots = None) -> int:
        """Send one request; returns its id (for ``cancel``), 0 if the shard is down.
        ``slot``: in a cluster, the slot (or slots) of the queues it names."""
        channel = self.channel
        if channel is None:
            callback(unavailable(self.index))
            return 0
        req_id = self._next_id
        self._next_id = req_id + 1
        self.pending[req_id] = callback
        context = self.context[0]
        client: Any = None
        if context is not None:
            client = context[0]
            if client not in self.introduced:
                self.introduced.add(client)
                channel.send([0, "client", context])
        if slot is not None:
            channel.send([req_id, op, args, client, slot])
        else:
            channel.send([req_id, op, args] if client is None else [req_id, op, args, client])
        return req_id

    def notify(self, kind: str, body: Any) -> None:
        """A control frame that needs no answer."""
        if self.channel is not None:
            self.channel.send([0, kind, body])

    def cancel(self, req_id: int) -> None:
        """Withdraw a parked request; its answer, if one is already on its way, still comes."""
        if req_id in self.pending and self.channel is not None:
            self.channel.send([0, "cancel", req_id])

    def follow(self, place: Address, same_shard: bool = False) -> bool:
        """Etcd says the shard's primary serves at ``place``: it is tried
        first from now on, and at once (a link up at another place is
        dropped, its waiting requests answered as when a link fails).
        ``same_shard``: the link is up at another way to that very process
        (its home's TCP port, where its Unix socket is named): nothing is
        dropped; it moves once no request is in flight (or after
        :data:`MOVE_GRACE`). Whether that was news (``place`` was not
        already tried first)."""
        news = self.paths[0] != place
        if news:
            if place in self.paths:
                self.paths.remove(place)
            self.paths.insert(0, place)
        if self.path == place:
            self._moving_to = None   # where it is: a move named before is off
        elif same_shard and self.channel is not None:
            if self._moving_to != place:
                self._moving_to = place
                if self.pending:
                    self._cancel_move_later()
                    self._move_later = gevent.spawn_later(self.move_grace, self._move, self.channel)
                else:
                    self._move(self.channel)
        else:
            self.path = place
            self._moving_to = None
            if self.channel is not None:
                self.channel.shut()   # the link's loop reconnects, to place
            self._wake.set()
        return news

    def _move(self, channel: FrameChannel) -> None:
        """Move to :attr:`_moving_to`, if ``channel`` is still the link's:
        connect there first, then put the new channel in place of ``channel``
        and shut it (what is still in flight on it, after
        :attr:`move_grace`, is answered "outcome unknown"). No request is
        refused meanwhile, and the link never counts as down; if ``place``
        does not answer, the link stays (its next connection tries there first)."""
        if self._move_later is not gevent.getcurrent():
            self._cancel_move_later()
        self._move_later = None
        place, self._moving_to = self._moving_to, None
        if place is None or self.channel is not channel:
            return   # moved already, or the link went down meanwhile (its loop reconnects there)
        was, self.path = self.path, place
        sock = self._connect()
        if sock is None or self.channel is not channel:   # (it went down while connecting)
            if sock is not None:
                sock.close()
            else:
                log.info("link to shard %d stays at %s: %s does not answer", self.index, where(was),
                         where(place))
            self.path = was   # where its channel is; the next connection tries place first
            return
        stale, self.pending = self.pending, {}
        if stale:
            log.warning("link to shard %d moves to %s with %d requests unanswered after %.0f s: "
                        "their outcome is unknown", self.index, where(place), len(stale), self.move_grace)
        self._channel_of(sock)
        log.info("link to shard %d moved to %s (the same shard)", self.index, where(place))
        channel.shut()   # its reader (the link's loop) goes on with the new channel
        for callback in stale.values():
            callback(outcome_unknown(self.index))

    def _cancel_move_later(self) -> None:
        if self._move_later is not None:
            self._move_later.kill(block=False)
            self._move_later = None

    def drop(self) -> None:
        """Close the link now (its shard is gone, as etcd says): requests in
        flight are answered as when a link fails, and it reconnects."""
        if self.channel is not None:
            self.channel.shut()

    def stop(self) -> None:
        self._clean_stop = "stopping"
        self._cancel_move_later()
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
        if self.channel is not None:
            self.channel.close()

    def _connect(self) -> Optional[socket.socket]:
        """A connected (and, over TCP, authenticated) socket, or None."""
        path = self.path
        if isinstance(path, str):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
            except OSError:
                sock.close()
                return None
            except BaseException:   # stopped (killed) while connecting
                sock.close()
                raise
            return sock
        # Over TCP (a link with no address never connects), with the cluster's credentials.
        assert path is not None and self._auth is not None
        if faults.cut_off():
            self._pause(REFUSED_DELAY)
            return None
        secret, tls = self._auth
        try:
            sock = socket.create_connection(path, timeout=LINK_TIMEOUT)
        except OSError:
            return None
        try:
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                sock = linkauth.wrap_client(sock, tls)
            linkauth.client_handshake(sock, secret, LINK_TIMEOUT)
        except (OSError, linkauth.LinkAuthError) as err:
            if not self._refusal_logged:
                log.warning("link to shard %d at %s failed: %s", self.index, where(path), err)
                self._refusal_logged = True
            sock.close()
            self._pause(REFUSED_DELAY)
            return None
        except BaseException:
            sock.close()
            raise
        self._refusal_logged = False
        return sock

    def _run(self) -> None:
        self._refusal_logged = False
        while True:
            if self._moving_to is not None:   # the link went down before it moved: go there now
                self.path, self._moving_to = self._moving_to, None
            tried = self.path
            sock = self._connect()
            if sock is None:
                # Known down once it was up and went; a link still making its
                # first tries is a shard starting: worth waiting for a while.
                self.failed = self._was_up
                # Its primary may have moved: the next place it may be (unless
                # etcd named one meanwhile: that one is next).
                if len(self.paths) > 1 and self.path == tried:
                    self.path = self.paths[(self.paths.index(tried) + 1) % len(self.paths)]
                self._pause(RECONNECT_DELAY)
                continue
            if self.path != tried:   # etcd named another place meanwhile: go there
                sock.close()
                continue
            channel = self._channel_of(sock)
            self.failed = False
            self._was_up = True
            reader = None
            try:   # from here on, whatever ends the link (a kill too) closes it
                log.info("connected to shard %d at %s", self.index, where(self.path))
                while True:
                    reader = self._open_handoffs()
                    self._on_up(self)
                    channel.receive(self._handle)
                    moved = self.channel
                    if moved is None or moved is channel:
                        break   # the link is lost (or stops)
                    # :meth:`_move` put another way to the same shard in place
                    self._end_channel(channel, reader)
                    channel = moved
            except Exception:  # an undecodable stream: drop the link and reconnect
                log.exception("shard %d sent what cannot be decoded", self.index)
            finally:
                if self.channel is not None and self.channel is not channel:
                    self.channel.close()   # one a move made as the link stopped
                self.channel = None
                self.failed = True
                self._end_channel(channel, reader)
                pending, self.pending = self.pending, {}
                if self._clean_stop is None:
                    log.warning("lost shard %d; %d requests in flight answered that their outcome is unknown",
                                self.index, len(pending))
                else:
                    log.info("link to shard %d closed (%s); %d requests in flight answered that their "
                             "outcome is unknown", self.index, self._clean_stop, len(pending))
                self._on_down(self)
                for callback in pending.values():
                    callback(outcome_unknown(self.index))

    def _end_channel(self, channel: FrameChannel,
                     reader: Optional["gevent.Greenlet[..., None]"]) -> None:
        """Close ``channel`` and the handoff socket opened with it (``reader`` serves that)."""
        channel.close()
        if self.handoff is not None:
            self.handoff.close()
            self.handoff = None
        if reader is not None:
            reader.kill(block=False)

    def _channel_of(self, sock: socket.socket) -> FrameChannel:
        """``sock``, connected, as the link's channel from now on."""
        # Frames from a shard are handled before client requests that
        # arrive in the same loop turn: a shard's note of a job it made
        # directly is seen before a request its client sent after.
        if hasattr(sock, "_read_event"):
            sock._read_event.priority = LINK_PRIORITY
        channel = FrameChannel(sock)
        self.channel = channel
        self.introduced = set()   # a new channel: the shard knows no client of ours yet
        return channel

    def _pause(self, seconds: float) -> None:
        """Between two tries: ``seconds``, or less if :meth:`follow` named a place."""
        self._wake.wait(seconds)
        self._wake.clear()

    def _open_handoffs(self) -> Optional["gevent.Greenlet[..., None]"]:
        if self._handoffs is None or not isinstance(self.path, str):
            return None
        sock = connect_seqpacket(handoff_path(self.path), socket)
        if sock is None:
            log.warning("shard %d has no handoff socket: its connections stay forwarded", self.index)
            return None
        self.handoff = HandoffChannel(sock)
        on_move, on_gone = self._handoffs
        return gevent.spawn(self.handoff.receive, lambda fd, move: on_move(self, fd, move),
                            lambda gone: on_gone(self, gone))

    def _handle(self, frame: Any) -> None:
        """``[request id, reply]``, or ``[0, kind, body]``: a shard's note (msgpack)."""
        if frame[0] == 0:
            kind = frame[1]
            if kind == STOPPING:
                if self._clean_stop is None:
                    self._clean_stop = "the shard is stopping"
                return
            if kind == "hello" and self._clean_stop != "stopping":
                self._clean_stop = None   # a shard (re)started: losing it is news again
            self._on_event(self, kind, frame[2])
            return
        callback = self.pending.pop(frame[0], None)
        if callback is not None:
            callback(frame[1])
        if self._moving_to is not None and not self.pending and self.channel is not None:
            self._move(self.channel)   # the last request in flight is answered: move now
