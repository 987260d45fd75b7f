"""Socket plumbing shared by the router and the shards.

:class:`BatchWriter` gives each socket its own writer greenlet: callers only
append bytes, so a slow or vanished peer stalls nobody else, and everything
queued while the writer was busy leaves in one ``sendall``.

:class:`FrameChannel` carries msgpack frames (never pickle) both ways over the
router<->shard Unix socket: many requests in flight, answered out of order.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import gevent
import msgpack
from gevent.event import Event

log = logging.getLogger(__name__)

RECV_SIZE = 65536  # larger buffers cost a page mapping per recv


class BatchWriter:
    __slots__ = ("sock", "chunks", "queued", "drained", "_ready", "closed", "_closing",
                 "_greenlet", "_on_error")

    def __init__(self, sock, on_error: Optional[Callable[[], None]] = None) -> None:
        self.sock = sock
        self.chunks: List[bytes] = []
        self.queued = 0           # bytes waiting to be sent
        self.drained = Event()    # set while nothing waits: readers pause on it
        self.drained.set()
        self._ready = Event()
        self.closed = False
        self._closing = False
        self._on_error = on_error
        self._greenlet = gevent.spawn(self._run)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.chunks.append(data)
            self.queued += len(data)
            self._ready.set()

    @property
    def closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Flush what is queued, then shut the socket."""
        self._closing = True
        self._ready.set()

    def kill(self) -> None:
        self.closed = True
        self._greenlet.kill(block=False)

    def _run(self) -> None:
        sock = self.sock
        try:
            while True:
                self._ready.wait()
                self._ready.clear()
                while self.chunks:
                    chunks, self.chunks = self.chunks, []
                    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                    self.drained.clear()
                    sock.sendall(data)
                    self.queued -= len(data)
                self.drained.set()
                if self._closing:
                    break
        except OSError:
            self.closed = True
            if self._on_error is not None:
                self._on_error()
        finally:
            self.closed = True
            self.drained.set()
            if self._closing:
                try:
                    sock.close()
                except OSError:
                    pass


class FrameChannel:
    """msgpack frames over a stream socket: ``send`` queues, ``frames`` yields."""

    def __init__(self, sock) -> None:
        self.sock = sock
        self.writer = BatchWriter(sock)
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def send(self, frame: Any) -> None:
        self.writer.write(self._pack(frame))

    def receive(self, handle: Callable[[list], None], after_batch: Callable[[], None] = lambda: None) -> None:
        """Read frames until the peer closes; ``after_batch`` runs after each recv."""
        unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=64 * 1024 * 1024)
        recv = self.sock.recv
        while True:
            try:
                data = recv(RECV_SIZE)
            except OSError:
                return
            if not data:
                return
            unpacker.feed(data)
            for frame in unpacker:
                handle(frame)
            after_batch()

    def close(self) -> None:
        self.writer.kill()
        try:
            self.sock.close()
        except OSError:
            pass
