"""The real :class:`Shard` and :class:`Router` inside the pytest process.

They run under gevent in this process's hub, with real Unix sockets in a
private temporary directory and real loopback TCP listeners on port 0.
Nothing is monkeypatched: every socket used here is gevent's own
(``from gevent import socket``), so the test's code, in the main greenlet,
waits cooperatively while the servers' greenlets run.

Neither class can be stopped in process today (``Shard.serve`` runs for
ever and keeps its listeners in locals; ``Router.stop`` leaves its
listeners, its spare descriptor and the hang-up epoll open), so
:meth:`ServedShard.stop` and :meth:`Cluster.stop` do by hand what the end
of a process would do, and :class:`Leaks` checks after every test that no
greenlet, descriptor or started watcher of the hub is left behind.
"""
from __future__ import annotations

import gc
import itertools
import os
import shutil
import socket as stdsocket
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import gevent
import greenlet
import pytest
from gevent import socket
from gevent.event import AsyncResult, Event
from gevent.queue import Queue

from queueserver.net.channel import FrameChannel
from queueserver.net.handoff import handoff_path
from queueserver.router.router import Router
from queueserver.placement import shard_for
from queueserver.shard.shard import Shard
from wire import Wire, new_id

#: Seconds one wait may last before the test fails: a guard against a hang,
#: never a measure of speed (every wait ends on a condition).
WAIT = 10.0


def eventually(condition: Callable[[], object], what: str = "condition") -> None:
    """Yield to the servers' greenlets until ``condition()`` holds; fail after :data:`WAIT`.

    Only for state no event announces (a link coming up, a departed client
    counted out); answers are awaited on the sockets themselves.
    """
    with gevent.Timeout(WAIT, AssertionError(f"timed out waiting for {what}")):
        while not condition():
            gevent.sleep(0.001)


def names_by_shard(shards: int, prefix: str = "q") -> List[str]:
    """One fresh queue name per shard: ``names[i]`` lives on shard ``i``."""
    found: Dict[int, str] = {}
    for i in itertools.count():
        name = f"{prefix}-{new_id()[:8]}-{i}"
        found.setdefault(shard_for(name, shards), name)
        if len(found) == shards:
            return [found[i] for i in range(shards)]


# ------------------------------------------------------------------ leaks
def _live_greenlets() -> List[greenlet.greenlet]:
    return [o for o in gc.get_objects() if isinstance(o, greenlet.greenlet) and not o.dead]


def _open_fds() -> Dict[int, str]:
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass   # the directory listing's own descriptor, gone already
    return fds


def _spark_gateway_sockets() -> set:
    """Targets (``socket:[inode]``) of this process's TCP connections to a
    running Spark JVM: py4j opens them from its own threads whenever it
    likes (to release Java objects Python collected), so a Spark test that
    ran earlier in the same pytest process must not count as a leak here."""
    import sys
    context = getattr(sys.modules.get("pyspark"), "SparkContext", None)
    gateway = getattr(context, "_gateway", None) if context is not None else None
    if gateway is None:
        return set()
    port = gateway.gateway_parameters.port
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:   # the remote end is the JVM
                found.add(f"socket:[{fields[9]}]")
    return found


class Leaks:
    """What a test leaves behind in this process: greenlets still running,
    descriptors still open, watchers still started in the hub."""

    def __init__(self) -> None:
        hub = gevent.get_hub()   # the hub's own descriptors exist before the baseline
        gevent.sleep(0)
        gc.collect()
        self._greenlets = {id(g) for g in _live_greenlets()}
        self._fds = _open_fds()
        self._watchers = hub.loop.activecnt

    def _new_fds(self) -> Dict[int, str]:
        spark = _spark_gateway_sockets()
        return {fd: target for fd, target in _open_fds().items()
                if self._fds.get(fd) != target and "/fd" not in target and target not in spark}

    def check(self) -> None:
        new = [g for g in _live_greenlets() if id(g) not in self._greenlets]
        # Greenlets killed without blocking (ShardLink.stop) finish on their own.
        gevent.joinall([g for g in new if isinstance(g, gevent.Greenlet)], timeout=WAIT)
        gevent.sleep(0)   # the loop lets go of the last callback it ran (a kill's arguments)
        gc.collect()
        left = [g for g in _live_greenlets() if id(g) not in self._greenlets]
        for g in left:
            if isinstance(g, gevent.Greenlet):
                g.kill(block=False)
        fds = self._new_fds()
        deadline = time.monotonic() + WAIT
        while fds and time.monotonic() < deadline:
            gevent.sleep(0.05)   # a peer's close may still be on its way through the loop
            gc.collect()
            fds = self._new_fds()
        watchers = gevent.get_hub().loop.activecnt - self._watchers
        problems = []
        if left:
            problems.append(f"greenlets still running: {left}")
        if fds:
            problems.append(f"descriptors still open: {fds}")
        if watchers:
            problems.append(f"{watchers} more watchers started in the hub than before")
        assert not problems, "; ".join(problems)


@pytest.fixture
def leaks():
    """Fails the test (at teardown) if it left a greenlet, descriptor or watcher behind."""
    watch = Leaks()
    yield watch
    watch.check()


@pytest.fixture
def rundir():
    """A private directory short enough for Unix socket paths (108 bytes)."""
    path = tempfile.mkdtemp(prefix="qs-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------ shard
def _spawned_by(root: gevent.Greenlet) -> List[gevent.Greenlet]:
    """Live greenlets that ``root`` spawned, directly or not."""
    found = []
    for g in _live_greenlets():
        parent = g
        while isinstance(parent, gevent.Greenlet):
            ref = parent.spawning_greenlet
            parent = ref() if ref is not None else None
            if parent is root:
                found.append(g)
                break
    return found


def _close_sockets_bound_to(paths: Sequence[str]) -> None:
    """Close every gevent socket of this process bound to one of ``paths``
    (a shard's listeners live only in its greenlets' frames)."""
    for obj in gc.get_objects():
        if isinstance(obj, socket.socket) and obj.family == socket.AF_UNIX:
            try:
                bound = obj.getsockname()
            except OSError:
                continue   # closed already
            if bound in paths:
                obj.close()


def _close_hangup_watch(watch) -> None:
    """``HangupWatch.stop`` stops its watcher but leaves its epoll open
    until the object is collected, which a logged traceback can put off
    for the rest of the test."""
    watch.stop()
    watch._epoll.close()


def numbers_file(socket_path: str) -> str:
    """The file of job number blocks beside a shard's socket, as the supervisor puts it."""
    return os.path.join(os.path.dirname(socket_path), "numbers")


class ServedShard:
    """A real :class:`Shard` serving in this process, as ``queueserver.shard`` runs one."""

    def __init__(self, index: int, path: str, shards: int = 1, direct_path: bool = False,
                 alone: bool = False) -> None:
        """``alone``: one shard of ``shards`` served with none of the others
        (its id home answers at once rather than wait for their job lists)."""
        self.index, self.path, self.shards, self.direct_path = index, path, shards, direct_path
        self.alone = alone
        self.shard: Optional[Shard] = Shard(index, path, shards=shards, direct_path=direct_path,
                                            numbers=numbers_file(path))
        self.shard.homes.await_peers = not alone
        self.greenlet = gevent.spawn(self.shard.serve)
        eventually(lambda: os.path.exists(path), f"shard {index} to listen")

    def stop(self) -> None:
        """Go away as a dead shard process does: every socket of it closes at once.

        With no ``Shard.stop``, this kills the greenlets ``serve`` spawned
        (each channel's ``finally`` closes its socket and releases what its
        router held), stops the direct server's hang-up watcher and closes
        the listening sockets that only ``serve``'s frames reference.
        Connections served directly must be closed by their clients first.
        """
        if self.greenlet is None:
            return
        assert self.shard.direct.clients == 0, "a test left a direct connection open"
        self.greenlet.kill()
        gevent.killall(_spawned_by(self.greenlet))
        _close_hangup_watch(self.shard.direct.hangups)
        paths = (self.path, handoff_path(self.path))
        _close_sockets_bound_to(paths)
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
        self.greenlet = self.shard = None   # pytest's fixture values outlive the test


@pytest.fixture
def shard_factory(leaks, rundir):
    """``make(index=0, shards=1, direct_path=False)``: a served shard, stopped at teardown."""
    made: List[ServedShard] = []

    def make(index: int = 0, shards: int = 1, direct_path: bool = False) -> ServedShard:
        served = ServedShard(index, os.path.join(rundir, f"shard-{index}.sock"), shards, direct_path,
                             alone=True)
        made.append(served)
        return served

    yield make
    for served in made:
        served.stop()
    made.clear()   # ``make`` outlives the test in pytest's fixture values


# ------------------------------------------------------------------- link
class LinkClient:
    """A router's end of a shard's link, driven by the test: frames out,
    answers (by request id) and shard events (id 0) in."""

    def __init__(self, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        self.channel = FrameChannel(sock)
        self.events: Queue = Queue()           # (kind, body) of the shard's id-0 frames
        self.order: List[int] = []             # request ids in the order they were answered
        self.stray: List[list] = []            # answers to no request, or a second one
        self.eof = Event()                     # the shard closed the link
        self.hello: Any = None                 # the body of the shard's first frame, once read
        self._answers: Dict[int, AsyncResult] = {}
        self._ids = itertools.count(1)
        self._reader = gevent.spawn(self._read)

    def _read(self) -> None:
        try:
            self.channel.receive(self._frame)
        finally:
            self.eof.set()

    def _frame(self, frame: list) -> None:
        if frame[0] == 0:
            self.events.put((frame[1], frame[2]))
            return
        answer = self._answers.get(frame[0])
        if answer is None or answer.ready():
            self.stray.append(frame)
            return
        self.order.append(frame[0])
        answer.set(frame[1])

    def send(self, op: str, *args: Any) -> int:
        """Send one request; its id."""
        req_id = next(self._ids)
        self._answers[req_id] = AsyncResult()
        self.channel.send([req_id, op, list(args)])
        return req_id

    def reply(self, req_id: int) -> list:
        """The answer to request ``req_id`` (waits for it)."""
        return self._answers[req_id].get(timeout=WAIT)

    def answered(self, req_id: int) -> bool:
        return self._answers[req_id].ready()

    def call(self, op: str, *args: Any) -> list:
        return self.reply(self.send(op, *args))

    def notify(self, kind: str, body: Any) -> None:
        """A control frame (``cancel``, ``closed``, ``clients``, ``router``)."""
        self.channel.send([0, kind, body])

    def event(self) -> tuple:
        """The next shard event ``(kind, body)`` (waits for it)."""
        return self.events.get(timeout=WAIT)

    def events_so_far(self) -> List[tuple]:
        out = []
        while not self.events.empty():
            out.append(self.events.get())
        return out

    def close(self) -> None:
        self.channel.close()
        self._reader.join()


@pytest.fixture
def link_factory(leaks):
    """``connect(served_shard)``: a :class:`LinkClient` whose ``hello`` is the
    body of the shard's greeting, closed at teardown."""
    made: List[LinkClient] = []

    def connect(served: ServedShard) -> LinkClient:
        client = LinkClient(served.path)
        made.append(client)
        kind, client.hello = client.event()
        assert kind == "hello"
        return client

    yield connect
    for client in made:
        client.close()
    made.clear()


# ----------------------------------------------------------------- router
def tcp_connect(port: int) -> socket.socket:
    """A cooperative client socket to the loopback port (no name lookup, so
    no resolver thread)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(WAIT)   # a reply that never comes fails the test, not the session
    sock.connect(("127.0.0.1", port))
    return sock


class Cluster:
    """``shards`` real shards and one real router, served in this process,
    with a loopback TCP listener per protocol (bound to port 0)."""

    def __init__(self, rundir: str, shards: int = 2, direct_path: bool = False,
                 shard_direct_path: Optional[bool] = None, protocols: Sequence[str] = ("workq",)) -> None:
        if shard_direct_path is None:
            shard_direct_path = direct_path
        self.paths = [os.path.join(rundir, f"shard-{i}.sock") for i in range(shards)]
        self.shards = [ServedShard(i, path, shards, shard_direct_path) for i, path in enumerate(self.paths)]
        # What queueserver.router's main does with the supervisor's config.
        self.router = Router(self.paths, direct_path=direct_path, numbers=numbers_file(self.paths[0]))
        handoffs = direct_path and shard_direct_path
        eventually(lambda: all(link.up and (link.handoff is not None or not handoffs)
                               for link in self.router.links), "the router's links to come up")
        self.ports: Dict[str, int] = {}
        for protocol in protocols:
            listener = stdsocket.socket(stdsocket.AF_INET, stdsocket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            self.ports[protocol] = listener.getsockname()[1]
            self.router.listen(protocol, listener.detach())   # the router owns it now
        self._clients: List[Any] = []

    def connect(self, protocol: str = "workq") -> socket.socket:
        sock = tcp_connect(self.ports[protocol])
        self._clients.append(sock)
        return sock

    def wire(self) -> Wire:
        return Wire(self.connect("workq"))

    def link(self, shard: int) -> LinkClient:
        """A second channel to a shard (as another router's), to look at it from outside."""
        client = LinkClient(self.paths[shard])
        self._clients.append(client)
        assert client.event()[0] == "hello"
        return client

    def restart_shard(self, index: int) -> ServedShard:
        old = self.shards[index]
        old.stop()
        self.shards[index] = ServedShard(index, old.path, old.shards, old.direct_path)
        return self.shards[index]

    def stop(self) -> None:
        router = self.router
        for client in self._clients:
            client.close()
        eventually(lambda: router.clients == 0, "the router to count every client out")
        router.stop()
        # What the end of the router's process would close (Router.stop does not).
        for listener, _ in router.servers.values():
            listener.close()
        if router._spare is not None:
            os.close(router._spare)
            router._spare = None
        _close_hangup_watch(router.hangups)
        for served in self.shards:
            served.stop()
        self.router = None
        self.shards = []


@pytest.fixture
def cluster_factory(leaks, rundir):
    """``make(**Cluster options)``: a :class:`Cluster`, stopped at teardown."""
    made: List[Cluster] = []

    def make(**options: Any) -> Cluster:
        made.append(Cluster(rundir, **options))
        return made[-1]

    yield make
    for cluster in made:
        cluster.stop()
    made.clear()
