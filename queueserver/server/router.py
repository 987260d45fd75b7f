"""The router process: client listeners in front, shard links behind.

It owns sockets only. Bytes are decoded by a protocol codec into commands;
a command names a queue (hashed with xxhash to its shard), a job (found in
the :class:`JobDirectory`), several queues (possibly on several shards:
:class:`SpreadLease`) or all shards (:class:`Gather`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import gevent
import xxhash
from gevent import socket
from gevent.server import StreamServer

from ..engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, Reply
from ..protocols import codec_class as load_codec
from ..protocols.base import ALL, BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, Command
from .connection import ClientConnection
from .directory import SHARED, JobDirectory
from .fanout import FirstFound, Gather, SpreadLease, give_back
from .lifecycle import setup_logging, stop_event
from .shardlink import ShardLink

log = logging.getLogger("queueserver.router")

_hash = xxhash.xxh64_intdigest


def shard_for(name: str, shards: int) -> int:
    """The shard that owns queue ``name``."""
    return _hash(name.encode()) % shards


class Router:
    def __init__(self, socket_paths: List[str], options: Optional[Dict[str, Any]] = None) -> None:
        self.options = options or {}
        self.directory = JobDirectory()
        self.links = [ShardLink(i, path, self._shard_event, self._shard_down)
                      for i, path in enumerate(socket_paths)]
        self.clients = 0
        self.started = time.time_ns() // 1000
        self.servers: Dict[str, StreamServer] = {}
        self._shard_of: Dict[str, int] = {}

    # ------------------------------------------------------------- listening
    def listen(self, protocol: str, host: str, port: int) -> int:
        codec_class = load_codec(protocol)
        options = self.options

        def handle(sock, address) -> None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.clients += 1
            ClientConnection(self, sock, codec_class(**options.get(protocol, {}))).serve()

        server = StreamServer((host, port), handle, backlog=1024)
        server.start()
        self.servers[protocol] = server
        actual = server.server_port
        log.info("%s listening on %s:%d", protocol, host, actual)
        return actual

    def client_left(self, connection: ClientConnection) -> None:
        self.clients -= 1

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop(timeout=1)
        for link in self.links:
            link.stop()

    # --------------------------------------------------------------- routing
    def shard_for(self, name: str) -> int:
        shard = self._shard_of.get(name)
        if shard is None:
            shard = shard_for(name, len(self.links))
            if len(self._shard_of) < 100000:
                self._shard_of[name] = shard
        return shard

    def execute(self, command: Command, callback: Callable[[Reply], None]) -> Any:
        """Route ``command``; returns what :meth:`withdraw` needs if the client leaves."""
        route = command.route
        if route == BY_NAME:
            link = self.links[self.shard_for(command.key)]
            if command.new_id is not None:
                return self._create(command, link, callback)
            return link, link.call(command.op, command.args, callback)
        if route == BY_ID:
            shard = self.directory.shard_of(command.key)
            if shard is None:
                callback([NOT_FOUND, ""])
                return None
            if shard == SHARED:
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
        """An answer reached a client that had left: give back a job it leased."""
        if command.op == "lease" and reply[0] == OK:
            give_back(self.links[reply[1][8]], reply)

    # ----------------------------------------------------------- merging
    def _merge_server(self, args) -> Callable[[List[Any]], Reply]:
        def merge(answers: List[Any]) -> Reply:
            return [OK, {"active-clients": self.clients,
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
        elif kind == "hello":
            self.directory.learn(body["shard"], body["last-number"], body["jobs"])

    def _shard_down(self, link: ShardLink) -> None:
        self.directory.forget_shard(link.index)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="queueserver-router")
    parser.add_argument("--config", required=True, help="JSON: sockets, listeners, options")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(args.log_level, "router")
    stop = stop_event()
    config = json.loads(args.config)
    router = Router(config["sockets"], config.get("options"))
    with gevent.Timeout(config.get("connect_timeout", 10), False):
        while not all(link.up for link in router.links):
            gevent.sleep(0.02)
    ports = {}
    for protocol, (host, port) in config["listeners"].items():
        ports[protocol] = router.listen(protocol, host, port)
    ports_file = config.get("ports_file")
    if ports_file:
        tmp = ports_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(ports, f)
        os.replace(tmp, ports_file)
    stop.wait()
    router.stop()
    log.info("router exiting")


if __name__ == "__main__":
    main()
