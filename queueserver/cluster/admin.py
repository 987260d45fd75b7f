"""The ``cluster`` command's line to each shard: one authenticated TCP link.

It speaks the routers' link protocol (msgpack frames ``[id, op, args]``,
answers ``[id, reply]``; frames with id 0 are the shard's news, which it
skips). A link that breaks is made again, and the request asked again, until
a deadline: every request it makes can be repeated without harm (see
:mod:`.rebalance`), so a node killed mid-move only delays the move.
"""
from __future__ import annotations

import logging
import ssl
import time
from typing import Any, Dict, List, Optional, Tuple

import msgpack
from gevent import socket

from ..engine.status import OK
from ..net import linkauth
from .clusterfile import ClusterSpec, ShardSpec

CALL_TIMEOUT = 60.0       # seconds one request may take (a move of many jobs fsyncs them)

log = logging.getLogger("queueserver.cluster")


class AdminError(Exception):
    """A shard refused a request or stayed out of reach; one line."""


class ShardLine:
    def __init__(self, shard: ShardSpec, secret: bytes, tls: Optional[ssl.SSLContext],
                 places: Optional[List[Tuple[str, int]]] = None) -> None:
        """``places``: where the shard may be, tried in turn (a replicated
        cluster's: its home, then where a failover may have put it)."""
        self.shard = shard
        self._secret = secret
        self._tls = tls
        self.places = places or [(shard.host, shard.port)]
        self._at = 0
        self._sock: Optional[socket.socket] = None
        self._unpacker: Optional[msgpack.Unpacker] = None   # msgpack has no stubs: Any
        self._next = 1

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.places[self._at], timeout=5.0)
        except OSError:
            self._at = (self._at + 1) % len(self.places)   # next time, the next place
            raise
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = linkauth.connect_link(sock, self._secret, self._tls)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(CALL_TIMEOUT)
        self._sock = sock
        self._unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, op: str, args: List[Any], deadline: float) -> Any:
        """The value of the shard's OK answer; retried over new links until ``deadline``."""
        last: Optional[BaseException] = None
        while True:
            try:
                if self._sock is None:
                    self._connect()
                return self._exchange(op, args)
            except (OSError, linkauth.LinkAuthError, ValueError, msgpack.ExtraData) as err:
                if last is None:   # said once: the operator knows why nothing moves
                    log.warning("shard %s at %s:%d: %s; trying again for up to %.0f s", self.shard.name,
                                self.shard.host, self.shard.port, err or type(err).__name__,
                                max(0.0, deadline - time.monotonic()))
                last = err
                self.close()
            if time.monotonic() >= deadline:
                raise AdminError(f"shard {self.shard.name} at {self.shard.host}:{self.shard.port} "
                                 f"cannot be reached for {op}: {last}")
            time.sleep(0.2)

    def _exchange(self, op: str, args: List[Any]) -> Any:
        """The value of the shard's OK answer: whatever msgpack decoded."""
        sock, unpacker = self._sock, self._unpacker
        assert sock is not None and unpacker is not None   # connected by call()
        req_id = self._next
        self._next += 1
        sock.sendall(msgpack.packb([req_id, op, args], use_bin_type=True))
        while True:
            for frame in unpacker:
                if frame[0] == req_id:
                    status, value = frame[1]
                    if status != OK:
                        raise AdminError(f"shard {self.shard.name} refused {op}: {value}")
                    return value
            data = sock.recv(1 << 20)
            if not data:
                raise ConnectionResetError("the shard closed the link")
            unpacker.feed(data)


class Cluster:
    """Lines to every shard of the cluster file (made when first used)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        secret, tls = linkauth.client_credentials(spec.secret_file, spec.tls)
        self.shards = spec.shards()
        self.lines: Dict[int, ShardLine] = {
            s.ordinal: ShardLine(s, secret, tls, spec.candidates(s.ordinal) if spec.replicas else None)
            for s in self.shards}

    def call(self, ordinal: int, op: str, args: List[Any], wait: float = CALL_TIMEOUT) -> Any:
        return self.lines[ordinal].call(op, args, time.monotonic() + wait)

    def close(self) -> None:
        for line in self.lines.values():
            line.close()
