"""One client connection in the router: decode, route, answer in order.

Pipelined requests are routed as soon as they are decoded, whatever shard
they go to, and their answers are written in request order. A connection
with too many unanswered requests stops reading until answers drain. When
the client goes, parked requests are withdrawn and any job leased to it in
the meantime is given back.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Optional

import gevent
from gevent.event import Event

from ..engine.status import Reply
from ..protocols.base import LOCAL, Command
from .channel import RECV_SIZE, BatchWriter, received

log = logging.getLogger("queueserver.router")

MAX_UNANSWERED = 4096          # requests in flight before reading pauses
MAX_QUEUED_BYTES = 4 * 1048576  # answers waiting for a slow reader before reading pauses
LINGER_SECONDS = 2.0            # how long a closing connection waits for its last reply to leave


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
        self.closed = False
        self._gone = False
        self.writer = BatchWriter(sock, on_error=self._lost)
        self._drained = Event()
        self._drained.set()

    def serve(self) -> None:
        receive = self.codec.receive
        try:
            for data in received(self.sock):
                if self.closed:
                    break
                try:
                    commands = receive(data)
                except Exception:  # a codec bug must cost one connection, not the router
                    log.exception("decoder failed; closing the connection")
                    break
                for command in commands:
                    self._dispatch(command)
                    if self.closed:
                        break
                if len(self.slots) > MAX_UNANSWERED:
                    self._drained.clear()
                    self._drained.wait()
                if self.writer.queued > MAX_QUEUED_BYTES:
                    # The client is not reading its answers: stop reading its requests.
                    self.writer.drained.wait()
        finally:
            self._lost()
            if self.writer.closing:
                self._linger()

    def _linger(self) -> None:
        """After a reply that closes the connection: let it leave, then read
        off what the client still sends, so closing sends no reset that could
        destroy the reply in flight."""
        with gevent.Timeout(LINGER_SECONDS, False):
            self.writer.done.wait()
            while self.sock.recv(RECV_SIZE):
                pass

    def _dispatch(self, command: Command) -> None:
        slot = Slot()
        slot.close = command.close
        self.slots.append(slot)
        if command.route == LOCAL:
            slot.data = command.reply
            self._flush()
            return

        def answer(reply: Reply) -> None:
            if self.closed:
                self.router.abandoned(command, reply)
                return
            slot.pending = None
            try:
                slot.data = command.render(reply)
            except Exception:
                log.exception("rendering %s failed", command.op)
                slot.data = command.render([4, "Internal error"])
            self._flush()

        slot.pending = self.router.execute(command, answer)

    def _flush(self) -> None:
        slots = self.slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            self.writer.write(slot.data)
            if slot.close:
                self.closed = True
                self.writer.close()
                self._lost()
                return
        if len(slots) <= MAX_UNANSWERED // 2:
            self._drained.set()

    def _lost(self) -> None:
        """The client is gone (or asked to close): withdraw what it still waits for."""
        if self._gone:
            return
        self._gone = True
        self.closed = True
        self._drained.set()
        for slot in self.slots:
            if slot.pending is not None:
                self.router.withdraw(slot.pending)
        self.slots.clear()
        self.router.client_left(self)
        if not self.writer.closing:
            self.writer.kill()
            try:
                self.sock.close()  # also wakes a reader blocked in recv
            except OSError:
                pass
