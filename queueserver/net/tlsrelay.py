"""A TLS connection served in another process: the process that holds its
TLS state relays its plaintext.

A TLS 1.3 session moves with its connection (:mod:`.tlscontinued`); one
that cannot (TLS 1.2, whose record layer only OpenSSL has here, or keys the
client changed before the move) stays in the process that did its
handshake. So when a shard that terminated such a client's TLS is asked
for what it cannot serve alone (another shard's queue), it hands on a
plaintext stream instead: one end of a Unix socket pair goes to
the router as the connection, from that request on (where the direct path
may hand it to the right shard, as any plain connection), and a
:class:`TLSRelay` moves bytes between the client's TLS and the pair's
other end: it decrypts what the client sends and encrypts what comes back.

The relay holds no request: the process at the pair's far end serves the
connection, with every rule of a plain one (the end of its input, in-order
answers, what one client may cost, and when a job handed over counts as
delivered). For that last rule it needs the client's TCP acknowledgements,
which only the relay sees: the relay encrypts the answers in records of at
most :data:`RECORD` bytes, and notes in the connection's shared counters
(:mod:`.relayacks`) up to which plaintext byte the client's kernel
acknowledged whole records, and whether the client reset.
"""
from __future__ import annotations

import logging
import socket
from collections import deque
from typing import TYPE_CHECKING, Callable, Deque, Final, Optional, Tuple

import gevent

from .channel import RECV_SIZE, BatchWriter, os_socket
from .relayacks import RelayAcks
from .tcpinfo import bytes_acked, unacknowledged
from .tls import TLSError, TLSSession

if TYPE_CHECKING:
    from gevent._types import _IoWatcher, _TimerWatcher

log: Final = logging.getLogger("queueserver.connection")

#: bytes one direction may hold for a side that does not read, before the
#: relay stops reading the other (what one client may cost stays bounded)
MAX_BACKLOG: Final = 1 << 20
#: how long a relay whose served side closed goes on reading off the
#: client's bytes (so closing sends no reset that could destroy the last answer)
LINGER_SECONDS: Final = 2.0
#: plaintext bytes per TLS record: what the client can decrypt, and so what
#: an acknowledgement can count, comes in whole records
RECORD: Final = 1024
#: seconds between looks at the client's acknowledgements while answers wait for them
ACK_POLL: Final = 0.005

_READ: Final = 1


class TLSRelay:
    """Relays ``client`` (its TLS in ``session``) to and from ``inner`` (the
    plaintext side), both gevent sockets; ``on_end`` is called once, when
    both are closed. Like a connection, it needs no greenlet: io watchers
    call it in the event loop, and its writes leave in the loop turn's batch."""

    def __init__(self, client: socket.socket, session: TLSSession, inner: socket.socket, acks: RelayAcks,
                 label: str, on_end: Callable[["TLSRelay"], None]) -> None:
        self.client = client
        self.session = session
        self.inner = inner
        self.acks = acks
        self.label = label
        self._on_end = on_end
        self._client_raw = os_socket(client)
        self._inner_raw = os_socket(inner)
        #: the client socket's byte offset after what was written so far (the
        #: handshake, answers of the process before), and the pair's plaintext offset
        self._wire = bytes_acked(self._client_raw) + unacknowledged(self._client_raw.fileno())
        self._plain = 0
        #: records not yet acknowledged: (wire offset of their end, plaintext offset of their end)
        self._unacknowledged: Deque[Tuple[int, int]] = deque()
        loop = gevent.get_hub().loop
        self._ack_timer: "_TimerWatcher" = loop.timer(ACK_POLL, ACK_POLL)
        self._polling = False   # the timer runs
        self._from_client: "_IoWatcher" = loop.io(self._client_raw.fileno(), _READ)
        self._from_inner: "_IoWatcher" = loop.io(self._inner_raw.fileno(), _READ)
        self._to_client = BatchWriter(client, on_error=self._client_failed, on_drained=self._client_drained)
        self._to_inner = BatchWriter(inner, on_error=self._inner_failed, on_drained=self._inner_drained)
        self._linger: Optional["_TimerWatcher"] = None
        self._closing = False   # the served side closed: the client is being read off
        self._client_paused = self._inner_paused = False   # a side's writer is full
        self._ended = False

    def start(self) -> None:
        self._from_client.start(self._client_readable)
        self._from_inner.start(self._inner_readable)

    # ------------------------------------------------------------ client → served side
    def _client_readable(self) -> None:
        """Decrypt what the client sends; its end of input (FIN or
        close_notify) becomes the pair's, so the served side answers what
        came before and then closes."""
        try:
            data = self._client_raw.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError as err:
            self._end(f"the client's connection failed ({err})", client_lost=True)
            return
        if self._closing:
            if not data:
                self._end(None)   # read off to its end
            return
        if self._unacknowledged:
            self._check_acks()   # (its request likely carries the acknowledgement of the last answer)
        if not data:
            self._from_client.stop()
            self._to_inner.close()
            return
        session = self.session
        try:
            plain = session.receive(data)
        except TLSError as err:
            self._end(f"TLS error: {err}", client_lost=True)
            return
        if plain:
            self._to_inner.write(plain)
            if self._to_inner.queued > MAX_BACKLOG:
                self._client_paused = True
                self._from_client.stop()   # until the served side has read it
        if session.peer_closed:
            self._from_client.stop()
            self._to_inner.close()

    def _inner_drained(self) -> None:
        if self._client_paused and not self._closing and not self._to_inner.closed and not self._ended:
            self._client_paused = False
            self._from_client.start(self._client_readable)

    def _inner_failed(self) -> None:
        self._end("the served side is gone")

    # ------------------------------------------------------------ served side → client
    def _inner_readable(self) -> None:
        """Encrypt what the served side answers; when it closes, the client
        gets our close_notify and our FIN, and what it still sends is read
        off for :data:`LINGER_SECONDS`."""
        try:
            data = self._inner_raw.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._served_side_closed()
            return
        session, write, unacknowledged = self.session, self._to_client.write, self._unacknowledged
        for start in range(0, len(data), RECORD):
            piece = data if len(data) <= RECORD else data[start:start + RECORD]
            try:
                records = session.encrypt(piece)
            except TLSError as err:
                self._end(f"TLS error: {err}", client_lost=True)
                return
            write(records)
            self._wire += len(records)
            self._plain += len(piece)
            unacknowledged.append((self._wire, self._plain))
        if not self._polling:
            self._polling = True
            self._ack_timer.start(self._check_acks)
        if self._to_client.queued > MAX_BACKLOG:
            self._inner_paused = True
            self._from_inner.stop()   # until the client has read it

    def _client_drained(self) -> None:
        if self._inner_paused and not self._closing and not self._ended:
            self._inner_paused = False
            self._from_inner.start(self._inner_readable)

    def _client_failed(self) -> None:
        self._end("the client's connection failed", client_lost=True)

    def _check_acks(self) -> None:
        """Note up to which plaintext byte the client's kernel acknowledged
        whole records; look again while some are not."""
        unacknowledged = self._unacknowledged
        if unacknowledged:
            acked = bytes_acked(self._client_raw)
            plain = -1
            while unacknowledged and unacknowledged[0][0] <= acked:
                plain = unacknowledged.popleft()[1]
            if plain >= 0:
                self.acks.note_acknowledged(plain)
        if not unacknowledged and self._polling:
            self._polling = False
            self._ack_timer.stop()

    def _served_side_closed(self) -> None:
        self._closing = True
        self._from_inner.stop()
        self._to_client.write(self.session.close_notify())
        self._to_client.close()
        self._from_client.stop()
        self._from_client.start(self._client_readable)   # reads off what the client still sends
        self._linger = timer = gevent.get_hub().loop.timer(LINGER_SECONDS)
        timer.start(self._end, None)

    # -------------------------------------------------------------- ending
    def _end(self, why: Optional[str], client_lost: bool = False) -> None:
        """Close both sides (once). If ``client_lost`` (a reset, a failed
        write, broken TLS), the served side learns first which answers the
        client's kernel acknowledged, and that no more will be."""
        if self._ended:
            return
        self._ended = True
        if why is not None:
            log.debug("TLS relay of %s ends: %s", self.label, why)
        if client_lost:
            self._check_acks()
            self.acks.note_reset()
        self._ack_timer.stop()
        self._from_client.stop()
        self._from_inner.stop()
        if self._linger is not None:
            self._linger.stop()
        self._to_client.kill()
        self._to_inner.kill()
        for sock in (self.inner, self.client):
            try:
                sock.close()
            except OSError:
                pass
        self.acks.close()
        self._on_end(self)

    def close(self) -> None:
        """Stop relaying (the process stops)."""
        self._end("stopping")
