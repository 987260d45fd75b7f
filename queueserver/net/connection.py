"""One client connection: decode, execute, answer in order.

The same class serves a connection in a router (which forwards requests
to shards) and in a shard (which executes its own queues' requests and
answers with no hop: the direct path). What differs is the *server* it is
given, which executes commands, may move the connection to another
process (:meth:`Server.placement`), and cleans up when it goes.

Nothing on a request's path blocks (executions and writes are queued), so
a connection needs no greenlet: an io watcher calls :meth:`_readable` in the
event loop whenever bytes arrive. Pipelined requests are executed as soon
as they are decoded and answered in request order.

What one client may cost is bounded in bytes: requests in flight count the
largest answer they may bring (see :func:`reply_budget`), answers count
until the kernel took them. Past ``max_outstanding_bytes`` (or
:data:`MAX_UNANSWERED` requests) decoded requests are held back and the
socket is no longer read, so a client that pipelines without reading
stalls itself, not the others. While a connection is not read, the server
still watches it for a hang-up (``EPOLLRDHUP``), so a client that leaves is
noticed at once. When the client goes, parked requests are withdrawn, any
job leased to it in the meantime is given back, and the server ends what
ends with the connection (goqueue's reservations).
"""
from __future__ import annotations

import logging
import socket
from collections import deque
from typing import Any, Optional

import gevent

from ..engine.status import OK, SERVER_ERROR, Reply
from ..protocols.base import LOCAL, Command
from .channel import RECV_SIZE, BatchWriter
from ..metrics.traffic import ACCEPTED, COUNTS as _TRAFFIC, OPEN, RECEIVED, SENT

log = logging.getLogger("queueserver.connection")

MAX_UNANSWERED = 4096           # requests in flight before reading pauses
LINGER_SECONDS = 2.0            # how long a closing connection waits for its last reply to leave
SMALL_REPLY = 256               # budget of an answer that carries no payload
QUEUE_ENTRY = 300               # budget of one queue in an ``inspect queues`` answer

# What :meth:`Server.placement` says of a command.
SERVE = 0        # execute it here
MAY_MOVE = 1     # better served elsewhere: move if nothing is in flight, else serve here
MUST_MOVE = 2    # cannot be served here: hold it until the connection can move

_READ = 1
#: Requests whose answer may carry a job's payload or result.
_PAYLOAD_ANSWERS = frozenset(("lease", "take", "result", "run", "inspect_job"))
#: Requests whose answer hands a job over with no acknowledgement to come.
_DELIVERIES = frozenset(("lease", "take"))
#: Requests answered with up to ``limit`` (their last argument) jobs.
_LISTING_ANSWERS = frozenset(("inspect_jobs", "inspect_scheduled"))


def reply_budget(command: Command, max_payload: int) -> int:
    """Bytes a request may hold while in flight: what it carries in, plus
    the largest answer it may bring back."""
    op, args = command.op, command.args
    # A job's cycle first, without the set lookups below.
    if op == "add":
        return SMALL_REPLY + len(args[2])      # the payload
    if op == "lease":
        return SMALL_REPLY + max_payload
    if op == "complete":
        return SMALL_REPLY + len(args[1])      # the result
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
    """A request's place in the answer order; the server answers it through
    :meth:`answer` (a bound method costs less than a closure per request)."""

    __slots__ = ("connection", "command", "data", "close", "pending", "budget", "executing")

    def __init__(self, connection: "ClientConnection", command: Command, budget: int) -> None:
        self.connection = connection
        self.command = command
        self.data: Optional[bytes] = None
        self.close = command.close
        self.pending: Any = None   # what to withdraw if the client leaves
        self.budget = budget       # bytes counted against the connection until answered
        self.executing = True      # an answer given now follows the request's own read

    def answer(self, reply: Reply) -> None:
        connection, command = self.connection, self.command
        if (not self.executing and not connection._gone and command.op in _DELIVERIES
                and reply[0] == OK and connection._at_eof()):
            # An answer that comes later than its request (a parked lease,
            # a shard's reply): the client's FIN may be here, unread; do
            # not hand the job to a closed socket.
            connection._lost()
        if connection._gone:
            connection.server.abandoned(command, reply)
            return
        self.pending = None
        try:
            data = command.render(reply)
        except Exception:
            log.exception("rendering %s failed", command.op)
            data = command.render([SERVER_ERROR, "Internal error"])
        size = len(data)
        connection._budget += size - self.budget
        self.budget = size
        self.data = data
        connection._flush()


class ClientConnection:
    """``server`` executes commands and owns the process-wide parts (see the
    router's :class:`~queueserver.router.Router` and the shard's
    :class:`~queueserver.shard.direct.DirectServer`)."""

    def __init__(self, server, sock, codec, protocol: str = "", peer: Any = None,
                 limits: Optional[dict] = None, origin: int = 0) -> None:
        self.server = server
        self.sock = sock
        self.codec = codec
        self.protocol = protocol
        self.id = server.new_connection_id()
        self.origin = origin or self.id   # its id at the router that accepted it
        self.moves = 0                    # times it was moved between processes
        self.owned: Any = None            # the server's record of leases ending with it
        self.slots: deque = deque()
        self.held: deque = deque()  # decoded requests waiting for room (or for a move)
        self.closed = False        # no more requests are taken from this client
        self._gone = False
        self._paused = False
        self._progressing = False
        self._budget = 0           # bytes: requests in flight and answers not yet sent
        limits = limits or {}
        self.limits = {"max_outstanding_bytes": limits.get("max_outstanding_bytes",
                                                           server.max_outstanding_bytes),
                       "max_payload": limits.get("max_payload", server.max_payload)}
        self._limit = self.limits["max_outstanding_bytes"]
        self._max_payload = self.limits["max_payload"]
        self._raw = sock._sock     # the non-blocking OS socket inside gevent's socket
        self._fd = self._raw.fileno()
        self.writer = BatchWriter(sock, on_error=self._lost, on_drained=self._progress)
        self._watcher = gevent.get_hub().loop.io(self._fd, _READ)
        self._linger_timer = None
        self._debug = log.isEnabledFor(logging.DEBUG)
        _TRAFFIC[OPEN] += 1            # /metrics: served in this process now, and
        if peer is not None:           # accepted here (a connection moved in has no peer)
            _TRAFFIC[ACCEPTED] += 1
        if self._debug and peer is not None:
            log.debug("connection %d opened: %s from %s", self.id, protocol, _address(peer))

    def start(self, unread: bytes = b"") -> None:
        """Serve the connection, first ``unread`` bytes received elsewhere."""
        self._watcher.start(self._readable)
        if unread:
            self._received(unread)

    # ------------------------------------------------------------ reading
    def _readable(self) -> None:
        """In the event loop: read what arrived and serve it."""
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
        _TRAFFIC[RECEIVED] += len(data)
        if self.closed:
            return  # lingering after a closing reply: read off and drop
        self._received(data)

    def _received(self, data: bytes) -> None:
        """Execute every whole request there is room for, hold the rest."""
        try:
            held = self.held
            for command in self.codec.receive(data):
                if held or not self._room():
                    held.append(command)
                    continue
                if self._dispatch(command):
                    return    # closed, or moved to another process
            if held or not self._room():
                self._pause()
        except Exception:  # a bug must cost one connection, not the process
            log.exception("serving a request failed; closing the connection")
            self._lost()
        finally:
            self.server.after_requests()

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
            self.server.hangups.watch(self._fd, self)

    def _progress(self) -> None:
        """Answers left or went out: execute held requests, maybe read again."""
        if not (self.held or self._paused) or self._progressing or self.closed:
            return   # nothing waits (the common case)
        self._progressing = True
        held = self.held
        dispatched = bool(held)
        try:
            while held and self._room():
                command = held.popleft()
                if self._dispatch(command):
                    return
                if held and held[0] is command:
                    break   # it waits until the connection can move
        finally:
            self._progressing = False
            if dispatched:
                self.server.after_requests()
        if self._paused and not self.held and len(self.slots) <= MAX_UNANSWERED // 2 \
                and self._budget + self.writer.queued <= self._limit // 2:
            self._paused = False
            self.server.hangups.unwatch(self._fd)
            self._watcher.start(self._readable)

    def _at_eof(self) -> bool:
        """Whether all the client sent has been read and its FIN has come
        (one peek; with more requests waiting, the client is taken as there)."""
        try:
            return self._raw.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def hung_up(self) -> None:
        """The server saw the paused client hang up."""
        if self._debug:
            log.debug("connection %d hung up while not being read", self.id)
        self._lost()

    # ----------------------------------------------------------- answering
    def _dispatch(self, command: Command) -> bool:
        """Execute one command; True when the connection no longer serves
        requests here (closed, or moved to another process)."""
        if command.route == LOCAL:
            slot = Slot(self, command, 0)
            slot.data = command.reply
            self.slots.append(slot)
            self._flush()
            return self.closed
        placement = self.server.placement(self, command)
        if placement != SERVE:
            if not self.slots and not self.writer.queued:
                self._move(command)     # what follows it moves along, unread
                return True
            if placement == MUST_MOVE:
                self.held.appendleft(command)   # moves once what is in flight is answered
                self._pause()
                return False
        budget = reply_budget(command, self._max_payload)
        slot = Slot(self, command, budget)
        self.slots.append(slot)
        self._budget += budget
        if self._debug:
            log.debug("connection %d: %s %r", self.id, command.op, command.key)
        slot.pending = self.server.execute(self, command, slot.answer)
        slot.executing = False
        return self.closed

    def _flush(self) -> None:
        slots = self.slots
        while slots and slots[0].data is not None:
            slot = slots.popleft()
            self._budget -= slot.budget
            self.writer.write(slot.data)
            _TRAFFIC[SENT] += len(slot.data)
            if slot.close:
                self._close_after_reply()
                return
        if self.held or self._paused:
            self._progress()

    def _move(self, command: Command) -> None:
        """Hand the socket, from ``command`` on, to the process the server
        names; this process lets go of it without closing the client."""
        unread = self.codec.unread(command)
        state = self.codec.state_at(command)
        self._detach()
        self.held.clear()
        self.moves += 1
        if self._debug:
            log.debug("connection %d moves at %s %r", self.id, command.op, command.key)
        if not self.server.move(self, command, unread, state):
            log.warning("connection %d could not be moved; closing it", self.id)
            self.server.client_left(self)
        try:
            self.sock.close()   # our copy: the descriptor lives on in the other process
        except OSError:
            pass

    def _close_after_reply(self) -> None:
        """The last reply is queued: send it, half-close, read off what the
        client still sends (so closing sends no reset that could destroy the
        reply in flight), and close at EOF or after a grace period."""
        self.closed = True
        self._withdraw()
        if self._paused:
            self._paused = False
            self.server.hangups.unwatch(self._fd)
            self._watcher.start(self._readable)
        self.writer.close()
        self._linger_timer = gevent.get_hub().loop.timer(LINGER_SECONDS)
        self._linger_timer.start(self._lost)

    # ------------------------------------------------------------- leaving
    def _withdraw(self) -> None:
        for slot in self.slots:
            if slot.pending is not None:
                self.server.withdraw(slot.pending)
        self.slots.clear()
        self.held.clear()
        self._budget = 0
        self.server.connection_closed(self)

    def _detach(self) -> None:
        """Stop every watcher and timer; the object keeps nothing alive."""
        if not self._gone:
            _TRAFFIC[OPEN] -= 1        # closed, or moved to another process
        self._gone = True
        self.closed = True
        self._watcher.stop()
        if self._paused:
            self.server.hangups.unwatch(self._fd)
        if self._linger_timer is not None:
            self._linger_timer.stop()
        self.writer.kill()

    def _lost(self) -> None:
        """The client is gone (or its closing reply has left): let go of it."""
        if self._gone:
            return
        self._detach()
        self._withdraw()
        self.server.client_left(self)
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
