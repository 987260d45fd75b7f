"""The shard's side of the direct path: client connections a router handed
over, served by this shard's engine with no hop.

A request for this shard's queues (or a job it holds, or a number it made)
is executed at once; one it cannot serve alone is held until nothing of the
connection is in flight, and the connection goes back to the router that
sent it, from that request on (see :mod:`queueserver.router.router`).

A connection accepted on a TLS port comes here before its handshake, and
this shard terminates its TLS: it admits the client (its identity, from the
access file) and serves it with no hop, as a plain one. A TLS 1.3
connection goes back to the router with its record protection
(:mod:`queueserver.net.tlscontinued`); one whose TLS cannot move (TLS 1.2,
keys changed by a KeyUpdate) goes back as a plaintext stream that this
shard relays (:mod:`queueserver.net.tlsrelay`).

Parked requests (a blocking lease, ``result``, ``run``) wait in the engine
under a token of their own, like a router's requests.
"""
from __future__ import annotations

import itertools
import logging
import time
from abc import abstractmethod
from typing import Any, Callable, Dict, Final, Optional, Sequence, Set, Tuple

from gevent import socket
from mypy_extensions import trait

from ..access import AccessControl, load as load_access
from ..engine import Engine
from ..engine.requests import AddRequest, with_id
from ..engine.status import Reply
from ..engine.views import undo_delivery
from ..net.connection import MUST_MOVE, SERVE, ClientConnection, refusals, refused_for_job
from ..net.admission import admit, reload_rules
from ..net.handoff import Gone, HandoffChannel, Move
from ..net.relayacks import RelayAcks, adopt
from ..net.hangups import HangupWatch
from ..net.tls import TLSFiles, TLSServing, reloaded, server_context
from ..net.tlscontinued import continued_session
from ..net.tlskeylog import key_log_of
from ..net.tlsrelay import TLSRelay
from ..protocols import codec_class
from ..protocols.base import BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, SERVER_ID, Command, StreamCodec
from ..metrics.uses import Uses, note_command
from ..metrics.traffic import COUNTS as _TRAFFIC, RELAYS, TLS_MOVES
from ..links.clients import VIA_DIRECT, ClientRecord, peer_address
from .history import HistoryWriter

log: Final = logging.getLogger("queueserver.shard")

#: A parked request's name in the engine: ``(channel id, request id)`` for a
#: router's, ``(-connection id, n)`` for one of a connection served here.
Token = Tuple[int, int]
#: A connection served here; True once it holds leases that end with it.
Connection = ClientConnection[Token, bool]


@trait
class DirectHost:
    """What the direct path needs of its shard (a :class:`~.shard.Shard`,
    which makes the direct server and hands it the connections that
    arrive): whether a request is the shard's alone, its execution and
    answer, and the end of the batch. A mypyc trait rather than a Protocol:
    calls through it stay native on the path of every request."""

    engine: Engine
    history: Optional[HistoryWriter]

    @abstractmethod
    def serves(self, name: str) -> bool: ...

    @abstractmethod
    def makes(self, number: int) -> bool: ...

    @abstractmethod
    def new_id(self) -> str: ...

    @abstractmethod
    def execute(self, op: str, args: Sequence[Any], token: Optional[Token] = None,
                client: Optional[ClientRecord] = None) -> Optional[Reply]: ...

    @abstractmethod
    def answer(self, send: Callable[[Reply], None], reply: Reply) -> None: ...

    @abstractmethod
    def schedule_after_batch(self) -> None: ...

    @abstractmethod
    def flush_links(self) -> None: ...


class DirectServer:
    """Serves moved connections on ``shard``."""

    def __init__(self, shard: DirectHost) -> None:
        #: defaults only: the router's limits come with each connection
        self.max_outstanding_bytes = 8 * 1048576
        self.max_payload = 1048576
        self.shard = shard
        self.engine = shard.engine
        self.hangups = HangupWatch()
        self.clients = 0
        self._callbacks: Dict[Token, Callable[[Reply], None]] = {}   # parked requests
        #: queue -> the protocols whose clients used it on this direct path (the console's overview)
        self.queue_uses: Uses = {}
        self._ids = itertools.count(1)
        self._requests = itertools.count(1)
        #: connection id -> (the handoff socket it came by, its router's index, its codec options)
        self._homes: Dict[int, Tuple[HandoffChannel, int, Dict[str, Any]]] = {}
        #: connection id -> who the client is (what its leases name), while it is served here
        self.records: Dict[int, ClientRecord] = {}
        #: the access rules (None: no access file): a moved connection keeps its identity here
        self.access: Optional[AccessControl] = None
        #: the TLS files, and what a TLS connection handed over starts with (None: no TLS here)
        self.tls_files: Optional[TLSFiles] = None
        self.tls: Optional[TLSServing] = None
        #: TLS connections served elsewhere, whose TLS this shard relays
        self.relays: Set[TLSRelay] = set()

    def use_access(self, path: str) -> None:
        """Check moved connections' requests against the access file at ``path``."""
        self.access = AccessControl(load_access(path))

    def use_tls(self, files: TLSFiles, handshake_timeout: float) -> None:
        """Terminate the TLS connections routers hand over with ``files``
        (:class:`TLSConfigError` if they cannot be used)."""
        self.tls_files = files
        context = server_context(files)
        self.tls = TLSServing(context, handshake_timeout, key_log_of(context))

    def reload(self) -> None:
        """SIGHUP: read the access and TLS files again (a file that cannot be
        used leaves what it gave as it was; open connections keep theirs)."""
        reload_rules(self.access, "shard")
        if self.tls is not None and self.tls_files is not None:
            self.tls = reloaded(self.tls, self.tls_files, "shard")

    # ------------------------------------------------------------ arriving
    def arrived(self, channel: HandoffChannel, fd: int, move: Move) -> None:
        """A router handed over a connection: serve it from its first unread
        byte. If its client's FIN came meanwhile, what it sent before is
        still executed and answered (as a router that read it would have);
        a job handed to a client that is gone comes back (see
        :mod:`queueserver.net.connection`)."""
        sock = socket.socket(fileno=fd)
        if move.tls and self.tls is None:   # (a router with TLS, a shard without: not started so)
            log.warning("a TLS connection was handed over, but this shard has no TLS files: closing it")
            sock.close()
            channel.send_gone(move.origin)
            return
        continued = continued_session(move.tls_state) if move.tls_state is not None else None
        if move.tls_state is not None and continued is None:
            log.warning("a TLS connection was handed over with TLS state that cannot be used: closing it")
            sock.close()
            channel.send_gone(move.origin)
            return
        codec: StreamCodec = codec_class(move.protocol)(**move.options)
        codec.restore(move.state)
        connection: Connection = ClientConnection(self, sock, codec, move.protocol,
                                                  _peer_of(sock) if move.tls else None, move.limits,
                                                  move.origin, tls=self.tls if move.tls else None)
        connection.moves = move.moves
        connection.acks = adopt(move.acks)
        if continued is not None:
            connection.tls = continued
        # a TLS connection is admitted here after its handshake (see admit); a
        # plain one was admitted where it was accepted, and keeps its identity
        if not move.tls and self.access is not None:
            connection.identity = move.identity
            connection.permissions = self.access.permissions(move.identity)
        self._homes[connection.id] = (channel, move.router, move.options)
        if move.client:   # the router's description; the history names it by router index
            record = ClientRecord.from_description(move.client, VIA_DIRECT, move.router)
        else:
            record = ClientRecord(move.protocol, _peer(sock), 0, move.router, move.origin, VIA_DIRECT)
        self.records[connection.id] = record
        self.clients += 1
        connection.start(move.unread)

    def new_connection_id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------- serving
    def placement(self, connection: Optional[Connection], command: Command) -> int:
        return SERVE if self._local(command) else MUST_MOVE

    def _local(self, command: Command) -> bool:
        """Whether this shard alone can answer ``command``."""
        route, key, shard = command.route, command.key, self.shard
        if route == BY_NAME:
            return shard.serves(key)
        if route == BY_NAMES:
            return all(shard.serves(name) for name in key)
        if route == BY_ID:
            return key in self.engine.jobs
        if route == BY_NUMBER:
            return shard.makes(key)
        return False

    def execute(self, connection: Connection, command: Command,
                callback: Callable[[Reply], None]) -> Optional[Token]:
        args, op = command.args, command.op
        assert op is not None   # a command that is executed has one (a LOCAL one has none)
        if command.new_id == SERVER_ID:
            assert isinstance(args, AddRequest)   # only an add leaves its id to the server
            args = with_id(args, self.shard.new_id())
        elif command.op == "lease" and connection.codec.leases_end_with_connection:
            args = (*args, connection.id)
            connection.owned = True
        # which protocols use the queue (the console's overview)
        note_command(self.queue_uses, command.route, command.key, connection.protocol)
        token = (-connection.id, next(self._requests))
        # who it is: a lease's holder, and who the history names
        client = self.records.get(connection.id) if op == "lease" or self.shard.history is not None else None
        reply = self.shard.execute(op, args, token, client)
        if reply is None:
            self._callbacks[token] = callback
            return token
        self.shard.answer(callback, reply)
        return None

    def execute_for_job(self, connection: Connection, command: Command,
                        callback: Callable[[Reply], None]) -> Optional[Token]:
        """A request naming a job held here: run only if the client's
        identity may act on the job's queue (see :func:`refused_for_job`)."""
        permissions = connection.permissions
        assert permissions is not None   # only a connection with access rules comes here
        queue = self.engine.queue_of(command.key)
        if queue is not None and refused_for_job(permissions, command, queue, callback):
            return None
        return self.execute(connection, command, callback)   # (no such job: the engine says so)

    def deliver(self, token: Token, reply: Reply) -> None:
        """An answer the engine produced later (a parked request's)."""
        callback = self._callbacks.pop(token, None)
        if callback is not None:
            callback(reply)

    def after_requests(self) -> None:
        self.shard.schedule_after_batch()

    def admit(self, connection: Connection) -> Optional[str]:
        """A TLS connection handed over before its handshake is admitted
        here, once the handshake is done (a plain one was admitted where it
        was accepted, and is never asked)."""
        return admit(self.access, connection)

    # ------------------------------------------------------------- leaving
    def withdraw(self, token: Token) -> None:
        """The client left: the engine answers the parked request at once."""
        self.shard.execute("cancel", (token,))
        self.shard.schedule_after_batch()

    def cut_short(self, token: Token) -> None:
        """The client's FIN: its parked request is answered at once, as its
        timeout would answer it, and the answer is delivered (see withdraw)."""
        self.withdraw(token)

    def abandoned(self, command: Command, reply: Reply) -> None:
        """An answer reached a client that had left: give back the job."""
        if command.op is None:   # answered by its codec: it delivered nothing
            return
        undo = undo_delivery(command.op, reply)
        if undo is not None:
            self.shard.execute(undo[0], undo[1])
            self.shard.schedule_after_batch()

    def connection_closed(self, connection: Connection) -> None:
        if connection.owned:
            self.shard.execute("disown", ((-connection.id, connection.id),))
            connection.owned = None
            self.shard.schedule_after_batch()

    def client_left(self, connection: Connection) -> None:
        self.clients -= 1
        self._let_go(connection, closed=True)
        home = self._homes.pop(connection.id, None)
        if home is not None:
            try:
                home[0].send_gone(connection.origin)
            except OSError as err:
                log.debug("could not tell router %d that connection %d left: %s", home[1],
                          connection.origin, err)

    def move(self, connection: Connection, command: Command, unread: bytes, state: Dict[str, Any]) -> bool:
        """Hand ``connection`` back to its router, from ``command`` on. If
        that fails, the connection closes (its ``client_left`` tells the
        router, which still counts it)."""
        home = self._homes.get(connection.id)
        if home is None:
            return False
        channel, router, options = home
        self.shard.flush_links()   # what it caused goes first
        record = self.records.get(connection.id)
        move = Move(connection.protocol, options, state, unread, connection.origin, router,
                    connection.moves, connection.limits,
                    client=record.description() if record is not None else None,
                    identity=connection.identity,
                    acks=connection.acks.fd if connection.acks is not None else -1)
        if connection.tls is not None and connection.tls_moving is None:
            moved = self._relay(connection, channel, move)
        else:
            if connection.tls_moving is not None:   # TLS 1.3: it goes with its record protection
                move = move._replace(tls_state=connection.tls_moving.pack())
            try:
                channel.send_move(connection._fd, move)
                moved = True
                if move.tls_state is not None:
                    _TRAFFIC[TLS_MOVES] += 1
            except OSError as err:
                refusals.note("move", f"handing a connection back failed: {err}")
                moved = False
        if moved:   # served elsewhere from now on
            del self._homes[connection.id]
            self.clients -= 1
            self._let_go(connection, closed=False)
        return moved

    def _relay(self, connection: Connection, channel: HandoffChannel, move: Move) -> bool:
        """Hand back a TLS connection as plaintext: the router gets one end of
        a socket pair, and this shard relays between it and the client."""
        assert connection.tls is not None
        try:
            acks = RelayAcks.create()
        except (OSError, ValueError) as err:   # (out of descriptors or memory: the connection closes)
            refusals.note("tls-relay", f"relaying a TLS connection failed: {err}")
            return False
        try:
            inner, outer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as err:
            refusals.note("tls-relay", f"relaying a TLS connection failed: {err}")
            acks.close()
            return False
        try:
            channel.send_move(outer.fileno(), move._replace(acks=acks.fd))   # (duplicates go)
        except OSError as err:
            refusals.note("tls-relay", f"handing a TLS connection back failed: {err}")
            inner.close()
            acks.close()
            return False
        finally:
            outer.close()
        acks.keep_mapping_only()
        relay = TLSRelay(connection.sock, connection.tls, inner, acks,
                         f"connection {connection.origin} of router {move.router}", self._relay_ended)
        self.relays.add(relay)
        _TRAFFIC[RELAYS] += 1
        relay.start()
        return True

    def _let_go(self, connection: Connection, closed: bool) -> Optional[ClientRecord]:
        """``connection`` is no longer served here; if it ``closed`` (rather
        than went back to its router), its record says since when (a lease
        may still name it)."""
        record = self.records.pop(connection.id, None)
        if record is not None and closed:
            record.left = time.time_ns() // 1000
        return record

    def gone_router(self, channel: HandoffChannel) -> None:
        """A router's handoff socket closed: nothing more goes back that way."""
        for id in [id for id, home in self._homes.items() if home[0] is channel]:
            del self._homes[id]

    def on_gone(self, gone: Gone) -> None:
        """Routers send shards no such note."""

    def _relay_ended(self, relay: TLSRelay) -> None:
        self.relays.discard(relay)
        _TRAFFIC[RELAYS] -= 1


def _peer_of(sock: socket.socket) -> object:
    """The client's address as the socket gives it (None if it is gone already)."""
    try:
        return sock.getpeername()
    except OSError:
        return None


def _peer(sock: socket.socket) -> str:
    """The client's address, asked of the socket itself ("" if it is gone already)."""
    try:
        return peer_address(sock.getpeername())
    except OSError:
        return ""
