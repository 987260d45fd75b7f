"""A follower's snapshot, written by a child the primary forks: the follower
ends exactly at the primary's state, and a snapshot cut short (its follower
gone, its writer killed) leaves nothing behind and is taken again (real
nodes on 127.0.0.1 and .2; where the primary's side is what is shown, the
test also dials the link port as a follower does, as node "t")."""
from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import msgpack
import psutil

from cluster_nodes import Nodes
from queueserver.client import Client
from queueserver.cluster.clusterfile import load_cluster
from queueserver.cluster.clusterfile import MAX_SHARDS
from queueserver.engine import Engine
from queueserver.net import linkauth
from queueserver.store import recover
from serverproc import wait_for
from test_replication import name_on, replicated_nodes, wait_in_sync

#: jobs the primary holds before its follower comes
PRELOAD = 30_000


def preload(address: Tuple[str, int], queues: List[str], payload: int = 100) -> Set[str]:
    """``PRELOAD`` jobs in every state: ready, scheduled (tomorrow), leased,
    and finished with a result (kept: TTL 10 min). Their ids."""
    ids: Set[str] = set()
    tomorrow = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    with Client(*address, timeout=60) as client:
        for start in range(0, PRELOAD - 1000, 1000):
            queue = queues[(start // 1000) % len(queues)]
            adds = client.pipeline()
            for i in range(start, start + 1000):
                id = str(uuid.uuid4())
                adds.add(id, queue, (b"%d " % i).ljust(payload, b"p"), 600_000, 600_000)
                ids.add(id)
            assert adds.execute() == [None] * 1000
            done = client.pipeline()
            for i in range(40):   # leased; half of them finished, with a result
                job = client.lease(queue, 5000)
                if i % 2:
                    done.complete(job.id, b"result of " + job.id.encode())
            assert done.execute() == [None] * 20
        for _ in range(PRELOAD - len(ids)):
            id = str(uuid.uuid4())
            client.schedule(id, queues[0], b"later", 600_000, 600_000, tomorrow)
            ids.add(id)
    return ids


def states(directory: Path, ordinal: int) -> Dict[str, Tuple[Any, ...]]:
    """Each job of shard ``ordinal``'s log, read back as a restart reads it:
    what it is (state, attempts, result, payload)."""
    engine = Engine(shard=ordinal, shards=MAX_SHARDS)
    engine.replay(recover(str(directory), ordinal, MAX_SHARDS))
    return {id: (job.state, job.attempts, job.result if job.finished else None, bytes(job.payload))
            for id, job in engine.jobs.items()}


class Churn(threading.Thread):
    """A client adding and completing jobs on shard 0 until stopped; what it was told."""

    def __init__(self, address: Tuple[str, int], queue: str) -> None:
        super().__init__(daemon=True)
        self.address, self.queue = address, queue
        self.added: Set[str] = set()
        self.completed: Set[str] = set()
        self.stop = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            with Client(*self.address, timeout=60) as client:
                while not self.stop.is_set():
                    id = str(uuid.uuid4())
                    client.add(id, self.queue, b"churn", 600_000, 600_000)
                    self.added.add(id)
                    if len(self.added) % 3 == 0:
                        job = client.lease(self.queue, 5000)
                        client.complete(job.id, b"churned")
                        self.completed.add(job.id)
        except BaseException as err:   # the test fails on it
            self.error = err


class LinkFollower:
    """The test on a primary's link port as the follower on node "t": HMAC
    handshake, then "replicate" (the nodes' own followers go on beside it)."""

    def __init__(self, nodes: Nodes, ordinal: int = 0) -> None:
        shard = load_cluster(str(nodes.file)).shards()[ordinal]
        sock = socket.create_connection((shard.host, shard.port), timeout=30)
        self.sock = linkauth.connect_link(sock, linkauth.load_secret(str(nodes.secret)))
        self.sock.settimeout(60)
        self.unpacker = msgpack.Unpacker(raw=False)
        self.send([0, "replicate", ["t"]])

    def send(self, frame: Any) -> None:
        self.sock.sendall(msgpack.packb(frame, use_bin_type=True))

    def frames(self) -> Iterator[Any]:
        """The stream's frames, until the primary closes it."""
        while True:
            yield from self.unpacker
            data = self.sock.recv(1 << 16)
            if not data:
                return
            self.unpacker.feed(data)

    def snapshot(self) -> Tuple[int, List[Any]]:
        """A whole snapshot: its position and its events."""
        events: List[Any] = []
        for frame in self.frames():
            if frame[1] == "snap":
                events += frame[2][1]
                if frame[2][2]:
                    return frame[2][0], events
        raise AssertionError("the stream ended before its snapshot did")

    def close(self) -> None:
        self.sock.close()


def busy_primary(tmp_path: Path, payload: int = 100, settings: str = "") -> Tuple[Nodes, Set[str]]:
    """Nodes a and b (replicas = 1), a's shard holding ``PRELOAD`` jobs;
    ``settings``: lines put at the top of the cluster file."""
    nodes = replicated_nodes(tmp_path)
    nodes.file.write_text(settings + nodes.file.read_text())
    nodes.start()
    wait_in_sync(nodes)
    ids = preload(nodes.address("a"), [name_on(0) for _ in range(4)], payload)
    return nodes, ids


def shard_process(nodes: Nodes) -> psutil.Process:
    """Node a's shard (the one whose children are its snapshot writers)."""
    found = [p for p in psutil.Process(nodes.procs["a"].process.pid).children()
             if p.cmdline()[1:3] == ["-m", "queueserver.shard"]]
    assert len(found) == 1, found
    return found[0]


def writer_pid(nodes: Nodes, attached: int) -> int:
    """The pid of the snapshot writer of the test's ``attached``-th stream from a's shard."""
    pattern = re.compile(r"follower on node t attached at position \d+; process (\d+) writes it")
    wait_for(lambda: len(pattern.findall(nodes.log("a"))) >= attached, 30, "a follower to attach")
    return int(pattern.findall(nodes.log("a"))[attached - 1])


def no_writer_left(nodes: Nodes) -> None:
    wait_for(lambda: not shard_process(nodes).children(), 30, "the snapshot writer to be gone")
    strays = [str(p) for p in Path(nodes.root / "data-a").rglob("*") if p.name.endswith(".tmp")]
    assert not strays, strays


def test_a_follower_joining_a_busy_primary_ends_at_its_state(tmp_path: Path) -> None:
    nodes, ids = busy_primary(tmp_path)
    with nodes:
        churn = Churn(nodes.address("a"), name_on(0))
        churn.start()
        wait_for(lambda: len(churn.added) > 50 or churn.error, 30, "the churning client to start")
        os.kill(nodes.follower_pid(0), signal.SIGKILL)   # its supervisor starts it again, empty
        wait_for(lambda: nodes.log("a").count("is in sync at position") >= 2 or churn.error, 90,
                 "the new follower to be in sync")
        added = len(churn.added)
        wait_for(lambda: len(churn.added) > added + 50 or churn.error, 30, "more churn, in sync")
        churn.stop.set()
        churn.join()
        assert churn.error is None, churn.error
        sent = re.findall(r"follower on node b was sent the live state \((\d+) events", nodes.log("a"))
        assert int(sent[-1]) >= PRELOAD, "the new follower did not start from the whole state"
        # Everything logged is acknowledged by the follower (lag 0), then both hosts are lost.
        wait_for(lambda: [f["lag"] for row in nodes.status() if row["shard"] == "a/0"
                          for f in row["followers"]] == [0], 30, "the follower to hold every event")
        nodes.kill("a")
        nodes.kill("b")
    primary = states(tmp_path / "data-a" / "shard-0", 0)
    copy = states(tmp_path / "data-b" / "replicas" / "0", 0)
    acknowledged = ids | churn.added
    assert set(copy) == acknowledged, (f"{len(acknowledged - set(copy))} acknowledged jobs missing, "
                                       f"{len(set(copy) - acknowledged)} unknown ones")
    assert copy == primary
    finished = {id for id, state in copy.items() if state[2] is not None}
    assert churn.completed <= finished and len(finished) > len(churn.completed)


def test_a_follower_gone_mid_snapshot_leaves_no_writer_and_no_file(tmp_path: Path) -> None:
    # 30 MB of state: more than the pipe, the link's queue and both sockets' buffers hold,
    # so the writer is still writing while the follower reads nothing.
    nodes, _ = busy_primary(tmp_path, payload=1000)
    with nodes:
        follower = LinkFollower(nodes)
        writer = psutil.Process(writer_pid(nodes, 1))
        assert writer.ppid() == shard_process(nodes).pid and writer.status() != psutil.STATUS_ZOMBIE
        follower.close()
        wait_for(lambda: "follower on node t stopped catching up (its link closed)" in nodes.log("a"),
                 30, "the primary to see the follower gone")
        no_writer_left(nodes)
        with Client(*nodes.address("a")) as client:   # and the shard serves on
            client.add(str(uuid.uuid4()), name_on(0), b"after", 60_000, 600_000)


def test_a_follower_stuck_in_its_snapshot_starts_over_past_the_backlog(tmp_path: Path) -> None:
    """While a follower takes its snapshot, the events logged meanwhile wait
    for it in the primary's memory: past ``replica_backlog`` of them its
    stream ends (it would start over) and the memory is freed; the follower
    in sync (node b's) goes on unharmed."""
    nodes, _ = busy_primary(tmp_path, payload=1000, settings="replica_backlog = 50\n")
    with nodes:
        follower = LinkFollower(nodes)   # reads nothing: its snapshot stalls
        writer_pid(nodes, 1)
        with Client(*nodes.address("a")) as client:
            for _ in range(60):
                client.add(str(uuid.uuid4()), name_on(0), b"meanwhile", 60_000, 600_000)
        wait_for(lambda: "follower on node t stopped catching up (more than 50 events logged while "
                         "it took its snapshot: the cluster file's replica_backlog; it starts over)"
                 in nodes.log("a"), 30, "the stuck follower to be dropped")
        assert not [f for f in follower.frames() if f[1] == "snap" and f[2][2]]   # its stream ended
        follower.close()
        no_writer_left(nodes)
        assert "WARNING" in [line for line in nodes.log("a").splitlines() if "starts over" in line][0]
        assert "left the in-sync set" not in nodes.log("a")   # node b's follower stayed in sync
        with Client(*nodes.address("a")) as client:
            client.add(str(uuid.uuid4()), name_on(0), b"after", 60_000, 600_000)


def test_a_killed_snapshot_writer_is_followed_by_a_whole_snapshot(tmp_path: Path) -> None:
    nodes, ids = busy_primary(tmp_path, payload=1000)
    with nodes:
        follower = LinkFollower(nodes)
        os.kill(writer_pid(nodes, 1), signal.SIGKILL)
        # The primary closes that stream, its snapshot never complete.
        assert not [f for f in follower.frames() if f[1] == "snap" and f[2][2]]
        follower.close()
        assert re.search(r"the snapshot for the follower on node t failed: the snapshot writer "
                         r"\(pid \d+\) was killed by signal 9", nodes.log("a"))
        no_writer_left(nodes)
        # The follower dials again (as follower.py does): a whole snapshot, then it is in sync.
        again = LinkFollower(nodes)
        base, events = again.snapshot()
        assert {event[1] for event in events if event[0] == "job"} == ids
        again.send([0, "ack", base])
        wait_for(lambda: "follower on node t is in sync at position" in nodes.log("a"), 30,
                 "the follower to be in sync")
        again.close()
        no_writer_left(nodes)


def live_state(ids: List[str]) -> List[Any]:
    """The snapshot events of an engine holding jobs ``ids``, as a frame carries them."""
    engine = Engine(shard=0, shards=MAX_SHARDS)
    engine.replay([("add", id, 0, "q", b"x", 0, 60_000, 600_000, 0, 0, 1, None, False) for id in ids])
    return [list(event) for event in engine.snapshot()]


def test_a_snapshot_cut_short_is_never_part_of_the_next(tmp_path: Path) -> None:
    """A stream that ends after some parts of its snapshot (its writer
    killed): the next stream's snapshot starts afresh, and the copy
    switched in holds that one only."""
    from queueserver.cluster.clusterfile import ShardSpec
    from queueserver.shard.follower import Copy
    copy = Copy(str(tmp_path / "copy"), ShardSpec(0, "a", 0, "127.0.0.1", 1), "always", 64 << 20)
    old, new = [str(uuid.uuid4()) for _ in range(3)], [str(uuid.uuid4())]
    try:
        assert not copy.snapshot_part(5, live_state(old), False, 1)
        copy.abandon_snapshot()   # the stream ended there
        assert copy.snapshot_part(9, live_state(new), True, 1)
        assert copy.engine is not None and set(copy.engine.jobs) == set(new)
    finally:
        copy.close()
    assert set(states(tmp_path / "copy", 0)) == set(new)


def test_a_snapshot_writer_dies_with_its_shard(tmp_path: Path) -> None:
    """A shard SIGKILLed mid-snapshot leaves no writer behind (the kernel
    kills it, PR_SET_PDEATHSIG; blocked on its pipe, it would also see the
    pipe broken)."""
    nodes, _ = busy_primary(tmp_path, payload=1000)
    with nodes:
        follower = LinkFollower(nodes)   # reads nothing: the writer stays blocked on its pipe
        writer = psutil.Process(writer_pid(nodes, 1))
        shard = shard_process(nodes)
        assert writer.ppid() == shard.pid
        shard.kill()   # SIGKILL the shard alone (its supervisor starts it again)
        wait_for(lambda: not writer.is_running() or writer.status() == psutil.STATUS_ZOMBIE, 30,
                 "the orphaned snapshot writer to be killed")
        follower.close()
