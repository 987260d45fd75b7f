"""Socket plumbing shared by the router and the shards.

:class:`BatchWriter` queues outgoing bytes per socket. Once per turn of the
event loop, one hub callback sends everything every writer queued in that
turn with a single non-blocking ``send`` each: replies to many pipelined or
concurrent requests leave together, and no greenlet switch is paid for a
write that the kernel accepts at once. Only when a peer's socket buffer is
full does that writer get a greenlet of its own to wait, so a slow or
vanished peer stalls nobody else.

:class:`FrameChannel` carries msgpack frames (never pickle) both ways over a
router<->shard link: many requests in flight, answered out of order.

Both also work over gevent's TLS sockets (links between hosts), told apart
once, when a reader or writer is made: there the SSL object, not the OS
socket, must see every byte, so reads use the TLS socket's own ``recv`` and
writes go through the writer's greenlet (``sendall``), never from the hub.
"""
from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Any, Callable, Final, Iterator, List, Optional

import gevent
import gevent.ssl
import msgpack

if TYPE_CHECKING:
    from gevent._types import _IoWatcher

log: Final = logging.getLogger(__name__)

RECV_SIZE: Final = 65536  # larger buffers cost a page mapping per recv

_pending: List["BatchWriter"] = []   # writers with bytes queued this loop turn
_scheduled = False


def _flush_pending() -> None:
    global _scheduled
    _scheduled = False
    writers = _pending[:]
    del _pending[:]
    for writer in writers:
        writer._flush()


def _is_tls(sock: socket.socket) -> bool:
    return isinstance(sock, gevent.ssl.SSLSocket)


def os_socket(sock: socket.socket) -> socket.socket:
    """The non-blocking OS socket inside a gevent socket (``sock._sock``:
    gevent's stubs type its socket as the stdlib's, which has no such field)."""
    raw: socket.socket = getattr(sock, "_sock")
    return raw


def _not_sent(data: bytes) -> int:
    """A TLS writer's "send" in the hub: nothing, so its greenlet sends it all."""
    return 0


def received(sock: socket.socket) -> Iterator[bytes]:
    """What arrives on a gevent socket (plain or TLS), chunk by chunk, until
    EOF or an error."""
    if _is_tls(sock):
        return _received_tls(sock)
    return _received_plain(sock)


def _received_plain(sock: socket.socket) -> Iterator[bytes]:
    """After a short read the socket is almost surely drained, so it waits for
    readability *before* reading again, sparing the recv that gevent's own
    ``recv`` would try first and see fail with EAGAIN on every request.
    """
    # gevent's own parts of its socket, which its stubs do not show
    wait: Callable[["_IoWatcher"], None] = getattr(sock, "_wait")
    readable: "_IoWatcher" = getattr(sock, "_read_event")
    raw = os_socket(sock)
    data: Optional[bytes]
    while True:
        try:
            data = raw.recv(RECV_SIZE)
        except BlockingIOError:
            data = None
        except OSError:
            return
        if data is not None:
            if not data:
                return
            yield data
            if len(data) == RECV_SIZE:
                continue  # more may be waiting already
        try:
            wait(readable)
        except OSError:  # closed under us
            return


def _received_tls(sock: socket.socket) -> Iterator[bytes]:
    """Decrypted bytes from a gevent TLS socket, until EOF or an error.

    No waiting first here: the SSL object may hold decrypted bytes already
    (``sock.pending()``) or a record read off the OS socket in part, and
    the OS socket would then never turn readable for them. The TLS socket's
    ``recv`` takes what the SSL object has and waits (cooperatively) only
    when it needs more from the network.
    """
    recv = sock.recv
    while True:
        try:
            data = recv(RECV_SIZE)
        except (OSError, ValueError):  # ValueError: closed or unwrapped under us
            return
        if not data:
            return
        yield data


class BatchWriter:
    __slots__ = ("sock", "_send", "chunks", "queued", "closed", "_closing",
                 "_greenlet", "_on_error", "_on_drained", "_listed", "first")

    def __init__(self, sock: socket.socket, on_error: Optional[Callable[[], None]] = None,
                 on_drained: Optional[Callable[[], None]] = None) -> None:
        self.sock = sock
        # The non-blocking send of the OS socket inside gevent's socket; a
        # TLS socket must encrypt, which may wait: all goes to _drain.
        self._send: Callable[[bytes], int] = _not_sent if _is_tls(sock) else os_socket(sock).send
        self.chunks: List[bytes] = []
        self.queued = 0            # bytes waiting to be sent
        self.closed = False
        self._closing = False
        self._on_error = on_error
        self._on_drained = on_drained   # called when everything queued has been sent
        self._greenlet: Optional[gevent.Greenlet[[], None]] = None
        self._listed = False
        self.first = False         # sent before the others of its loop turn (links between processes)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.chunks.append(data)
        self.queued += len(data)
        if not self._listed:
            self._list()

    def _list(self) -> None:
        global _scheduled
        if not self._listed:
            self._listed = True
            if self.first:
                _pending.insert(0, self)
            else:
                _pending.append(self)
            if not _scheduled:
                _scheduled = True
                gevent.get_hub().loop.run_callback(_flush_pending)

    def when_drained(self, callback: Optional[Callable[[], None]]) -> None:
        """Call ``callback()`` each time everything queued has been sent (None: no longer)."""
        self._on_drained = callback

    def close(self) -> None:
        """Send what is queued, then shut the socket for writing (the peer sees EOF)."""
        self._closing = True
        self._list()

    def kill(self) -> None:
        """Drop what is queued; the socket is the owner's to close. The
        owner's callbacks are let go, so nothing keeps it alive in a cycle."""
        self.closed = True
        self.chunks = []
        self._on_error = self._on_drained = None
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _flush(self) -> None:
        """In the hub: one non-blocking send; a greenlet takes over what is left."""
        self._listed = False
        if self.closed or self._greenlet is not None:
            return  # dead, or a greenlet is already waiting to send the rest
        chunks = self.chunks
        if chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            try:
                sent = self._send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._fail()
                return
            self.queued -= sent
            if sent < len(data):
                chunks.insert(0, data[sent:])
                self._greenlet = gevent.spawn(self._drain)
                return
        if self._closing:
            self._shut()
        elif self._on_drained is not None:
            self._on_drained()

    def _emptied(self) -> None:
        if self._closing:
            self._shut()
        elif self._on_drained is not None:
            self._on_drained()

    def _drain(self) -> None:
        try:
            while self.chunks:
                chunks, self.chunks = self.chunks, []
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                self.sock.sendall(data)
                self.queued -= len(data)
        except OSError:
            self._greenlet = None
            self._fail()
            return
        self._greenlet = None
        self._emptied()

    def _fail(self) -> None:
        self.closed = True
        self.chunks = []
        if self._on_error is not None:
            self._on_error()

    def _shut(self) -> None:
        self.closed = True
        if self._send is _not_sent:
            # TLS has no half-close: shutdown() would drop the SSL object
            # and leave a reader with ciphertext. The owner's close ends it.
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)  # all queued bytes were sent
        except OSError:
            pass


#: link frames this process has sent over every FrameChannel (for /status: messaging per job)
FRAMES_SENT: Final[List[int]] = [0]


class FrameChannel:
    """msgpack frames over a stream socket: ``send`` queues, ``frames`` yields."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writer = BatchWriter(sock)
        # A frame leaves before the client answers of its loop turn: a note
        # like "this job exists" reaches the router before the job's client
        # can act on its answer.
        self.writer.first = True
        self._pack: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True).pack
        self.sent = 0       # frames sent so far: a receiver can tell it has seen them all
        self.received = 0   # frames handled so far

    def send(self, frame: Any) -> None:
        self.sent += 1
        FRAMES_SENT[0] += 1
        self.writer.write(self._pack(frame))

    def send_packed(self, frame: bytes) -> None:
        """Send a frame packed already (by another process: a follower's snapshot)."""
        self.sent += 1
        FRAMES_SENT[0] += 1
        self.writer.write(frame)

    def receive(self, handle: Callable[[Any], None], after_batch: Callable[[], None] = lambda: None) -> None:
        """Read frames until the peer closes; ``after_batch`` runs after each recv.
        A frame is whatever msgpack decoded (``Any``): a list from our own
        peers, which nothing here checks, so ``handle`` takes it as it is."""
        unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=64 * 1024 * 1024)
        for data in received(self.sock):
            unpacker.feed(data)
            for frame in unpacker:  # a malformed stream raises: the caller drops the channel
                self.received += 1
                try:
                    handle(frame)
                except Exception:  # one bad frame or handler bug costs that frame only
                    log.exception("handling frame %r failed", frame[:2] if isinstance(frame, list) else frame)
            after_batch()

    def close(self) -> None:
        self.writer.kill()
        try:
            self.sock.close()
        except OSError:
            pass

    def shut(self) -> None:
        """End the stream from outside its reader's greenlet: what is queued
        is dropped and the socket shut both ways, so the reader, wherever it
        waits, meets the end of the stream and closes the channel itself (a
        close from another greenlet was seen to leave it waiting)."""
        self.writer.kill()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:   # closed already (or never connected)
            self.close()
