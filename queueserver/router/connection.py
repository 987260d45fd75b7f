"""One client connection in the router: decode, route, answer in order.

Nothing on a request's path blocks (shard calls and writes are queued), so a
connection needs no greenlet: an io watcher calls :meth:`_readable` in the
event loop whenever bytes arrive, which spares two greenlet switches per
request. Pipelined requests are routed as soon as they are decoded, whatever
shard they go to, and their answers are written in request order.

What one client may cost the server is bounded in bytes: requests in flight
count the largest answer they may bring (see :func:`reply_budget`), answers
count until the kernel took them. Past ``max_outstanding_bytes`` (or
:data:`MAX_UNANSWERED` requests) decoded requests are held back and the
socket is no longer read, so a client that pipelines without reading
stalls itself, not the others. While a connection is not read, the router
still watches it for a hang-up (``EPOLLRDHUP``), so a client that leaves is
noticed at once. When the client goes, parked requests are withdrawn, any
job leased to it in the meantime is given back, and shards are told, so
that leases with close semantics (goqueue's) end.
"""
from __future__ import annotations

import logging
from collections import deque
from typing import Any, Optional, Set

import gevent

from ..engine.status import SERVER_ERROR, Reply
from ..protocols.base import LOCAL, Command
from ..net.channel import RECV_SIZE, BatchWriter

log = logging.getLogger("queueserver.router")

MAX_UNANSWERED = 4096           # requests in flight before reading pauses
LINGER_SECONDS = 2.0            # how long a closing connection waits for its last reply to leave
SMALL_REPLY = 256               # budget of an answer that carries no payload
QUEUE_ENTRY = 300               # budget of one queue in an ``inspect queues`` answer

_READ = 1
#: Requests whose answer may carry a job's payload or result.
_PAYLOAD_ANSWERS = frozenset(("lease", "take", "result", "run", "inspect_job"))
#: Requests answered with up to ``limit`` (their last argument) jobs.
_LISTING_ANSWERS = frozenset(("inspect_jobs", "inspect_scheduled"))


def reply_budget(command: Command, max_payload: int) -> int:
    """Bytes a request may hold while in flight: what it carries in, plus
    the largest answer it may bring back."""
    op, args = command.op, command.args
    budget = SMALL_REPLY
    if op == "add" or op == "run":
        budget += len(args[2])          # the payload
    elif op == "complete" or op == "fail":
        budget += len(args[1])          # the result
    if op in _PAYLOAD_ANSWERS:
        budget += max_payload
    elif op in _LISTING_ANSWERS:
        budget += args[-1] * (max_payload + SMALL_REPLY)
    elif op == "inspect_queues":
        budget += args[-1] * QUEUE_ENTRY
    return budget


class Slot:
    """A request's place in the answer order."""

    __slots__ = ("data", "close", "pending", "budget")

    def __init__(self, budget: int) -> None:
        self.data: Optional[bytes] = None
        self.close = False
        self.pending: Any = None   # what to withdraw if the client leaves
        self.budget = budget       # bytes counted against the connection until answered


class ClientConnection:
    def __init__(self, router, sock, codec, protocol: str = "", peer: Any = None) -> None:
        self.router = router
        self.sock = sock
        self.codec = codec
        self.protocol = protocol
        self.id = router.new_connection_id()
        self.slots: deque = deque()
        self.held: deque = deque()  # decoded requests waiting for room
        self.closed = False        # no more requests are taken from this client
        self._gone = False
        self._paused = False
        self._progressing = False
        self._budget = 0           # bytes: requests in flight and answers not yet sent
        self._limit = router.max_outstanding_bytes
        self._max_payload = router.max_payload
        #: links of shards holding leases that end with this connection
        self._owning: Optional[Set[Any]] = set() if codec.leases_end_with_connection else None
        self._raw = sock._sock     # the non-blocking OS socket inside gevent's socket
        self._fd = self._raw.fileno()
        self.writer = BatchWriter(sock, on_error=self._lost, on_drained=self._progress)
        self._watcher = gevent.get_hub().loop.io(self._fd, _READ)
        self._linger_timer = None
        self._debug = log.isEnabledFor(logging.DEBUG)
        if self._debug:
            log.debug("connection %d opened: %s from %s", self.id, protocol, _address(peer))

    def start(self) -> None:
        self._watcher.start(self._readable)

    # ------------------------------------------------------------ reading
    def _readable(self) -> None:
        """In the event loop: read what arrived, route every whole request
        there is room for, hold the rest."""
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
            held = self.held
            for command in self.codec.receive(data):
                if held or not self._room():
                    held.append(command)
                    continue
                self._dispatch(command)
                if self.closed:
                    return
        except Exception:  # a bug must cost one connection, not the router
            log.exception("serving a request failed; closing the connection")
            self._lost()
            return
        if self.held or not self._room():
            self._pause()

    def _room(self) -> bool:
        """Whether one more request may go out: not while unread answers fill
        the budget; else always when none is in flight."""
        queued = self.writer.queued
        if queued >= self._limit:
            return False
        return not self.slots or (len(self.slots) < MAX_UNANSWERED
                                  and self._budget + queued < self._limit)

    def _pause(self) -> None:
        """Stop reading; keep watching for the client hanging up."""
        if not self._paused:
            self._paused = True
            self._watcher.stop()
            self.router.watch_hangup(self._fd, self)

    def _progress(self) -> None:
        """Answers left or went out: route held requests, maybe read again."""
        if self._progressing or self.closed:
            return
        self._progressing = True
        try:
            held = self.held
            while held and self._room():
                self._dispatch(held.popleft())
                if self.closed:
                    return
        finally:
            self._progressing = False
        if self._paused and not self.held and len(self.slots) <= MAX_UNANSWERED // 2 \
                and self._budget + self.writer.queued <= self._limit // 2:
            self._paused = False
            self.router.unwatch_hangup(self._fd)
            self._watcher.start(self._readable)

    def hung_up(self) -> None:
        """The router saw the paused client hang up."""
        if self._debug:
            log.debug("connection %d hung up while not being read", self.id)
        self._lost()

    # ----------------------------------------------------------- answering
    def _dispatch(self, command: Command) -> None:
        if command.route == LOCAL:
            slot = Slot(0)
            slot.close = command.close
            slot.data = command.reply
            self.slots.append(slot)
            self._flush()
            return
        slot = Slot(reply_budget(command, self._max_payload))
        slot.close = command.close
        self.slots.append(slot)
        self._budget += slot.budget
        if self._debug:
            log.debug("connection %d: %s %r", self.id, command.op, command.key)

        def answer(reply: Reply) -> None:
            if self._gone:
                self.router.abandoned(command, reply)
                return
            slot.pending = None
            try:
                data = command.render(reply)
            except Exception:
                log.exception("rendering %s failed", command.op)
                data = command.render([SERVER_ERROR, "Internal error"])
            self._budget += len(data) - slot.budget
            slot.budget = len(data)
            slot.data = data
            self._flush()

        owner = None
        if self._owning is not None and command.op == "lease":
            owner = self.id
        slot.pending = self.router.execute(command, answer, owner)
        if owner is not None and isinstance(slot.pending, tuple):
            self._owning.add(slot.pending[0])

    def _flush(self) -> None:
        slots = self.slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            self._budget -= slot.budget
            self.writer.write(slot.data)
            if slot.close:
                self._close_after_reply()
                return
        self._progress()

    def _close_after_reply(self) -> None:
        """The last reply is queued: send it, half-close, read off what the
        client still sends (so closing sends no reset that could destroy the
        reply in flight), and close at EOF or after a grace period."""
        self.closed = True
        self._withdraw()
        if self._paused:
            self._paused = False
            self.router.unwatch_hangup(self._fd)
            self._watcher.start(self._readable)
        self.writer.close()
        self._linger_timer = gevent.get_hub().loop.timer(LINGER_SECONDS)
        self._linger_timer.start(self._lost)

    # ------------------------------------------------------------- leaving
    def _withdraw(self) -> None:
        for slot in self.slots:
            if slot.pending is not None:
                self.router.withdraw(slot.pending)
        self.slots.clear()
        self.held.clear()
        self._budget = 0
        if self._owning:
            for link in self._owning:
                link.notify("closed", self.id)
            self._owning.clear()

    def _lost(self) -> None:
        """The client is gone (or its closing reply has left): let go of it."""
        if self._gone:
            return
        self._gone = True
        self.closed = True
        self._watcher.stop()
        if self._paused:
            self.router.unwatch_hangup(self._fd)
        if self._linger_timer is not None:
            self._linger_timer.stop()
        self._withdraw()
        self.router.client_left(self)
        self.writer.kill()
        try:
            self.sock.close()
        except OSError:
            pass
        if self._debug:
            log.debug("connection %d closed", self.id)


def _address(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
