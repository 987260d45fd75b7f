"""A link that etcd sends to another way into the shard it is already
linked to loses nothing.

A node's router (or shard) may find its own home shard at the home's TCP
port before etcd names the shard's primary (its Unix socket was not up at
the first try); etcd's word then names the Unix socket. Dropping the TCP
link there answered the requests in flight "outcome unknown", as if the
shard had gone (seen in ``make failover-test`` after every node restarted).
Now the link moves once nothing is in flight, and a primary elsewhere is
still dropped at once.

A shard here is a small server of link frames on a real Unix socket and a
real TCP port (with the cluster's HMAC handshake), which says which way
each request came.
"""
from __future__ import annotations

import logging
import os
import secrets
import textwrap
from pathlib import Path
from typing import Any, Callable, List

import gevent
import pytest
from gevent import socket

from inprocess import leaks, rundir  # noqa: F401 (fixtures)
from queueserver.cluster.clusterfile import load_cluster
from queueserver.engine.status import OK
from queueserver.links.primaries import PrimaryPlaces
from queueserver.links.shardlink import ShardLink, outcome_unknown
from queueserver.net.channel import FrameChannel
from queueserver.net.linkauth import accept_link

pytestmark = pytest.mark.usefixtures("leaks")

SECRET = secrets.token_bytes(32)
WAIT = 10.0   # only against hangs


@pytest.fixture(scope="module", autouse=True)
def resolver_thread() -> None:
    """A TCP link's address is resolved in gevent's threadpool: its worker
    starts here, before the first test counts what it leaves behind."""
    socket.getaddrinfo("127.0.0.1", 0)


class FakeShard:
    """Serves link frames on a Unix socket and a TCP port: ``ping`` at once,
    ``slow`` after 0.3 s, ``never`` not at all; each answer names the way in."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path = unix_path
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(unix_path)
        self.unix.listen(8)
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.port: int = self.tcp.getsockname()[1]
        self.greenlets: List[gevent.Greenlet] = [gevent.spawn(self._accept, self.unix, "unix"),
                                                 gevent.spawn(self._accept, self.tcp, "tcp")]
        self.channels: List[FrameChannel] = []

    def _accept(self, listener: socket.socket, way: str) -> None:
        while True:
            sock, _ = listener.accept()
            self.greenlets.append(gevent.spawn(self._serve, sock, way))

    def _serve(self, sock: socket.socket, way: str) -> None:
        if way == "tcp":
            linked = accept_link(sock, SECRET, "test")
            if linked is None:
                return
            sock = linked
        channel = FrameChannel(sock)
        self.channels.append(channel)
        channel.send([0, "hello", {"shard": 0}])

        def handle(frame: Any) -> None:
            req_id, op = frame[0], frame[1]
            if op == "ping":
                channel.send([req_id, [OK, f"ping via {way}"]])
            elif op == "slow":
                gevent.spawn_later(0.3, channel.send, [req_id, [OK, f"slow via {way}"]])

        try:
            channel.receive(handle)
        finally:
            channel.close()

    def close(self) -> None:
        gevent.killall(self.greenlets)
        for channel in self.channels:
            channel.close()
        self.unix.close()
        self.tcp.close()


@pytest.fixture
def shard(rundir):
    served = FakeShard(str(Path(rundir) / "shard-0.sock"))
    yield served
    served.close()


def places_of(tmp_path: Path, shard: FakeShard) -> PrimaryPlaces:
    """Node c of a cluster file whose only shard is ``shard`` (TCP), with
    its Unix socket as node c's own way in."""
    secret = tmp_path / "s"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(f"""\
        secret_file = "s"
        [[node]]
        name = "c"
        host = "127.0.0.1"
        link_port = {shard.port}
        shards = 1
        """))
    return PrimaryPlaces(load_cluster(str(path)), "c", {0: shard.unix_path})


def linked_over_tcp(shard: FakeShard) -> ShardLink:
    """A link that found the shard at its TCP port first."""
    link = ShardLink(0, [("127.0.0.1", shard.port), shard.unix_path], lambda *a: None, lambda link: None,
                     auth=(SECRET, None))
    wait_until(lambda: link.up, "the link to come up")
    assert link.path == ("127.0.0.1", shard.port)
    return link


def wait_until(condition: Callable[[], bool], what: str) -> None:
    with gevent.Timeout(WAIT, AssertionError(f"waited too long for {what}")):
        while not condition():
            gevent.sleep(0.01)


def answers(link: ShardLink, op: str) -> List[Any]:
    got: List[Any] = []
    link.call(op, [], got.append)
    return got


def test_named_its_own_socket_it_moves_once_its_requests_are_answered(tmp_path, shard):
    link = linked_over_tcp(shard)
    places = places_of(tmp_path, shard)
    try:
        slow = answers(link, "slow")
        places.take(link, 1, "c", False)   # etcd: primary from home, on this node
        assert link.up and link.path == ("127.0.0.1", shard.port)   # not while a request is in flight
        wait_until(lambda: slow, "the slow answer")
        assert slow == [[OK, "slow via tcp"]]
        wait_until(lambda: link.up and link.path == shard.unix_path, "the link to move")
        ping = answers(link, "ping")
        wait_until(lambda: ping, "the ping's answer")
        assert ping == [[OK, "ping via unix"]]
        assert link.paths[0] == shard.unix_path   # and it is tried first from now on
    finally:
        link.stop()


def test_with_nothing_in_flight_it_moves_at_once(tmp_path, shard):
    link = linked_over_tcp(shard)
    try:
        places_of(tmp_path, shard).take(link, 1, "c", False)
        wait_until(lambda: link.up and link.path == shard.unix_path, "the link to move")
        ping = answers(link, "ping")
        wait_until(lambda: ping, "the ping's answer")
        assert ping == [[OK, "ping via unix"]]
    finally:
        link.stop()


def test_an_answer_that_never_comes_holds_the_move_only_so_long(tmp_path, shard, caplog):
    link = linked_over_tcp(shard)
    link.move_grace = 0.3
    try:
        never = answers(link, "never")
        with caplog.at_level(logging.WARNING, logger="queueserver.router"):
            places_of(tmp_path, shard).take(link, 1, "c", False)
            wait_until(lambda: never, "the unanswered request to be given up")
        assert never == [outcome_unknown(0)]
        assert "moves to" in caplog.text and "1 requests unanswered after 0 s" in caplog.text
        wait_until(lambda: link.up and link.path == shard.unix_path, "the link to move")
    finally:
        link.stop()


def test_a_socket_that_does_not_answer_leaves_the_link_where_it_is(tmp_path, shard, caplog):
    link = linked_over_tcp(shard)
    try:
        shard.unix.close()   # its socket gone: nothing listens there
        os.unlink(shard.unix_path)
        with caplog.at_level(logging.INFO, logger="queueserver.router"):
            places_of(tmp_path, shard).take(link, 1, "c", False)
        assert "stays at 127.0.0.1:%d" % shard.port in caplog.text
        assert link.up and link.path == ("127.0.0.1", shard.port)
        ping = answers(link, "ping")
        wait_until(lambda: ping, "the ping's answer")
        assert ping == [[OK, "ping via tcp"]]
        assert link.paths[0] == shard.unix_path   # its next connection tries the socket first
    finally:
        link.stop()


def test_a_primary_named_elsewhere_is_followed_at_once(shard):
    """Another process (a copy taken over, another node): what is in
    flight at the old one may never be answered, so the link goes now."""
    link = linked_over_tcp(shard)
    try:
        slow = answers(link, "slow")
        link.follow(shard.unix_path)
        wait_until(lambda: slow, "the slow request's fate")
        assert slow == [outcome_unknown(0)]
        wait_until(lambda: link.up and link.path == shard.unix_path, "the link to follow")
    finally:
        link.stop()


@pytest.mark.parametrize("family", ["unix", "tcp"])
def test_a_channel_shut_from_another_greenlet_ends_its_reader(family):
    """How a link ends a channel it no longer wants (a move, a primary
    elsewhere, a node whose lease lapsed): the reader, waiting in another
    greenlet, meets the end of the stream and returns; the peer sees it too."""
    if family == "unix":
        ours, theirs = socket.socketpair()
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        ours = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ours.connect(listener.getsockname())
        theirs, _ = listener.accept()
        listener.close()
    channel = FrameChannel(ours)
    frames: List[Any] = []
    reader = gevent.spawn(channel.receive, frames.append)
    try:
        peer = FrameChannel(theirs)
        peer.send([0, "hello", {"shard": 0}])
        wait_until(lambda: frames, "the first frame")
        channel.shut()
        reader.join(WAIT)
        assert reader.dead and reader.successful()
        assert theirs.recv(1) == b""   # the peer sees the end too
        assert frames == [[0, "hello", {"shard": 0}]]
    finally:
        reader.kill()
        channel.close()
        theirs.close()
