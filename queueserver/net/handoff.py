"""Moving a client connection between a router and a shard.

The socket itself travels as ``SCM_RIGHTS`` ancillary data; with it goes
one msgpack message saying what the receiver needs to go on exactly where
the sender stopped (:class:`Move`): the protocol, the codec's state and the
bytes received but not yet served. Messages travel over a Unix
``SOCK_SEQPACKET`` socket (one per router and shard), which keeps message
boundaries, so each descriptor arrives with its own message; unread bytes
beyond one message's worth follow in ``more`` messages right after it (a
lock keeps one move's messages together). The same socket carries
:class:`Gone` notes: a moved connection has closed.
"""
from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Tuple

import msgpack
import gevent
from gevent.queue import Queue

from .refusals import RefusalLog

log = logging.getLogger(__name__)
_drops = RefusalLog(log)   # connections lost in transit: a few lines per interval, however many

CHUNK = 65536                    # unread bytes per message
_MAX_MESSAGE = CHUNK + 16384
_TRUNCATED = socket.MSG_TRUNC | socket.MSG_CTRUNC


class Move(NamedTuple):
    """A connection handed over, and what its new owner needs."""

    protocol: str
    options: Dict[str, Any]     # the codec's options (max_payload, ...)
    state: Dict[str, Any]       # the codec's state before the first unread command
    unread: bytes               # bytes received from that command on
    origin: int                 # the connection's id at the router that accepted it
    router: int                 # that router's index
    moves: int                  # times the connection has moved so far
    limits: Dict[str, int]      # max_outstanding_bytes, max_payload
    more: int = 0               # unread bytes that follow in ``more`` messages
    #: the router's description of the connection (who it is: address, protocol,
    #: since when; :data:`queueserver.links.clients.Description`), None if unknown
    client: Optional[List[Any]] = None
    #: the identity the access rules gave it at connect ("": none): checked the same way wherever it is served
    identity: str = ""
    #: a connection accepted on a TLS port and not read yet: its receiver does
    #: the handshake and keeps the TLS state (:mod:`queueserver.net.tlsrelay`)
    tls: bool = False
    #: a relayed connection's shared counters (:mod:`queueserver.net.relayacks`):
    #: the descriptor as its holder knows it, sent along with the socket (-1: none)
    acks: int = -1
    #: a TLS 1.3 connection moving with its TLS: its record protection
    #: (:meth:`queueserver.net.tlsrecords.Exported.pack`), None for a plain one
    tls_state: Optional[List[Any]] = None


class Gone(NamedTuple):
    """A moved connection closed: its router counts it no more."""

    origin: int


class HandoffChannel:
    """One end of a handoff socket: ``send_move``/``send_gone``, and
    ``receive`` to read the other end's messages until it closes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        # Sends may wait for room, and callers run in the event loop, which
        # must not wait: a greenlet sends what they queue, in order.
        self._outgoing: "Queue[Tuple[List[bytes], List[int]]]" = Queue()
        self._sender: Optional[gevent.Greenlet[[], None]] = None

    def send_move(self, fd: int, move: Move) -> None:
        """Queue ``move`` with (a duplicate of) descriptor ``fd``, and of
        ``move.acks`` if any: the caller may close its own copies at once."""
        unread = move.unread
        head = move._replace(unread=unread[:CHUNK], more=max(0, len(unread) - CHUNK))
        messages = [self._pack(["move", list(head)])]
        messages += [self._pack(["more", unread[start:start + CHUNK]])
                     for start in range(CHUNK, len(unread), CHUNK)]
        fds = [os.dup(fd)]
        if move.acks >= 0:
            try:
                fds.append(os.dup(move.acks))
            except OSError:
                os.close(fds[0])
                raise
        self._queue(messages, fds)

    def send_gone(self, origin: int) -> None:
        self._queue([self._pack(["gone", origin])], [])

    def _queue(self, messages: List[bytes], fds: List[int]) -> None:
        self._outgoing.put((messages, fds))
        if self._sender is None:
            self._sender = gevent.spawn(self._send_all)

    def _send_all(self) -> None:
        while True:
            messages, fds = self._outgoing.get()
            try:
                if fds:
                    socket.send_fds(self.sock, messages[:1], fds)
                    messages = messages[1:]
                for message in messages:
                    self.sock.sendall(message)
            except OSError as err:
                log.warning("a handoff message was not delivered: %s", err)
            finally:
                for fd in fds:
                    os.close(fd)

    def receive(self, on_move: Callable[[int, Move], None], on_gone: Callable[[Gone], None]) -> None:
        """Read messages until the peer closes; a malformed one is logged and dropped."""
        moving: Optional[Tuple[int, Move, List[bytes], int]] = None   # a move awaiting its bytes
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self.sock, _MAX_MESSAGE, 4)
            except OSError:
                return
            if not data and not fds:
                return
            try:
                kind, body = msgpack.unpackb(data, raw=False)
                if kind == "more" and moving is not None:
                    fd, move, parts, missing = moving
                    parts.append(body)
                    missing -= len(body)
                    moving = None if missing <= 0 else (fd, move, parts, missing)
                    if moving is None:
                        on_move(fd, move._replace(unread=b"".join(parts), more=0))
                elif kind == "move":
                    move = Move(*body)
                    if len(fds) != (2 if move.acks >= 0 else 1) or flags & _TRUNCATED:
                        # its connection is lost (out of descriptors?): whichever end counts it lets go
                        _drops.note("move", f"dropped a connection handed over with {len(fds)} descriptors"
                                            f"{' (out of descriptors?)' if flags & socket.MSG_CTRUNC else ''}")
                        on_gone(Gone(move.origin))
                        self.send_gone(move.origin)
                    else:
                        fd = fds.pop(0)
                        if fds:   # the relay's counters, as this process holds them
                            move = move._replace(acks=fds.pop(0))
                        if move.more:
                            moving = (fd, move, [move.unread], move.more)
                        else:
                            on_move(fd, move)
                elif kind == "gone":
                    on_gone(Gone(body))
                else:
                    log.warning("dropped a handoff message %r with %d descriptors", kind, len(fds))
            except Exception:
                log.exception("handling a handoff message failed")
            for fd in fds:   # anything not taken over
                os.close(fd)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.kill(block=False)
        while not self._outgoing.empty():
            _, fds = self._outgoing.get()
            for fd in fds:
                os.close(fd)
        try:
            self.sock.close()
        except OSError:
            pass


def handoff_path(shard_socket: str) -> str:
    """Where shard's handoff socket lives, beside its link socket."""
    return shard_socket + ".handoff"


_Socket = socket.socket


class SocketModule(Protocol):
    """Where sockets are made: gevent's ``socket`` module (or the stdlib's)."""

    @property
    def socket(self) -> Callable[[int, int], _Socket]: ...


def listen_seqpacket(path: str, gevent_socket: SocketModule) -> socket.socket:
    """A listening ``SOCK_SEQPACKET`` socket at ``path``, private to this user."""
    if os.path.exists(path):
        os.unlink(path)
    listener = gevent_socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


def connect_seqpacket(path: str, gevent_socket: SocketModule) -> Optional[socket.socket]:
    sock = gevent_socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock
