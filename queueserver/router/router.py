"""The router process: client listeners in front, shard links behind.

It owns sockets only. Bytes are decoded by a protocol codec into commands;
a command names a queue (hashed with xxhash to its shard), a job (found in
the :class:`JobDirectory`), several queues (possibly on several shards:
:class:`SpreadLease`) or all shards (:class:`Gather`).

The router protects itself and its clients: at most ``max_connections``
clients (each one past that is answered with its protocol's error and
closed), and when the process runs out of file descriptors the accept loop
refuses the waiting connections with a spare descriptor and backs off
instead of spinning, logging once per interval.

The direct path (``direct_path``): when a connection sends a request for
one shard's queues while nothing of it is in flight, the router hands its
socket to that shard (with the bytes not yet served), and the shard serves
it with no hop. A shard hands a connection back at the first request it
cannot serve alone (another shard's queue, a job it does not hold, a
request for every shard); the router serves it from then on, and may hand
it on again later. A connection moves at most :data:`MAX_MOVES` times, so a
client that keeps mixing shards ends up simply forwarded. Every connection
stays counted by the router that accepted it until it closes, wherever it
is served. A TLS connection goes to a shard before its handshake, unread
(:meth:`Router._tls_to_shard`): the shard terminates its TLS; if it must
come back, it comes with its TLS (:mod:`queueserver.net.tlscontinued`),
or as plaintext the shard relays (:mod:`queueserver.net.tlsrelay`).

Why one module, though over 600 lines: it is one class, the path of a
client's command from its codec to its shard and back, read in that order;
the parts that stand alone are apart (:mod:`.fanout`, :mod:`.jobcache`,
:mod:`.clusterrouter`, :mod:`.stats`, the process's main in :mod:`.process`).
"""
from __future__ import annotations

import errno
import logging
import os
import socket as stdsocket
import time
import uuid
from typing import (TYPE_CHECKING, Any, Callable, Dict, Final, List, Optional, Sequence, Set, Tuple, Type,
                    Union)

import gevent
from gevent import socket

from ..access import AccessControl, load as load_access
from ..engine.ops import HISTORY_NAMES_CLIENT
from ..engine.requests import AddRequest, RunRequest, in_queue, with_id
from ..engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, Reply
from ..engine.views import as_lease, undo_delivery
from ..protocols import codec_class as load_codec
from ..placement import shard_for
from ..net.connection import MAY_MOVE, SERVE, ClientConnection, refused_for_job
from ..net.admission import admit, reload_rules
from ..net.handoff import Gone, Move
from ..net.relayacks import adopt
from ..net.hangups import HangupWatch
from ..net.refusals import RefusalLog
from ..net.tls import TLSFiles, TLSServing, reloaded, server_context
from ..net.tlscontinued import continued_session
from ..protocols.base import ALL, BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, SERVER_ID, Command, StreamCodec
from ..links.directory import SHARED
from .jobcache import JobCache
from .fanout import FirstFound, Gather, SpreadLease, ignore
from ..links.shardlink import Address, Auth, Context, Places, ShardLink
from ..metrics.uses import Uses, note_command, router_answer
from ..links.clients import Description, describe, peer_address
from ..jobnumbers import NumberFile

if TYPE_CHECKING:
    from gevent._types import _IoWatcher

log: Final = logging.getLogger("queueserver.router")


DEFAULT_MAX_CONNECTIONS: Final = 10000
MAX_DESCRIBED: Final = 5000          # connections one console answer lists (all are counted)
DEFAULT_MAX_OUTSTANDING: Final = 8 * 1048576
DEFAULT_MAX_PAYLOAD: Final = 1048576
MAX_MOVES: Final = 4                 # moves of one connection before it stays forwarded
ACCEPT_BACKOFF: Final = 0.5          # seconds the accept loop rests when no descriptor is left
LOG_INTERVAL: Final = 10.0           # at most one warning per interval about refused connections
_NO_DESCRIPTORS: Final = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


class Located:
    """A request asking its id's home first: what :meth:`Router.withdraw`
    withdraws is whichever step it is at."""

    __slots__ = ("inner", "abandoned")

    def __init__(self) -> None:
        #: the question to the home, then the request to the shard it named (or to all)
        self.inner: Union[None, Tuple[ShardLink, int], FirstFound] = None
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True
        inner = self.inner
        if isinstance(inner, tuple):
            inner[0].cancel(inner[1])
        elif inner is not None:
            inner.abandon()

    def expire(self) -> None:
        inner = self.inner
        if isinstance(inner, tuple):
            inner[0].cancel(inner[1])
        elif inner is not None:
            inner.expire()


class Checked:
    """A request naming a job, sent once the access rules allow it on the
    job's queue (asked of its shard first): what :meth:`Router.withdraw`
    withdraws is whichever step it is at."""

    __slots__ = ("router", "inner", "abandoned", "expired")

    def __init__(self, router: "Router") -> None:
        self.router = router
        #: the question for the job's queue, then the request itself (None once answered)
        self.inner: Optional["Pending"] = None
        self.abandoned = False
        self.expired = False

    def abandon(self) -> None:
        self.abandoned = True
        if self.inner is not None:
            self.router.withdraw(self.inner)

    def expire(self) -> None:
        self.expired = True
        if self.inner is not None:
            self.router.cut_short(self.inner)


#: What :meth:`Router.execute` returns for a request that may wait, handed
#: back to :meth:`Router.withdraw` or :meth:`Router.cut_short`: ``(link,
#: request id)`` for a request to one shard, else the request spread over several.
Pending = Union[Tuple[ShardLink, int], Located, Gather, FirstFound, SpreadLease, Checked]
#: A router's client connection; it owns the links of the leases that end with it.
Connection = ClientConnection[Pending, Set[ShardLink]]
Callback = Callable[[Reply], None]
Merger = Callable[[List[Any]], Reply]


class Router:
    """``routers``/``index``: this is router ``index`` of ``routers`` sharing the
    same listening sockets and shards."""

    def __init__(self, socket_paths: Sequence[Places], options: Optional[Dict[str, Dict[str, Any]]] = None,
                 index: int = 0, routers: int = 1, limits: Optional[Dict[str, int]] = None,
                 direct_path: bool = False, history: bool = False,
                 auth: Optional[Auth] = None, numbers: Optional[str] = None) -> None:
        #: each protocol's codec options (from the config's JSON)
        self.options: Dict[str, Dict[str, Any]] = options or {}
        self.history = history
        #: the client behind the request being routed (its description), for a
        #: lease (who holds it) and, when shards keep a history, every request it names
        self._context: List[Context] = [None]
        #: queue -> the protocols whose clients used it here (the console's overview)
        self.queue_uses: Uses = {}
        #: each connection accepted here and not closed yet, as shards are told of it
        #: (origin -> :data:`~queueserver.links.clients.Description`): who holds a lease
        self.described: Dict[int, Description] = {}
        self.index = index
        #: how this router is known to shards (and in client ids of the history)
        self.key: Union[int, str] = index
        #: whether shards must hear how many clients it serves (for ``active-clients``)
        self.share_clients = routers > 1
        self.routers = routers
        self.direct_path = direct_path
        self._tls_turn = 0   # the shard the next TLS connection goes to (see _tls_to_shard)
        limits = limits or {}
        # Each router takes its share of the server's connections.
        self.max_connections = max(1, -(-limits.get("max_connections", DEFAULT_MAX_CONNECTIONS) // routers))
        self.max_outstanding_bytes = limits.get("max_outstanding_bytes", DEFAULT_MAX_OUTSTANDING)
        self.max_payload = max((o.get("max_payload", DEFAULT_MAX_PAYLOAD) for o in self.options.values()),
                               default=DEFAULT_MAX_PAYLOAD)
        #: where jobs were last seen, learnt from answers (a job never seen: its id's home knows)
        self.jobs = JobCache()
        #: which shard made each job number (None: numbers of each shard's residue class)
        self.numbers = NumberFile(numbers) if numbers is not None else None
        handoffs = (self._moved_back, self._gone) if direct_path else None
        self.links = [ShardLink(i, path, self._shard_event, self._shard_down, self._link_up, handoffs,
                                self._context, auth)
                      for i, path in enumerate(socket_paths)]
        self.clients = 0
        self.started = time.time_ns() // 1000
        self.servers: Dict[str, Tuple[stdsocket.socket, "_IoWatcher"]] = {}   # "workq", "workq over TLS"
        self._connection_ids = 0
        self.hangups = HangupWatch()
        self._spare: Optional[int] = _spare_descriptor()
        self._refusals = RefusalLog(log, LOG_INTERVAL, burst=1)
        #: the TLS listeners' files, and what each new TLS connection starts with (reloaded on SIGHUP)
        self.tls_files: Optional[TLSFiles] = None
        self.tls: Optional[TLSServing] = None
        self._clients_due = False
        #: the access rules (None: no access file, everyone may do everything)
        self.access: Optional[AccessControl] = None

    def use_access(self, path: str) -> None:
        """Enforce the access file at ``path`` (raises :class:`AccessError`)."""
        self.access = AccessControl(load_access(path))

    # ------------------------------------------------------------- listening
    def use_tls(self, files: TLSFiles, handshake_timeout: float) -> None:
        """Serve TLS listeners with ``files`` (:class:`TLSConfigError` if they cannot be used)."""
        self.tls_files = files
        self.tls = TLSServing(server_context(files), handshake_timeout)

    def listen(self, protocol: str, fd: int, tls: bool = False) -> None:
        """Serve ``protocol`` on the bound, listening socket ``fd`` (the
        supervisor's, shared by every router): an io watcher accepts in the
        event loop. On a ``tls`` listener, each connection starts with a
        handshake (with the TLS context of the moment: see :meth:`reload`)."""
        if tls and self.tls is None:
            raise ValueError(f"a TLS listener for {protocol} needs use_tls() first")
        codec_class: Type[StreamCodec] = load_codec(protocol)
        options = self.options.get(protocol, {})
        raw = stdsocket.socket(fileno=fd)
        raw.setblocking(False)

        watcher = gevent.get_hub().loop.io(raw.fileno(), 1)

        def accept() -> None:
            while True:
                try:
                    conn, peer = raw.accept()
                except (BlockingIOError, InterruptedError):
                    return  # another router took it, or none is left
                except OSError as err:
                    if err.errno in _NO_DESCRIPTORS:
                        self._out_of_descriptors(protocol, codec_class, tls, raw, watcher, accept, err)
                    else:
                        self._note_refusal(f"accept on {protocol} failed: {err}")
                    return
                if self.clients >= self.max_connections:
                    self._refuse(conn, codec_class, "Too many connections", tls)
                    self._note_refusal(f"{self.max_connections} clients connected (max_connections): "
                                       f"refusing new {protocol} connections")
                    continue
                if tls and self._tls_to_shard(conn, protocol, peer):
                    continue
                try:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock = socket.socket(conn.family, conn.type, fileno=conn.detach())
                    client = ClientConnection(self, sock, codec_class(**options), protocol, peer,
                                              tls=self.tls if tls else None)
                except Exception:
                    log.exception("setting up a %s connection failed", protocol)
                    conn.close()
                    continue
                self._count_in(client.origin, self._describe(client.origin, protocol, peer))
                client.start()

        watcher.start(accept)
        name = f"{protocol} over TLS" if tls else protocol
        self.servers[name] = (raw, watcher)
        log.info("router %d serving %s on %s:%d", self.index, name, *raw.getsockname()[:2])

    # ------------------------------------------------------------ refusing
    def _tls_to_shard(self, conn: stdsocket.socket, protocol: str, peer: Any) -> bool:
        """With the direct path, hand a new TLS connection, unread, to a
        shard of this host (in turn), which does its handshake and serves it
        (relaying it if its requests belong elsewhere: see
        :mod:`queueserver.shard.direct`); False if no shard can take it."""
        if not self.direct_path:
            return False
        links = [link for link in self.links if link.handoff is not None]
        if not links:
            return False
        link = links[self._tls_turn % len(links)]
        self._tls_turn += 1
        assert link.handoff is not None
        origin = self.new_connection_id()
        description = self._describe(origin, protocol, peer)
        move = Move(protocol, self.options.get(protocol, {}), {}, b"", origin, self.index, 0,
                    {"max_outstanding_bytes": self.max_outstanding_bytes, "max_payload": self.max_payload},
                    client=description, tls=True)
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link.handoff.send_move(conn.fileno(), move)   # (a duplicate goes)
        except OSError as err:
            log.warning("handing a TLS connection to shard %d failed (serving it here): %s", link.index, err)
            return False
        conn.close()
        link.moved.add(origin)
        self._count_in(origin, description)
        return True

    def _describe(self, origin: int, protocol: str, peer: Any) -> Description:
        """A new connection's description (who it is, since when), as the console and history name it."""
        return describe(origin, protocol, peer_address(peer), time.time_ns() // 1000, self.key)

    def _count_in(self, origin: int, description: Description) -> None:
        """A connection accepted here: counted (wherever it is served) and described until it closes."""
        self.clients += 1
        self.described[origin] = description
        self._report_clients()

    @staticmethod
    def _refuse(conn: stdsocket.socket, codec_class: Type[StreamCodec], message: str, tls: bool) -> None:
        """Answer a connection we will not serve with its protocol's error,
        then close it; on a TLS port only close it (its client expects a
        handshake, which an overloaded server does not spend CPU on, and
        would take plain text for a broken one)."""
        if not tls:
            try:
                conn.setblocking(False)
                conn.send(codec_class.refusal(message))
            except OSError:
                pass
        conn.close()

    def _note_refusal(self, message: str) -> None:
        """Log a refusal at most once per interval, with how many there were."""
        self._refusals.note("accept", message)

    def _out_of_descriptors(self, protocol: str, codec_class: Type[StreamCodec], tls: bool, raw: stdsocket.socket,
                            watcher: "_IoWatcher", accept: Callable[[], None], err: OSError) -> None:
        """No descriptor for a new connection: refuse the waiting ones with
        the spare descriptor; if even that fails, rest the accept loop."""
        assert err.errno is not None   # one of _NO_DESCRIPTORS
        self._note_refusal(f"out of file descriptors ({os.strerror(err.errno)}): refusing {protocol} "
                           f"connections; raise the limit (ulimit -n / LimitNOFILE) or lower max_connections")
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            refused = False
            try:
                conn, _ = raw.accept()
            except OSError:
                pass   # none was waiting after all (accept checks descriptors first)
            else:
                self._refuse(conn, codec_class, "Out of file descriptors", tls)
                refused = True
            self._spare = _spare_descriptor()
            if self._spare is not None:
                if refused:
                    gevent.get_hub().loop.run_callback(accept)  # refuse the next one too
                return
        watcher.stop()
        timer = gevent.get_hub().loop.timer(ACCEPT_BACKOFF)

        def again() -> None:
            timer.stop()
            if self._spare is None:
                self._spare = _spare_descriptor()
            watcher.start(accept)

        timer.start(again)

    # -------------------------------------------------------- connections
    def new_connection_id(self) -> int:
        self._connection_ids += 1
        return self._connection_ids

    def client_left(self, connection: Connection) -> None:
        self.clients -= 1
        self._forget(connection.origin)
        self._report_clients()

    def _forget(self, origin: int) -> None:
        """Connection ``origin`` closed: the shards told of it hear so."""
        if self.described.pop(origin, None) is None:
            return
        for link in self.links:
            if origin in link.introduced:
                link.introduced.discard(origin)
                link.notify("left", origin)

    def admit(self, connection: Connection) -> Optional[str]:
        """Why ``connection``'s client is not served (None: it is): see :func:`admit`."""
        return admit(self.access, connection)

    def reload(self) -> None:
        """SIGHUP: read the TLS and access files again; connections stay.
        New rules apply to every connection's next request (each keeps the
        identity it was given at connect); a file that cannot be used
        leaves the rules as they were."""
        log.info("router %d: reloading", self.index)
        self._reload_tls()
        self._reload_access()

    def _reload_access(self) -> None:
        """Read the access file again; one that cannot be used leaves the rules as they were."""
        reload_rules(self.access, f"router {self.index}")

    def execute_for_job(self, connection: Connection, command: Command, callback: Callback) -> Pending:
        """A request naming a job by id or number, by a client whose identity
        may not act on every queue: ask the job's shard for its queue (a job
        never changes queue), then send the request only if the identity may
        act there; nothing is changed for a refused one."""
        permissions = connection.permissions
        assert permissions is not None   # only a connection with access rules comes here
        checked = Checked(self)
        asking = [True]

        def answered(reply: Reply) -> None:
            asking[0] = False
            checked.inner = None
            if checked.abandoned:
                return
            if reply[0] != OK:   # no such job (or no shard to ask): as the request itself would be
                callback([NOT_FOUND, ""] if reply[0] == NOT_FOUND else reply)
            elif not refused_for_job(permissions, command, reply[1], callback):
                # only while the job is still in the queue just checked
                checked.inner = self.execute(connection, Command(
                    command.op, in_queue(command.args, reply[1]), command.route, command.key), callback)
                if checked.expired and checked.inner is not None:
                    self.cut_short(checked.inner)

        question = Command("queue_of", (command.key,), command.route, command.key, None)
        asked = self.route(question, answered)
        if asking[0]:   # not answered at once (then it is what a withdrawal cancels)
            checked.inner = asked
        return checked

    def _reload_tls(self) -> None:
        """Read the certificate, key and client CA again into a new context
        for new connections; open ones keep theirs. Files that cannot be used
        leave the context in use as it is."""
        if self.tls is not None and self.tls_files is not None:
            self.tls = reloaded(self.tls, self.tls_files, f"router {self.index}")

    def after_requests(self) -> None:
        """Frames leave once per loop turn anyway: nothing to do here."""

    def _link_up(self, link: ShardLink) -> None:
        if link.local:   # connections are handed over (and back) between a host's processes only
            link.notify("router", self.index)
        self._report_clients(link)

    # ----------------------------------------------------------- direct path
    def placement(self, connection: Connection, command: Command) -> int:
        """Whether ``command`` is better served by its shard, directly."""
        if not self.direct_path or connection.moves >= MAX_MOVES or connection.slots \
                or connection.writer.queued or connection.tls is not None and not self._tls_movable(connection):
            return SERVE   # off, moved enough, not movable now, or TLS whose state lives here
        route = command.route
        if route == BY_NAME:
            shard = self.shard_for(command.key)
        elif route == BY_NAMES:
            shards = {self.shard_for(name) for name in command.key}
            if len(shards) != 1:
                return SERVE
            shard = shards.pop()
        else:
            return SERVE
        if self.links[shard].handoff is None:
            return SERVE
        return MAY_MOVE

    @staticmethod
    def _tls_movable(connection: Connection) -> bool:
        """Whether a TLS connection can move on with its TLS: one that came
        here with it (:mod:`queueserver.net.tlscontinued`), not in the middle
        of a TLS message. (The router's own TLS connections stay: it logs no secrets.)"""
        tls = connection.tls
        return tls is not None and tls.continued and tls.export() is not None

    def move(self, connection: Connection, command: Command, unread: bytes, state: Dict[str, Any]) -> bool:
        """Hand ``connection`` to the shard of ``command``."""
        route = command.route
        link = self.links[self.shard_for(command.key if route == BY_NAME else command.key[0])]
        if link.handoff is None or connection.tls is not None and connection.tls_moving is None:
            return False
        move = Move(connection.protocol, self.options.get(connection.protocol, {}), state, unread,
                    connection.origin, self.index, connection.moves, connection.limits,
                    client=self.described.get(connection.origin), identity=connection.identity,
                    acks=connection.acks.fd if connection.acks is not None else -1,
                    tls_state=connection.tls_moving.pack() if connection.tls_moving is not None else None)
        try:
            link.handoff.send_move(connection._fd, move)
        except OSError as err:
            log.warning("handing a connection to shard %d failed: %s", link.index, err)
            return False
        link.moved.add(connection.origin)
        return True

    def _moved_back(self, link: ShardLink, fd: int, move: Move) -> None:
        """A shard handed a connection back: serve it from its first unread request."""
        link.moved.discard(move.origin)
        try:
            continued = continued_session(move.tls_state) if move.tls_state is not None else None
            if move.tls_state is not None and continued is None:
                raise ValueError("its TLS state cannot be used")
            sock = socket.socket(fileno=fd)
            codec: StreamCodec = load_codec(move.protocol)(**move.options)
            codec.restore(move.state)
            connection: Connection = ClientConnection(self, sock, codec, move.protocol, None, move.limits,
                                                      move.origin)
        except Exception:
            log.exception("taking back a %s connection failed", move.protocol)
            os.close(fd)
            if move.acks >= 0:
                os.close(move.acks)
            self.clients -= 1
            self._forget(move.origin)
            return
        connection.moves = move.moves
        connection.acks = adopt(move.acks)
        connection.tls = continued
        if self.access is not None:   # admitted where it was accepted: it keeps its identity
            connection.identity = move.identity
            connection.permissions = self.access.permissions(move.identity)
        connection.start(move.unread)

    def _gone(self, link: ShardLink, gone: Gone) -> None:
        """A connection this router handed on has closed."""
        if gone.origin not in link.moved:
            return   # counted out already (its shard's link dropped)
        link.moved.discard(gone.origin)
        self.clients -= 1
        self._forget(gone.origin)
        self._report_clients()

    def _report_clients(self, link: Optional[ShardLink] = None) -> None:
        """Tell the shards how many clients this router serves, so that any
        router can answer ``active-clients`` for all of them: a link that
        comes up at once, the others once per loop turn, before the turn's
        new clients are answered (so a client that was served is counted by
        every router it then asks, and a storm of connections costs one
        frame per shard per turn, not one per connection)."""
        if not self.share_clients:
            return
        if link is not None:
            link.notify("clients", [self.key, self.clients])
        elif not self._clients_due:
            self._clients_due = True
            gevent.get_hub().loop.run_callback(self._send_clients)

    def _send_clients(self) -> None:
        self._clients_due = False
        for each in self.links:
            each.notify("clients", [self.key, self.clients])

    def stop(self) -> None:
        for listener, watcher in self.servers.values():
            watcher.stop()
        self.hangups.stop()
        for link in self.links:
            link.stop()

    # ------------------------------------------------------------ console
    def console_request(self, request: List[Any]) -> Dict[str, Any]:
        """A ``["console", ...]`` control request: ``uses`` (which protocols
        used each queue) or ``clients`` (the connections accepted here and
        still open, at most :data:`MAX_DESCRIBED`: each one's description
        and the shard serving it directly, None while the router does)."""
        kind = request[1] if len(request) >= 2 else None
        if kind == "uses":
            return router_answer(self.queue_uses, request)
        if kind == "clients":
            served = {origin: link.index for link in self.links for origin in link.moved}
            clients = [[*description, served.get(description[0])]
                       for _, description in zip(range(MAX_DESCRIBED), self.described.values())]
            return {"router": self.key, "index": self.index, "total": len(self.described), "clients": clients}
        return {"error": f"a router answers [\"console\", \"uses\"] and [\"console\", \"clients\"], "
                         f"not {list(request)!r:.100}", "status": 400}

    # ------------------------------------------------------ cluster state
    def cluster_request(self, request: List[Any]) -> Dict[str, Any]:
        """A ``["cluster", ...]`` control request (see :class:`.clusterrouter.ClusterRouter`)."""
        return {"error": "this router serves one host, not a cluster", "status": 400}

    def cluster_counts(self) -> Dict[str, int]:
        """What its stats say of the cluster state it was told (nothing on one host)."""
        return {}

    # --------------------------------------------------------------- routing
    def shard_for(self, name: str) -> int:
        return shard_for(name, len(self.links))

    def execute(self, connection: Connection, command: Command, callback: Callback) -> Optional[Pending]:
        """Route a client's ``command``; returns what :meth:`withdraw` needs if
        the client leaves. A lease over a protocol whose leases end with the
        connection is owned by it, and the shard told when it closes."""
        # which protocols use the queue (the console's overview)
        note_command(self.queue_uses, command.route, command.key, connection.protocol)
        op = command.op
        if op == "lease" or (self.history and op in HISTORY_NAMES_CLIENT):
            # the shards learn who leases (and, for the history, who acts): the link
            # sends the connection's description once, then its id with each request
            self._context[0] = self.described.get(connection.origin)
            try:
                return self._execute(connection, command, callback)
            finally:
                self._context[0] = None
        return self._execute(connection, command, callback)

    def _execute(self, connection: Connection, command: Command, callback: Callback) -> Optional[Pending]:
        if command.op == "lease" and len(self.links) > 1:
            callback = self._learning(callback)
        if command.op == "lease" and connection.codec.leases_end_with_connection \
                and command.route == BY_NAME:
            pending = self.route(command, callback, connection.id)
            if connection.owned is None:
                connection.owned = set()
            if isinstance(pending, tuple):   # a lease by name: (link, request id)
                connection.owned.add(pending[0])
            return pending
        return self.route(command, callback)

    def _learning(self, callback: Callback) -> Callback:
        """``callback``, learning where a leased job lives on the way (its
        worker's ``complete`` will name it)."""
        jobs = self.jobs

        def learnt(reply: Reply) -> None:
            if reply[0] == OK:
                view = as_lease(reply[1])
                jobs.place(view.id, view.shard)
            callback(reply)
        return learnt

    def connection_closed(self, connection: Connection) -> None:
        """End what ends with the connection: its owned leases, shard by shard."""
        if connection.owned:
            for link in connection.owned:
                link.notify("closed", connection.id)
            connection.owned = None

    def route(self, command: Command, callback: Callback, owner: Optional[int] = None) -> Optional[Pending]:
        """Send ``command`` where it goes; returns what :meth:`withdraw` needs:
        ``(link, request id)`` for a request to one shard."""
        route, op = command.route, command.op
        assert op is not None   # a command that is routed has one (a LOCAL one has none)
        if route == BY_NAME:
            link = self.links[shard_for(command.key, len(self.links))]
            if command.new_id is not None:
                return self._create(command, link, callback)
            args = command.args if owner is None else (*command.args, owner)
            return link, link.call(op, args, callback)
        if route == BY_ID:
            return self._by_id(command, callback)
        if route == BY_NUMBER:
            return self._by_number(command, callback)
        if route == BY_NAMES:
            groups: Dict[ShardLink, List[str]] = {}
            for name in command.key:
                groups.setdefault(self.links[self.shard_for(name)], []).append(name)
            if len(groups) == 1:
                link, names = next(iter(groups.items()))
                return link, link.call(op, [names] + list(command.args[1:]), callback)
            return SpreadLease(groups, command.args[-1], callback)
        if route == ALL:
            return Gather(self.links, op, command.args, _MERGERS[op](self, command.args), callback)
        raise ValueError(f"unroutable command {command!r}")

    def _by_number(self, command: Command, callback: Callback) -> Optional[Pending]:
        """A job named by its number (goqueue): to the shard whose block holds
        it; one made before blocks is asked of every shard; one no block
        holds was never made."""
        number, numbers, op = command.key, self.numbers, command.op
        assert op is not None   # routed
        if numbers is None:   # shards make numbers of their own residue
            link = self.links[(number - 1) % len(self.links)]
            return link, link.call(op, command.args, callback)
        if numbers.is_old(number):
            return FirstFound(self.links, op, command.args, callback)
        shard = numbers.owner(number)
        if shard is None or shard >= len(self.links):
            callback([NOT_FOUND, ""])
            return None
        link = self.links[shard]
        return link, link.call(op, command.args, callback)

    def home_of(self, id: str) -> int:
        """The shard where job id ``id`` is at home (it knows where the job lives)."""
        return shard_for(id, len(self.links))

    def _by_id(self, command: Command, callback: Callback) -> Pending:
        """A request naming only a job: to the shard it was last seen on, or
        else the one its id's home says (a NOT_FOUND from a hinted shard is
        checked with the home: the job may have moved)."""
        id, op = command.key, command.op
        assert op is not None   # routed
        if len(self.links) == 1:
            link = self.links[0]
            return link, link.call(op, command.args, callback)
        seen = self.jobs.shard_of(id)
        if seen is None:
            return self._locate(command, callback)
        link = self.links[seen]

        def answered(reply: Reply) -> None:
            if reply[0] == NOT_FOUND:
                self.jobs.forget(id, seen)
                self._locate(command, callback, not_at=seen)
            else:
                callback(reply)

        return link, link.call(op, command.args, answered)

    def _locate(self, command: Command, callback: Callback, not_at: Optional[int] = None) -> Located:
        """Ask the id's home where the job lives, then send it there; a job
        no shard holds is NOT_FOUND."""
        id, op = command.key, command.op
        assert op is not None   # routed
        pending = Located()

        def located(reply: Reply) -> None:
            if pending.abandoned:
                return
            if reply[0] == NOT_FOUND or (reply[0] == OK and reply[1] == not_at):
                callback([NOT_FOUND, ""])
            elif reply[0] != OK or reply[1] == SHARED:
                # The home is out of reach (or two jobs' hashes meet there): the owner answers.
                pending.inner = FirstFound(self.reachable_links(), op, command.args, callback)
            else:
                shard = reply[1]
                self.jobs.place(id, shard)
                link = self.links[shard]
                pending.inner = (link, link.call(op, command.args, callback))

        self._ask_home(id, located, pending)
        return pending

    def reachable_links(self) -> List[ShardLink]:
        return self.links

    def _ask_home(self, id: str, located: Callback, pending: Located) -> None:
        """``locate`` at the id's home."""
        home = self.links[self.home_of(id)]
        pending.inner = (home, home.call("locate", [id], located))

    def _create(self, command: Command, link: ShardLink, callback: Callback,
                slot: Optional[int] = None) -> Tuple[ShardLink, int]:
        """A command that makes a job, to its queue's shard. The shard makes
        sure the id is new server-wide (it claims it at the id's home); a
        server-made id is made at home on that shard, so it needs no claim."""
        id, op, args = command.new_id, command.op, command.args
        # what makes a job: an add or a run, which names its id (SERVER_ID: ours to make)
        assert id is not None and op is not None and isinstance(args, (AddRequest, RunRequest))
        if id == SERVER_ID:
            id = self.new_id(link.index)
        jobs = self.jobs
        jobs.place(id, link.index)   # at once: a request for it pipelined behind the add follows it there

        def created(reply: Reply) -> None:
            if reply[0] != OK or reply[1] is None:   # refused, or dropped as a duplicate payload
                jobs.forget(id, link.index)
            callback(reply)

        return link, link.call(op, with_id(args, id), created, slot)

    def new_id(self, shard: int) -> str:
        """A fresh id whose home is ``shard`` (tries a few; any id would do)."""
        for _ in range(64):
            id = str(uuid.uuid4())
            if self.home_of(id) == shard:
                return id
        return id

    def withdraw(self, pending: Pending) -> None:
        if isinstance(pending, tuple):
            link, req_id = pending
            link.cancel(req_id)
        else:
            pending.abandon()

    def cut_short(self, pending: Pending) -> None:
        """The client sent its FIN: a request still waiting stops waiting and
        is answered as its timeout would answer it (its answer still comes)."""
        if isinstance(pending, tuple):
            link, req_id = pending
            link.cancel(req_id)
        else:
            pending.expire()

    def abandoned(self, command: Command, reply: Reply) -> None:
        """An answer reached a client that had left: give back a job it leased
        or took, so no job is lost with the connection."""
        if reply[0] != OK or command.op is None:   # (a command with no op is answered by its codec)
            return
        undo = undo_delivery(command.op, reply)
        if undo is not None:
            op, args, view = undo
            if op == "restore":
                self.jobs.place(view.id, view.shard)
            self.links[view.shard].call(op, args, ignore)

    # ----------------------------------------------------------- merging
    def _merge_server(self, args: Sequence[Any]) -> Merger:
        def merge(answers: List[Any]) -> Reply:
            clients: Dict[Union[int, str], int] = {}   # router key -> its clients
            for answer in answers:
                clients.update(answer.get("router-clients", ()))
            clients[self.key] = self.clients
            return [OK, {"active-clients": sum(clients.values()),
                         "evicted-jobs": sum(a["evicted-jobs"] for a in answers),
                         "started": self.started}]
        return merge

    def _merge_queues(self, args: Sequence[Any]) -> Merger:
        offset, limit = args

        def merge(answers: List[Any]) -> Reply:
            queues = sorted((q for answer in answers for q in answer), key=lambda q: q[0])
            return [OK, queues[offset:offset + limit]]
        return merge


    # ------------------------------------------------------- shard events
    def _shard_event(self, link: ShardLink, kind: str, body: Any) -> None:
        """A shard's note (its hello: in a cluster, the slots it serves)."""

    def _shard_down(self, link: ShardLink) -> None:
        if link.moved:   # the connections it served died with it
            self.clients -= len(link.moved)
            for origin in link.moved:
                self._forget(origin)
            link.moved.clear()
            self._report_clients()


#: How a request asked of every shard merges their answers (module-level:
#: no dict of methods in a class body that mypyc compiles).
_MERGERS: Final[Dict[str, Callable[[Router, Sequence[Any]], Merger]]] = {
    "inspect_server": Router._merge_server, "inspect_queues": Router._merge_queues}


def _spare_descriptor() -> Optional[int]:
    """A descriptor held in reserve, to accept (and refuse) a connection when none is left."""
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None
