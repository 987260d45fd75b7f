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
"""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import resource
import select
import socket as stdsocket
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import gevent
import xxhash
from gevent import socket

from ..engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, Reply
from ..protocols import codec_class as load_codec
from ..protocols.base import ALL, BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, Command
from .connection import ClientConnection
from .directory import SHARED, JobDirectory
from .fanout import FirstFound, Gather, SpreadLease, give_back, ignore
from ..lifecycle import setup_logging, stop_event
from .shardlink import ShardLink

log = logging.getLogger("queueserver.router")

_hash = xxhash.xxh64_intdigest

DEFAULT_MAX_CONNECTIONS = 10000
DEFAULT_MAX_OUTSTANDING = 8 * 1048576
DEFAULT_MAX_PAYLOAD = 1048576
ACCEPT_BACKOFF = 0.5          # seconds the accept loop rests when no descriptor is left
LOG_INTERVAL = 10.0           # at most one warning per interval about refused connections
_NO_DESCRIPTORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))


def shard_for(name: str, shards: int) -> int:
    """The shard that owns queue ``name``."""
    return _hash(name.encode()) % shards


class Router:
    """``routers``/``index``: this is router ``index`` of ``routers`` sharing the
    same listening sockets and shards."""

    def __init__(self, socket_paths: List[str], options: Optional[Dict[str, Any]] = None,
                 index: int = 0, routers: int = 1, limits: Optional[Dict[str, int]] = None) -> None:
        self.options = options or {}
        self.index = index
        self.routers = routers
        limits = limits or {}
        # Each router takes its share of the server's connections.
        self.max_connections = max(1, -(-limits.get("max_connections", DEFAULT_MAX_CONNECTIONS) // routers))
        self.max_outstanding_bytes = limits.get("max_outstanding_bytes", DEFAULT_MAX_OUTSTANDING)
        self.max_payload = max((o.get("max_payload", DEFAULT_MAX_PAYLOAD) for o in self.options.values()),
                               default=DEFAULT_MAX_PAYLOAD)
        self.directory = JobDirectory(routers, index)
        self.links = [ShardLink(i, path, self._shard_event, self._shard_down, self._report_clients)
                      for i, path in enumerate(socket_paths)]
        self.clients = 0
        self.started = time.time_ns() // 1000
        self.servers: Dict[str, Any] = {}
        self._connection_ids = 0
        # Connections not being read, watched only for a hang-up.
        self._hangups = select.epoll()
        self._hung: Dict[int, ClientConnection] = {}
        self._hangup_watcher = gevent.get_hub().loop.io(self._hangups.fileno(), 1)
        self._hangup_watcher.start(self._hangup)
        self._spare: Optional[int] = _spare_descriptor()
        self._refused = 0
        self._refusal_logged = 0.0

    # ------------------------------------------------------------- listening
    def listen(self, protocol: str, fd: int) -> None:
        """Serve ``protocol`` on the bound, listening socket ``fd`` (the
        supervisor's, shared by every router): an io watcher accepts in the
        event loop."""
        codec_class = load_codec(protocol)
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
                        self._out_of_descriptors(protocol, codec_class, raw, watcher, accept, err)
                    else:
                        self._note_refusal(f"accept on {protocol} failed: {err}")
                    return
                if self.clients >= self.max_connections:
                    self._refuse(conn, codec_class, "Too many connections")
                    self._note_refusal(f"{self.max_connections} clients connected (max_connections): "
                                       f"refusing new {protocol} connections")
                    continue
                try:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    sock = socket.socket(conn.family, conn.type, fileno=conn.detach())
                    client = ClientConnection(self, sock, codec_class(**options), protocol, peer)
                except Exception:
                    log.exception("setting up a %s connection failed", protocol)
                    conn.close()
                    continue
                self.clients += 1
                self._report_clients()
                client.start()

        watcher.start(accept)
        self.servers[protocol] = (raw, watcher)
        log.info("router %d serving %s on %s:%d", self.index, protocol, *raw.getsockname()[:2])

    # ------------------------------------------------------------ refusing
    @staticmethod
    def _refuse(conn: stdsocket.socket, codec_class: Any, message: str) -> None:
        """Answer a connection we will not serve with its protocol's error, then close it."""
        try:
            conn.setblocking(False)
            conn.send(codec_class.refusal(message))
        except OSError:
            pass
        conn.close()

    def _note_refusal(self, message: str) -> None:
        """Log a refusal at most once per interval, with how many there were."""
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= LOG_INTERVAL:
            log.warning("%s (%d refused since the last message)", message, self._refused)
            self._refused = 0
            self._refusal_logged = now

    def _out_of_descriptors(self, protocol: str, codec_class: Any, raw, watcher, accept,
                            err: OSError) -> None:
        """No descriptor for a new connection: refuse the waiting ones with
        the spare descriptor; if even that fails, rest the accept loop."""
        self._note_refusal(f"out of file descriptors ({os.strerror(err.errno)}): refusing {protocol} "
                           f"connections; raise the limit (ulimit -n / LimitNOFILE) or lower max_connections")
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            try:
                conn, _ = raw.accept()
            except OSError:
                conn = None   # none was waiting after all (accept checks descriptors first)
            else:
                self._refuse(conn, codec_class, "Out of file descriptors")
            self._spare = _spare_descriptor()
            if self._spare is not None:
                if conn is not None:
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

    def watch_hangup(self, fd: int, connection: ClientConnection) -> None:
        """Watch a connection that is not being read for its client leaving."""
        self._hung[fd] = connection
        self._hangups.register(fd, select.EPOLLRDHUP)

    def unwatch_hangup(self, fd: int) -> None:
        if self._hung.pop(fd, None) is not None:
            try:
                self._hangups.unregister(fd)
            except OSError:
                pass

    def _hangup(self) -> None:
        for fd, _ in self._hangups.poll(0):
            connection = self._hung.get(fd)
            if connection is None:
                self.unwatch_hangup(fd)
            else:
                connection.hung_up()

    def client_left(self, connection: ClientConnection) -> None:
        self.clients -= 1
        self._report_clients()

    def _report_clients(self, link: Optional[ShardLink] = None) -> None:
        """Tell the shards how many clients this router serves, so that any
        router can answer ``active-clients`` for all of them."""
        if self.routers > 1:
            for each in ([link] if link is not None else self.links):
                each.notify("clients", [self.index, self.clients])

    def stop(self) -> None:
        for listener, watcher in self.servers.values():
            watcher.stop()
        self._hangup_watcher.stop()
        for link in self.links:
            link.stop()

    # --------------------------------------------------------------- routing
    def shard_for(self, name: str) -> int:
        return _hash(name.encode()) % len(self.links)

    def execute(self, command: Command, callback: Callable[[Reply], None], owner: Optional[int] = None) -> Any:
        """Route ``command``; returns what :meth:`withdraw` needs if the client
        leaves: ``(link, request id)`` for a request to one shard. A lease
        with an ``owner`` (a connection id) ends when that connection closes."""
        route = command.route
        if route == BY_NAME:
            link = self.links[_hash(command.key.encode()) % len(self.links)]
            if command.new_id is not None:
                return self._create(command, link, callback)
            args = command.args if owner is None else (*command.args, owner)
            return link, link.call(command.op, args, callback)
        if route == BY_ID:
            shard = self.directory.shard_of(command.key)
            if shard is None and self.routers == 1:
                callback([NOT_FOUND, ""])
                return None
            if shard is None or shard == SHARED:
                # Ambiguous, or (with several routers) maybe made by another
                # router an instant ago: the owner answers, the rest NOT_FOUND.
                return FirstFound(self.links, command.op, command.args, callback)
            link = self.links[shard]
            return link, link.call(command.op, command.args, callback)
        if route == BY_NUMBER:
            return FirstFound(self.links, command.op, command.args, callback)
        if route == BY_NAMES:
            groups: Dict[ShardLink, List[str]] = {}
            for name in command.key:
                groups.setdefault(self.links[self.shard_for(name)], []).append(name)
            if len(groups) == 1:
                link, names = next(iter(groups.items()))
                return link, link.call(command.op, [names] + list(command.args[1:]), callback)
            return SpreadLease(groups, command.args[-1], callback)
        if route == ALL:
            return Gather(self.links, command.op, command.args,
                          self._mergers[command.op](self, command.args), callback)
        raise ValueError(f"unroutable command {command!r}")

    def _create(self, command: Command, link: ShardLink, callback: Callable[[Reply], None]) -> Any:
        """A command that makes a job: its id must be new on every shard.

        The queue's own shard rejects an id it holds; an id the directory
        places on another shard is checked there first (FIFO links keep this
        exact even for two adds racing each other).
        """
        id = command.new_id
        if not id:
            return self._forward_new(command, link, str(uuid.uuid4()), callback)
        known = self.directory.shard_of(id)
        if known is None or known == link.index:
            return self._forward_new(command, link, id, callback)
        elsewhere = self.links if known == SHARED else [self.links[known]]

        def checked(reply: Reply) -> None:
            if reply[0] == OK:
                callback([CLIENT_ERROR, "Duplicate job"])
            elif reply[0] == NOT_FOUND:
                self._forward_new(command, link, id, callback)
            else:
                callback(reply)

        return FirstFound(elsewhere, "exists", [id], checked)

    def _forward_new(self, command: Command, link: ShardLink, id: str,
                     callback: Callable[[Reply], None]) -> Any:
        directory = self.directory
        fresh = directory.place(id, link.index)
        number = directory.new_number()
        args = list(command.args)
        args[0] = id
        args.append(number)

        def created(reply: Reply) -> None:
            status = reply[0]
            if fresh and (status == CLIENT_ERROR or status == SERVER_ERROR
                          or (status == OK and reply[1] is None)):
                directory.forget(id, link.index)  # refused, or dropped as a duplicate payload
            callback(reply)

        return link, link.call(command.op, args, created)

    def withdraw(self, pending: Any) -> None:
        if isinstance(pending, tuple):
            link, req_id = pending
            link.cancel(req_id)
        else:
            pending.abandon()

    def abandoned(self, command: Command, reply: Reply) -> None:
        """An answer reached a client that had left: give back a job it leased
        or took, so no job is lost with the connection."""
        if reply[0] != OK:
            return
        if command.op == "lease":
            give_back(self.links[reply[1][8]], reply)
        elif command.op == "take":
            view = reply[1]
            self.directory.place(view[0], view[8])
            self.links[view[8]].call("restore", [view], ignore)

    # ----------------------------------------------------------- merging
    def _merge_server(self, args) -> Callable[[List[Any]], Reply]:
        def merge(answers: List[Any]) -> Reply:
            clients = {}
            for answer in answers:
                clients.update(answer.get("router-clients", ()))
            clients[self.index] = self.clients
            return [OK, {"active-clients": sum(clients.values()),
                         "evicted-jobs": sum(a["evicted-jobs"] for a in answers),
                         "started": self.started}]
        return merge

    def _merge_queues(self, args) -> Callable[[List[Any]], Reply]:
        offset, limit = args

        def merge(answers: List[Any]) -> Reply:
            queues = sorted((q for answer in answers for q in answer), key=lambda q: q[0])
            return [OK, queues[offset:offset + limit]]
        return merge

    _mergers = {"inspect_server": _merge_server, "inspect_queues": _merge_queues}

    # ------------------------------------------------------- shard events
    def _shard_event(self, link: ShardLink, kind: str, body: Any) -> None:
        if kind == "forgotten":
            self.directory.forget_all(body, link.index)
        elif kind == "placed":  # jobs another router made
            self.directory.learn(link.index, 0, body)
        elif kind == "hello":
            self.directory.learn(body["shard"], body["last-number"], body["jobs"])

    def _shard_down(self, link: ShardLink) -> None:
        self.directory.forget_shard(link.index)


def _spare_descriptor() -> Optional[int]:
    """A descriptor held in reserve, to accept (and refuse) a connection when none is left."""
    try:
        return os.open(os.devnull, os.O_RDONLY)
    except OSError:
        return None


def _raise_descriptor_limit() -> None:
    """Clients are descriptors: use all the hard limit allows, as servers do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as err:
            log.warning("could not raise the file descriptor limit from %d: %s", soft, err)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="queueserver-router")
    parser.add_argument("--config", required=True, help="JSON: sockets, listeners, options")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, "router")
    stop = stop_event()
    config = json.loads(args.config)
    _raise_descriptor_limit()
    router = Router(config["sockets"], config.get("options"), config.get("index", 0),
                    config.get("routers", 1), config.get("limits"))
    with gevent.Timeout(config.get("connect_timeout", 10), False):
        while not all(link.up for link in router.links):
            gevent.sleep(0.02)
    for protocol, fd in config["listen_fds"].items():
        router.listen(protocol, fd)
    if config.get("ready_file"):
        with open(config["ready_file"], "w") as f:
            f.write(str(os.getpid()))
    stop.wait()
    router.stop()
    log.info("router exiting")
