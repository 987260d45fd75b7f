"""One client connection in the router: decode, route, answer in order.

Nothing on a request's path blocks (shard calls and writes are queued), so a
connection needs no greenlet: an io watcher calls :meth:`_readable` in the
event loop whenever bytes arrive, which spares two greenlet switches per
request. Pipelined requests are routed as soon as they are decoded, whatever
shard they go to, and their answers are written in request order. A
connection with too many unanswered requests, or too many unread answers,
stops being read until they drain. When the client goes, parked requests are
withdrawn and any job leased to it in the meantime is given back.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Optional

import gevent

from ..engine.status import SERVER_ERROR, Reply
from ..protocols.base import LOCAL, Command
from .channel import RECV_SIZE, BatchWriter

log = logging.getLogger("queueserver.router")

MAX_UNANSWERED = 4096           # requests in flight before reading pauses
MAX_QUEUED_BYTES = 4 * 1048576  # answers waiting for a slow reader before reading pauses
LINGER_SECONDS = 2.0            # how long a closing connection waits for its last reply to leave

_READ = 1


class Slot:
    """A request's place in the answer order."""

    __slots__ = ("data", "close", "pending")

    def __init__(self) -> None:
        self.data: Optional[bytes] = None
        self.close = False
        self.pending: Any = None   # what to withdraw if the client leaves


class ClientConnection:
    def __init__(self, router, sock, codec) -> None:
        self.router = router
        self.sock = sock
        self.codec = codec
        self.slots: deque = deque()
        self.closed = False        # no more requests are taken from this client
        self._gone = False
        self._paused = False
        self._raw = sock._sock     # the non-blocking OS socket inside gevent's socket
        self.writer = BatchWriter(sock, on_error=self._lost, on_drained=self._resume)
        self._watcher = gevent.get_hub().loop.io(self._raw.fileno(), _READ)
        self._linger_timer = None

    def start(self) -> None:
        self._watcher.start(self._readable)

    # ------------------------------------------------------------ reading
    def _readable(self) -> None:
        """In the event loop: read what arrived, route every whole request."""
        try:
            data = self._raw.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        if not data:
            self._lost()
            return
        if self.closed:
            return  # lingering after a closing reply: read off and drop
        try:
            for command in self.codec.receive(data):
                self._dispatch(command)
                if self.closed:
                    return
        except Exception:  # a bug must cost one connection, not the router
            log.exception("serving a request failed; closing the connection")
            self._lost()
            return
        if len(self.slots) > MAX_UNANSWERED or self.writer.queued > MAX_QUEUED_BYTES:
            # The client is not reading its answers, or floods us: stop reading it.
            self._paused = True
            self._watcher.stop()

    def _resume(self) -> None:
        if (self._paused and not self.closed and len(self.slots) <= MAX_UNANSWERED // 2
                and self.writer.queued <= MAX_QUEUED_BYTES // 2):
            self._paused = False
            self._watcher.start(self._readable)

    # ----------------------------------------------------------- answering
    def _dispatch(self, command: Command) -> None:
        slot = Slot()
        slot.close = command.close
        self.slots.append(slot)
        if command.route == LOCAL:
            slot.data = command.reply
            self._flush()
            return

        def answer(reply: Reply) -> None:
            if self._gone:
                self.router.abandoned(command, reply)
                return
            slot.pending = None
            try:
                slot.data = command.render(reply)
            except Exception:
                log.exception("rendering %s failed", command.op)
                slot.data = command.render([SERVER_ERROR, "Internal error"])
            self._flush()

        slot.pending = self.router.execute(command, answer)

    def _flush(self) -> None:
        slots = self.slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            self.writer.write(slot.data)
            if slot.close:
                self._close_after_reply()
                return
        if self._paused:
            self._resume()

    def _close_after_reply(self) -> None:
        """The last reply is queued: send it, half-close, read off what the
        client still sends (so closing sends no reset that could destroy the
        reply in flight), and close at EOF or after a grace period."""
        self.closed = True
        self._withdraw()
        self.writer.close()
        self._linger_timer = gevent.get_hub().loop.timer(LINGER_SECONDS)
        self._linger_timer.start(self._lost)

    # ------------------------------------------------------------- leaving
    def _withdraw(self) -> None:
        for slot in self.slots:
            if slot.pending is not None:
                self.router.withdraw(slot.pending)
        self.slots.clear()

    def _lost(self) -> None:
        """The client is gone (or its closing reply has left): let go of it."""
        if self._gone:
            return
        self._gone = True
        self.closed = True
        self._watcher.stop()
        if self._linger_timer is not None:
            self._linger_timer.stop()
        self._withdraw()
        self.router.client_left(self)
        self.writer.kill()
        try:
            self.sock.close()
        except OSError:
            pass
