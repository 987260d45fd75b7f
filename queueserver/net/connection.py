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
stalls itself, not the others.

The end of a client's input (its FIN) is not the end of the connection: a
client may shut down its writing side and still read (``nc -N``, a script
that sends its requests and then waits for the answers). Every request read
before the FIN is executed and answered, in order, and the connection
closes once the last answer has left. Only a reset or a failed write ends
it sooner. A request that would wait (a blocking lease, ``result``,
``run``) stops waiting at the FIN and is answered as its timeout would
answer it: a client that sends nothing more is not kept waiting for, as
most clients that close are gone.

A job handed over counts as delivered once its answer is out:

* A lease (workq, goqueue, takeanumber) once the client's kernel has
  acknowledged the bytes of its answer (``tcpi_bytes_acked``). A client
  that closed for good cannot be told from one that only stopped writing,
  and its FIN may cross an answer already on its way: if the connection
  ends (reset, or closed after its FIN with the answer unacknowledged for
  :data:`LINGER_SECONDS`), every lease whose answer the client's kernel did
  not acknowledge is given back, at its place. (One that did reach a client
  which then vanished would run out anyway: nothing is lost either way.)
  On a TLS relay's plaintext pair (:mod:`.tlsrelay`), the relay, which holds
  the client's TCP socket, says what its kernel acknowledged and whether it
  reset (:mod:`.relayacks`).
* A take (queued's ``DEQUE``, TaskFlux's dequeue: destructive, no
  acknowledgement to come) once its answer's last byte went to the kernel,
  as in the original servers. A client that read it whole may reset before
  its delayed ACK leaves; giving the job back then would deliver it twice.
  Only a take whose answer was never written whole (the client left first,
  or the write failed) goes back.

When the client goes, parked requests are withdrawn, any job leased to it
in the meantime is given back, and the server ends what ends with the
connection (goqueue's reservations).

Why one module, though over 600 lines: reading, the bytes in flight,
in-order answers and the delivery rules above are one state machine of one
connection, on the path of every request, and are read together.
"""
from __future__ import annotations

import logging
import socket
import time
from collections import deque
from typing import (TYPE_CHECKING, Any, Callable, Deque, Dict, Final, Generic, Optional, Protocol, Tuple,
                    TypeVar, cast)

import gevent

from ..access import JOB_QUEUE, Permissions
from ..engine.ops import BUDGETS, DELIVERED_WHEN_WRITTEN, DELIVERIES, LISTING, PAYLOAD, QUEUE_LISTING, VERBS
from ..engine.status import FORBIDDEN, OK, SERVER_ERROR, Reply
from ..protocols.base import LOCAL, Command, StreamCodec
from .channel import RECV_SIZE, BatchWriter, os_socket
from .hangups import HangupWatch
from ..metrics.refusals import refused
from .refusals import RefusalLog
from .relayacks import RelayAcks
from .tcpinfo import bytes_acked, unacknowledged, was_reset
from .tls import HANDSHAKE_RECORD, TLSError, TLSServing, TLSSession, looks_like_tls
from .tlscontinued import ContinuedSession
from .tlsrecords import Exported
from ..metrics.traffic import ACCEPTED, COUNTS as _TRAFFIC, OPEN, RECEIVED, SENT

if TYPE_CHECKING:
    from gevent._types import _IoWatcher, _TimerWatcher

log: Final = logging.getLogger("queueserver.connection")
#: refusals of clients that speak the wrong thing on a port (TLS or not), one line per kind and interval
refusals: Final = RefusalLog(log)

MAX_UNANSWERED: Final = 4096           # requests in flight before reading pauses
LINGER_SECONDS: Final = 2.0            # how long a closing connection waits for its last reply to leave
ACK_POLL: Final = 0.005                # seconds between checks that the last answers were acknowledged
PRUNE_DELIVERIES: Final = 32           # deliveries remembered before asking the kernel which were acknowledged
SMALL_REPLY: Final = 256               # budget of an answer that carries no payload
QUEUE_ENTRY: Final = 300               # budget of one queue in an ``inspect queues`` answer

# What :meth:`Server.placement` says of a command.
SERVE: Final = 0        # execute it here
MAY_MOVE: Final = 1     # better served elsewhere: move if nothing is in flight, else serve here
MUST_MOVE: Final = 2    # cannot be served here: hold it until the connection can move

_READ: Final = 1

#: What a server's :meth:`Server.execute` returns for a request that waits:
#: the connection keeps it, opaque, to hand back to withdraw or cut short.
Pending = TypeVar("Pending")
#: The server's record, kept on the connection, of leases that end with it.
Owned = TypeVar("Owned")


class Server(Protocol[Pending, Owned]):
    """What a connection needs of its server: the router's
    :class:`~queueserver.router.Router` or the shard's
    :class:`~queueserver.shard.direct.DirectServer`."""

    @property
    def max_outstanding_bytes(self) -> int: ...
    @property
    def max_payload(self) -> int: ...
    @property
    def hangups(self) -> HangupWatch: ...

    def new_connection_id(self) -> int: ...
    def placement(self, connection: "ClientConnection[Pending, Owned]", command: Command) -> int: ...
    def execute(self, connection: "ClientConnection[Pending, Owned]", command: Command,
                callback: Callable[[Reply], None]) -> Optional[Pending]: ...
    def withdraw(self, pending: Pending) -> None: ...
    def cut_short(self, pending: Pending) -> None: ...
    def abandoned(self, command: Command, reply: Reply) -> None: ...
    def move(self, connection: "ClientConnection[Pending, Owned]", command: Command, unread: bytes,
             state: Dict[str, Any]) -> bool: ...
    def after_requests(self) -> None: ...
    def connection_closed(self, connection: "ClientConnection[Pending, Owned]") -> None: ...
    def client_left(self, connection: "ClientConnection[Pending, Owned]") -> None: ...
    def admit(self, connection: "ClientConnection[Pending, Owned]") -> Optional[str]: ...
    def execute_for_job(self, connection: "ClientConnection[Pending, Owned]", command: Command,
                        callback: Callable[[Reply], None]) -> Optional[Pending]: ...


class Timer(Protocol):
    """A gevent loop timer; ``active`` is libev's (gevent's stubs leave it out)."""

    @property
    def active(self) -> bool: ...
    def start(self, callback: Callable[[], None]) -> None: ...
    def stop(self) -> None: ...


def _timer(seconds: float) -> Timer:
    return cast(Timer, gevent.get_hub().loop.timer(seconds))


def reply_budget(command: Command, max_payload: int) -> int:
    """Bytes a request may hold while in flight: what it carries in, plus
    the largest answer it may bring back (the table of operations says
    which argument it carries and what its answer holds)."""
    op, args = command.op, command.args
    # A job's cycle first, without the table's lookup (tests/test_ops_table.py
    # checks that these say what the table says).
    if op == "add":
        return SMALL_REPLY + len(args[2])      # the payload
    if op == "lease":
        return SMALL_REPLY + max_payload
    if op == "complete":
        return SMALL_REPLY + len(args[1])      # the result
    rule = BUDGETS.get(op) if op is not None else None
    if rule is None:   # no client's request: answered with an error
        return SMALL_REPLY
    carries, answer = rule
    budget = SMALL_REPLY
    if carries >= 0:
        budget += len(args[carries])
    if answer == PAYLOAD:
        budget += max_payload
    elif answer == LISTING:
        budget += args[-1] * (max_payload + SMALL_REPLY)
    elif answer == QUEUE_LISTING:
        budget += args[-1] * QUEUE_ENTRY
    return budget


def refused_for_job(permissions: Permissions, command: Command, queue: str,
                    callback: Callable[[Reply], None]) -> bool:
    """Whether ``command``, naming a job of ``queue``, is refused to
    ``permissions``' identity; if so it is answered (and counted) here, and
    must not run: a queue the identity may not inspect is not shown (the
    job is not found), one it may see answers permission denied."""
    refusal = permissions.job_refusal(command, queue)
    if refusal is None:
        return False
    op = command.op
    verb = VERBS.get(op, "") if op is not None else ""
    refused(permissions.identity, verb, permissions.message(verb, queue))
    callback([refusal[0], refusal[1]])
    return True


class Slot(Generic[Pending, Owned]):
    """A request's place in the answer order; the server answers it through
    :meth:`answer` (a bound method costs less than a closure per request)."""

    __slots__ = ("connection", "command", "data", "close", "pending", "budget", "executing", "delivery")

    def __init__(self, connection: "ClientConnection[Pending, Owned]", command: Command, budget: int) -> None:
        self.connection = connection
        self.command = command
        self.data: Optional[bytes] = None
        self.close = command.close
        self.pending: Optional[Pending] = None   # what to withdraw if the client leaves
        self.budget = budget       # bytes counted against the connection until answered
        self.executing = True      # an answer given now follows the request's own read
        self.delivery: Optional[Reply] = None   # a job handed over: given back unless acknowledged

    def answer(self, reply: Reply) -> None:
        connection, command = self.connection, self.command
        if connection._gone:
            connection.server.abandoned(command, reply)
            return
        if reply[0] == OK and command.op in DELIVERIES:
            self.delivery = reply
        self.pending = None
        render = command.render
        assert render is not None   # a command without one (LOCAL) is answered by its codec
        try:
            data = render(reply)
        except Exception:
            log.exception("rendering %s failed", command.op)
            data = render([SERVER_ERROR, "Internal error"])
        size = len(data)
        connection._budget += size - self.budget
        self.budget = size
        self.data = data
        connection._flush()


class ClientConnection(Generic[Pending, Owned]):
    """``server`` executes commands and owns the process-wide parts (see the
    router's :class:`~queueserver.router.Router` and the shard's
    :class:`~queueserver.shard.direct.DirectServer`)."""

    def __init__(self, server: Server[Pending, Owned], sock: socket.socket, codec: StreamCodec,
                 protocol: str = "", peer: object = None, limits: Optional[Dict[str, int]] = None,
                 origin: int = 0, tls: Optional[TLSServing] = None) -> None:
        self.server = server
        self.sock = sock
        self.codec = codec
        self.protocol = protocol
        self.id = server.new_connection_id()
        self.origin = origin or self.id   # its id at the router that accepted it
        self.moves = 0                    # times it was moved between processes
        self.owned: Optional[Owned] = None    # the server's record of leases ending with it
        self.slots: Deque[Slot[Pending, Owned]] = deque()
        self.held: Deque[Command] = deque()  # decoded requests waiting for room (or for a move)
        self.closed = False        # no more requests are taken from this client
        #: who the client is, as the access rules name it ("": not identified)
        self.identity = ""
        #: its TLS certificate's subject CN, then its SAN names (none without one)
        self.certificate_names: Tuple[str, ...] = ()
        #: what its identity may do (None: no access rules, everything)
        self.permissions: Optional[Permissions] = None
        self._gone = False
        self._eof = False          # the client's input has ended: nothing more is read
        self._fin = False          # its FIN is known (read, or seen behind unread requests)
        #: jobs handed over whose answers may not be acknowledged yet: (the
        #: socket's byte offset where the answer ends, command, reply)
        self._deliveries: Deque[Tuple[int, Command, Reply]] = deque()
        self._written = 0          # bytes this process gave the writer
        self._written_before = 0   # bytes written to the socket before it came here
        self._ack_deadline = 0.0
        self._ack_timer: Optional[Timer] = None
        self._paused = False
        self._progressing = False
        self._budget = 0           # bytes: requests in flight and answers not yet sent
        limits = limits or {}
        self.limits = {"max_outstanding_bytes": limits.get("max_outstanding_bytes",
                                                           server.max_outstanding_bytes),
                       "max_payload": limits.get("max_payload", server.max_payload)}
        self._limit = self.limits["max_outstanding_bytes"]
        self._max_payload = self.limits["max_payload"]
        self._raw = os_socket(sock)   # the non-blocking OS socket inside gevent's socket
        self._fd = self._raw.fileno()
        #: a TCP socket (its kernel says what the client acknowledged), or the
        #: plaintext end of a TLS relay (:mod:`.tlsrelay`), where the relay says it
        self._tcp = sock.family != socket.AF_UNIX
        #: the relay's counters, on a relay's pair (its server sets them before start)
        self.acks: Optional[RelayAcks] = None
        self.writer = BatchWriter(sock, on_error=self._lost, on_drained=self._progress)
        self._watcher: "_IoWatcher" = gevent.get_hub().loop.io(self._fd, _READ)
        self._reader: Callable[[], None] = self._readable   # what the watcher calls when bytes arrive
        self.peer = peer
        #: the TLS state of a connection accepted on a TLS port: it stays in this
        #: process, which relays the connection if it must move (:mod:`.tlsrelay`)
        self.tls: Optional[TLSSession] = None
        self._handshake_timer: Optional[Timer] = None
        self._handshake_timeout = 0.0
        #: its TLS's record protection as it moves to another process with it
        #: (set while it moves; None: a plain connection, or TLS that stays here and is relayed)
        self.tls_moving: Optional[Exported] = None
        if tls is not None:
            self.tls = TLSSession(tls.context, keylog=tls.keylog)
            self._handshake_timeout = tls.handshake_timeout
        self._linger_timer: Optional["_TimerWatcher"] = None
        self._debug = log.isEnabledFor(logging.DEBUG)
        _TRAFFIC[OPEN] += 1            # /metrics: served in this process now, and
        if peer is not None:           # accepted here (a connection moved in has no peer)
            _TRAFFIC[ACCEPTED] += 1
        if self._debug and peer is not None:
            log.debug("connection %d opened: %s from %s", self.id, protocol, _address(peer))

    def start(self, unread: bytes = b"") -> None:
        """Serve the connection, first ``unread`` bytes received elsewhere."""
        if self.moves:   # what other processes wrote counts in the socket's acknowledged bytes
            if self._tcp:
                self._written_before = self._bytes_acked() + self._unacknowledged()
            elif self.acks is not None:   # a relay's pair: what the processes before wrote into it
                self._written_before = self.acks.written_before()
            if self.tls is not None:   # it moved here with its TLS (a ContinuedSession)
                self._reader = self._readable_tls
        elif self.tls is not None:   # admitted once the handshake is done
            self._reader = self._readable_tls
            self._watcher.start(self._reader)
            self._handshake_timer = timer = _timer(self._handshake_timeout)
            timer.start(self._handshake_expired)
            return
        else:
            self._reader = self._first_readable
        self._watcher.start(self._reader)
        if not self.moves and not self._admitted():
            return
        if unread:
            self._received(unread)

    def _admitted(self) -> bool:
        """Whether the server serves this client (it is known, or nobody
        needs to be); if not, it gets the protocol's refusal and is closed."""
        message = self.server.admit(self)
        if message is None:
            return True
        self._refuse(message)
        return False

    def _refuse(self, message: str) -> None:
        """Answer the client with its protocol's refusal (encrypted on a TLS
        connection), then close, reading off what it still sends."""
        data = self.codec.refusal(message)
        if self.tls is not None:
            data = self.tls.encrypt(data)
        self.writer.write(data)
        self._written += len(data)
        self._close_after_reply()

    # ---------------------------------------------------------------- TLS
    def _first_readable(self) -> None:
        """A plain port's first bytes: a TLS client's hello is not taken for
        requests: it gets the protocol's refusal in plain text (what a client
        that sent such bytes by mistake can read) and is closed; anything
        else is served."""
        self._reader = self._readable
        self._watcher.stop()
        self._watcher.start(self._readable)
        try:
            first = self._raw.recv(2, socket.MSG_PEEK)
        except OSError:
            first = b""
        if first and looks_like_tls(first):
            refusals.note("tls-on-plain", f"a TLS client on a plain port: {self.protocol} connection from "
                                          f"{_address(self.peer)} refused (its port speaks TLS elsewhere, "
                                          f"if at all)")
            self._refuse("this port speaks plain TCP, not TLS")
            return
        self._readable()

    def _readable_tls(self) -> None:
        """In the event loop: read what arrived over TLS, decrypt it and serve
        the plaintext; the handshake's bytes go out as they come."""
        tls = self.tls
        assert tls is not None   # the reader of TLS connections only
        try:
            data = self._raw.recv(RECV_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        if not data:
            if self.closed or not tls.handshake_done:
                self._lost()
            else:
                self._end_of_input()
            return
        _TRAFFIC[RECEIVED] += len(data)
        if self.closed:
            return  # lingering after a closing reply: read off and drop
        handshaking = not tls.handshake_done
        if handshaking and not tls.received and data[0] != HANDSHAKE_RECORD:
            self._refuse_plain()
            return
        try:
            plain = tls.receive(data)
        except TLSError as exc:
            self._tls_failed(handshaking, str(exc))
            return
        if handshaking:   # (after it, what TLS itself has to send leaves with the next answer)
            out = tls.outgoing()
            if out:
                self.writer.write(out)
                self._written += len(out)
            if tls.handshake_done and not self._handshake_done():
                return
        if (plain or handshaking) and not tls.continued:
            # its records protected here from now on (its handshake just done,
            # or its first request read), without OpenSSL's session
            state = tls.export()
            if state is not None:
                self.tls = tls = ContinuedSession(state, self.certificate_names)
        if plain:
            self._received(plain)
        if tls.peer_closed and not self._eof and not self._gone:
            self._end_of_input()

    def _handshake_done(self) -> bool:
        """The client is who its certificate says: whether it is admitted."""
        assert self.tls is not None
        if self._handshake_timer is not None:
            self._handshake_timer.stop()
            self._handshake_timer = None
        self.certificate_names = self.tls.certificate_names()
        if self._debug:
            log.debug("connection %d: %s handshake done, names %s", self.id, self.tls.version(),
                      ", ".join(self.certificate_names) or "none")
        return self._admitted()

    def _refuse_plain(self) -> None:
        """Plain text on a TLS port: the protocol's refusal, in plain text, then close."""
        refusals.note("plain-on-tls", f"a plain-text client on a TLS port: {self.protocol} connection from "
                                      f"{_address(self.peer)} refused")
        self.tls = None   # nothing more is encrypted, nor decrypted
        self._reader = self._readable
        self._refuse("this port speaks TLS")

    def _tls_failed(self, handshaking: bool, reason: str) -> None:
        """The client's TLS failed: its alert (if any) goes out, the connection closes."""
        assert self.tls is not None
        refusals.note("tls-handshake" if handshaking else "tls-error",
                      f"TLS {'handshake' if handshaking else 'error'} with {self.protocol} client "
                      f"{_address(self.peer)} failed: {reason}")
        alert = self.tls.outgoing()
        if alert:
            try:
                self._raw.send(alert)
            except OSError:
                pass
        self._lost()

    def _handshake_expired(self) -> None:
        """A handshake too slow (or never begun): the connection closes."""
        if self._handshake_timer is not None:
            self._handshake_timer.stop()
            self._handshake_timer = None
        refusals.note("tls-timeout", f"TLS handshake with {self.protocol} client {_address(self.peer)} not "
                                     f"done within {self._handshake_timeout:g} s: closed")
        self._lost()

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
            if self.closed:
                self._lost()          # lingering after a closing reply: the client is done
            else:
                self._end_of_input()
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
        """Stop reading; keep watching for the client hanging up (until its FIN is known)."""
        if not self._paused:
            self._paused = True
            self._watcher.stop()
            self.server.hangups.watch(self._fd, self)

    def _progress(self) -> None:
        """Answers left or went out: execute held requests, maybe read again."""
        if not (self.held or self._paused) or self._progressing or self.closed:
            if self._eof:
                self._finish_if_done()
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
            if not self._eof:
                self._watcher.start(self._reader)
        if self._eof:
            self._finish_if_done()

    def hung_up(self, reset: bool) -> None:
        """The server saw the paused client's FIN (or, ``reset``, its reset).
        A FIN ends only its input: what it sent before is still read and
        answered once the connection is read again."""
        if self._debug:
            log.debug("connection %d %s while not being read", self.id, "was reset" if reset else "sent FIN")
        if reset:
            self._lost()
            return
        self.server.hangups.unwatch(self._fd)   # its FIN stays: watching it would wake us for ever
        self._fin = True
        self._cut_short()

    def _cut_short(self) -> None:
        """The client sent its FIN: requests still waiting stop waiting (their answers still come)."""
        for slot in list(self.slots):
            if slot.pending is not None:
                self.server.cut_short(slot.pending)

    def _end_of_input(self) -> None:
        """The client sent all it will send: answer the rest, then close."""
        self._eof = self._fin = True
        self._watcher.stop()
        if self._debug:
            log.debug("connection %d: end of input; %d requests to answer", self.id,
                      len(self.slots) + len(self.held))
        if not self._finish_if_done():
            self._cut_short()

    def _finish_if_done(self) -> bool:
        """After the end of input: close once every answer has left and the
        client's kernel acknowledged the jobs handed over (or the connection
        was reset: they go back); True if it closed."""
        if not self._eof or self._gone or self.slots or self.held or self.writer.queued:
            return False
        if self._unacknowledged_deliveries():
            if self._ack_timer is None:
                self._ack_deadline = time.monotonic() + LINGER_SECONDS
            if time.monotonic() < self._ack_deadline:
                self._ack_timer = timer = _timer(ACK_POLL)
                timer.start(self._ack_check)
                return False
            log.info("connection %d: %d answers handing over jobs were not acknowledged in %.0f s "
                     "after the client's FIN; giving the jobs back", self.id, len(self._deliveries),
                     LINGER_SECONDS)
        tls = self.tls
        if tls is not None and tls.handshake_done:   # the client reads a clean end, not a truncation
            try:
                self._raw.send(tls.close_notify())
            except OSError:
                pass
        self._lost()
        return True

    def _ack_check(self) -> None:
        if self._ack_timer is not None:   # the timer calling back
            self._ack_timer.stop()
        self._finish_if_done()

    def _acknowledged_or_not(self) -> None:
        """A held request waits for acknowledgements to move: try again."""
        if self._ack_timer is not None:   # the timer calling back
            self._ack_timer.stop()
        if not self._gone:
            self._progress()

    def _unacknowledged_deliveries(self) -> bool:
        """Whether jobs handed over still wait for the client's kernel to
        acknowledge them; on a connection that was reset, they never will:
        they go back now."""
        if self._deliveries:
            self._prune_deliveries()
            if self._deliveries and self._reset():
                self._give_back_deliveries()
        return bool(self._deliveries)

    def _give_back_deliveries(self) -> None:
        """The client is gone: what it may not have had goes back (a take
        written whole was delivered: see the module's docstring)."""
        deliveries, self._deliveries = self._deliveries, deque()
        sent = self._sent()
        for end, command, reply in deliveries:
            if end > sent or command.op not in DELIVERED_WHEN_WRITTEN:
                self.server.abandoned(command, reply)

    def _reset(self) -> bool:
        """Whether the peer reset the connection (an error is pending, or it
        is closed); on a relay's pair, whether the relay's client did."""
        if self._tcp:
            return was_reset(self._raw)
        if self.acks is not None and self.acks.client_reset():
            return True
        try:
            return bool(self._raw.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
        except OSError:
            return True

    def _bytes_acked(self) -> int:
        """Bytes of this socket the peer's kernel has acknowledged (0 if
        unknown); on a relay's pair, what the relay says its client's kernel
        acknowledged (:mod:`.relayacks`)."""
        if self._tcp:
            return bytes_acked(self._raw)
        if self.acks is not None:
            return self.acks.acknowledged()
        return self._sent()

    def _sent(self) -> int:
        """The socket's byte offset up to which answers went to the kernel."""
        return self._written_before + self._written - self.writer.queued

    def _prune_deliveries(self) -> None:
        """Forget deliveries that are done: leases whose answers the client's
        kernel acknowledged, takes whose answers were written whole."""
        acked = self._bytes_acked()
        sent = self._sent()
        deliveries = self._deliveries
        while deliveries:
            end, command, _ = deliveries[0]
            if end > acked and (end > sent or command.op not in DELIVERED_WHEN_WRITTEN):
                break
            deliveries.popleft()

    def _unacknowledged(self) -> int:
        """Bytes sent that the peer has not acknowledged yet (SIOCOUTQ)."""
        return unacknowledged(self._fd)

    # ----------------------------------------------------------- answering
    def _dispatch(self, command: Command) -> bool:
        """Execute one command; True when the connection no longer serves
        requests here (closed, or moved to another process)."""
        slot: Slot[Pending, Owned]
        if command.route == LOCAL:
            slot = Slot(self, command, 0)
            slot.data = command.reply
            self.slots.append(slot)
            self._flush()
            return self.closed
        placement = self.server.placement(self, command)
        if placement != SERVE:
            # It moves once nothing of it is in flight or unsent, and every
            # job handed over is acknowledged (only this process could give
            # such a job back if the client vanished).
            if not self.slots and not self.writer.queued and not self._unacknowledged_deliveries():
                self._move(command)     # what follows it moves along, unread
                return True
            if placement == MUST_MOVE:
                self.held.appendleft(command)   # moves once what is in flight is answered
                self._pause()
                if not self.slots and not self.writer.queued and (
                        self._ack_timer is None or not self._ack_timer.active):   # only acknowledgements to wait for
                    self._ack_timer = timer = _timer(ACK_POLL)
                    timer.start(self._acknowledged_or_not)
                return False
        budget = reply_budget(command, self._max_payload)
        slot = Slot(self, command, budget)
        self.slots.append(slot)
        self._budget += budget
        if self._debug:
            log.debug("connection %d: %s %r", self.id, command.op, command.key)
        if self.permissions is None:
            slot.pending = self.server.execute(self, command, slot.answer)
        else:
            slot.pending = self._execute_permitted(command, slot.answer)
        slot.executing = False
        if self._fin and slot.pending is not None:   # held until after the client's FIN: no waiting
            self.server.cut_short(slot.pending)
        return self.closed

    def _execute_permitted(self, command: Command, answer: Callable[[Reply], None]) -> Optional[Pending]:
        """Execute ``command`` if the client's identity may; else answer it
        refused in the protocol's error form (the connection goes on). A
        request naming a job is the server's to check: only the job's
        shard knows its queue."""
        permissions = self.permissions
        assert permissions is not None
        refusal = permissions.refusal(command)
        if refusal is None:
            return self.server.execute(self, command, answer)
        if refusal == JOB_QUEUE:
            return self.server.execute_for_job(self, command, answer)
        op = command.op
        refused(permissions.identity, VERBS.get(op, "") if op is not None else "", refusal)
        answer([FORBIDDEN, refusal])
        return None

    def _flush(self) -> None:
        slots = self.slots
        while slots:
            data = slots[0].data
            if data is None:
                break   # answers leave in request order
            slot = slots.popleft()
            self._budget -= slot.budget
            if self.tls is not None:
                data = self.tls.encrypt(data)
            self.writer.write(data)
            self._written += len(data)
            _TRAFFIC[SENT] += len(data)
            if slot.delivery is not None:
                self._delivered(slot.command, slot.delivery)
            if slot.close:
                self._close_after_reply()
                return
        if self.held or self._paused:
            self._progress()

    def _delivered(self, command: Command, reply: Reply) -> None:
        """A job's answer is on its way: remember it until acknowledged."""
        deliveries = self._deliveries
        deliveries.append((self._written_before + self._written, command, reply))
        if len(deliveries) > PRUNE_DELIVERIES:
            self._prune_deliveries()

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
        if self.tls is not None:   # its TLS moves with it where it can; else it stays, and is relayed
            self.tls_moving = self.tls.export()
        relayed = self.tls is not None and self.tls_moving is None   # (see DirectServer.move)
        acks = self.acks
        if acks is not None:   # where the next process starts writing into the relay's pair
            acks.note_written(self._written_before + self._written)
        if not self.server.move(self, command, unread, state):
            refusals.note("move", f"a {self.protocol} connection could not be moved to serve its request; "
                                  f"closing it")
            self._withdraw()   # what ends with the connection ends (goqueue's reservations)
            self.server.client_left(self)
            relayed = False
        self._let_go_of_acks()   # (a duplicate went along)
        if relayed:
            return
        try:
            self.sock.close()   # our copy: the descriptor lives on in the other process
        except OSError:
            pass

    def _let_go_of_acks(self) -> None:
        if self.acks is not None:
            try:
                self.acks.close()
            except (OSError, ValueError):
                pass
            self.acks = None

    def _close_after_reply(self) -> None:
        """The last reply is queued: send it, half-close, read off what the
        client still sends (so closing sends no reset that could destroy the
        reply in flight), and close at EOF or after a grace period."""
        self.closed = True
        self._withdraw()
        if self._paused:
            self._paused = False
            self.server.hangups.unwatch(self._fd)
            self._watcher.start(self._reader)
        if self.tls is not None and self.tls.handshake_done:
            notify = self.tls.close_notify()   # the client reads a clean end, not a truncation
            self.writer.write(notify)
            self._written += len(notify)
        self.writer.close()
        self._linger_timer = timer = gevent.get_hub().loop.timer(LINGER_SECONDS)
        timer.start(self._lost)

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
        if self._ack_timer is not None:
            self._ack_timer.stop()
            self._ack_timer = None
        if self._handshake_timer is not None:
            self._handshake_timer.stop()
            self._handshake_timer = None
        self.writer.kill()

    def _lost(self) -> None:
        """The client is gone (or its closing reply has left): let go of it."""
        if self._gone:
            return
        if self._deliveries:   # jobs whose answers the client's kernel never acknowledged go back
            self._prune_deliveries()
        self._detach()
        self._withdraw()
        self._give_back_deliveries()
        self._let_go_of_acks()
        self.server.client_left(self)
        try:
            self.sock.close()
        except OSError:
            pass
        if self._debug:
            log.debug("connection %d closed", self.id)


def _address(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
