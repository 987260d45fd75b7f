"""Routers follow etcd's cluster state at once, through their supervisor's
watch: a failover's new primary, a slot map written to etcd, across an etcd
restart, and never back to older news (real nodes on 127.0.0.1-3, a real etcd)."""
from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Tuple

from cluster_nodes import Nodes, ensure_loopback_aliases
from etcd_server import EtcdServer, etcd  # noqa: F401 (the fixture)
from queueserver.client import Client
from queueserver.client.client import WorkqError
from queueserver.cluster import slotstore
from queueserver.cluster.clusterfile import load_cluster
from queueserver.cluster.coordination import Etcd, compare_and_put, read_with_revision
from queueserver.placement import slot_of
from queueserver.metrics.control import ask
from serverproc import wait_for
from test_failover import ids_on, in_sync, names_on, replicated
from wire import Wire, add


def control(nodes: Nodes, name: str) -> str:
    """Node ``name``'s router's control socket."""
    return os.path.join(str(nodes.procs[name].runtime_dir), "router-0.ctl")


def router_state(nodes: Nodes, name: str) -> Dict[str, Any]:
    """What node ``name``'s router holds, as its control socket answers."""
    return ask(control(nodes, name), ["cluster", "state"], 5.0)


def owner(state: Dict[str, Any], slot: int) -> Tuple[int, int]:
    """(shard, epoch) of ``slot`` in a router's map."""
    return next((o, e) for start, end, o, e in state["slots"] if start <= slot < end)


def on_etcd(tmp_path: Path, etcd: EtcdServer) -> Nodes:
    """Nodes a and b, one shard each (ordinals 0 and 1), on etcd, no replicas."""
    ensure_loopback_aliases()
    nodes = Nodes(tmp_path, shards=(1, 1), protocols=["workq"])
    with open(nodes.file, "a") as f:
        f.write(f'[etcd]\nendpoints = ["{etcd.endpoint}"]\nprefix = "/qs-{uuid.uuid4().hex[:6]}"\n')
    return nodes


def client_of(nodes: Nodes) -> Etcd:
    spec = load_cluster(str(nodes.file)).etcd
    assert spec is not None
    return Etcd(spec)


def told(nodes: Nodes, names: List[str]) -> None:
    """Until every router named was told etcd's state once."""
    for name in names:
        wait_for(lambda: router_state(nodes, name)["etcd_views"] >= 1, 20, f"node {name}'s router to be told")


def sees(nodes: Nodes, names: List[str], slot: int, want: Tuple[int, int]) -> None:
    for name in names:
        wait_for(lambda: owner(router_state(nodes, name), slot) == want, 20,
                 lambda: f"node {name}'s router to map slot {slot} to {want}: {owner(router_state(nodes, name), slot)}")


def test_a_failover_reaches_routers_from_etcd_not_by_probing(tmp_path: Path, etcd: EtcdServer) -> None:
    with replicated(tmp_path, etcd, replicas=1) as nodes:
        nodes.start()
        in_sync(nodes, nodes.names, 3)
        told(nodes, ["c"])
        queue = names_on(0, 1)[0]   # shard a/0, followed by node b
        with Client(*nodes.address("c")) as c:
            c.add(str(uuid.uuid4()), queue, b"before", 60_000, 600_000)
        nodes.kill("a")
        killed = time.monotonic()
        with Client(*nodes.address("c"), timeout=5) as c:
            served = False
            while not served and time.monotonic() - killed < 30:
                try:
                    c.add(str(uuid.uuid4()), queue, b"after", 60_000, 600_000)
                    served = True
                except (WorkqError, OSError):
                    time.sleep(0.1)
            assert served, f"shard 0's queue was not served again through c:\n{nodes.log('c')[-3000:]}"
            assert {c.lease([queue], 1000).payload for _ in range(2)} == {b"before", b"after"}
        spec = load_cluster(str(nodes.file))
        b_place = "%s:%d" % spec.address("b", 0)
        told_line = "shard 0's primary is now b (epoch 2), told by etcd: linking to " + b_place
        assert told_line in nodes.log("c")
        # c's own shard (an id-home peer of shard 0) was told too: its link went there at once.
        wait_for(lambda: any(told_line in line and " shard-0 " in line for line in nodes.log("c").splitlines()),
                 20, "node c's shard to be told of shard 0's new primary")
        state = router_state(nodes, "c")
        assert state["etcd_primary_switches"] == 1
        index, first, current, up, epoch = state["links"][0]
        assert (first, current, up, epoch) == (b_place, b_place, True, 2)
        # A primary older than one etcd named is not followed back.
        stale = ["cluster", "view", None, [[0, 1, "a", False]]]
        assert ask(control(nodes, "c"), stale) == {"taken": True}
        state = router_state(nodes, "c")
        assert state["links"][0][1:] == [b_place, b_place, True, 2] and state["etcd_primary_switches"] == 1
        # A shard checks a view as a router does, and takes the same stale one as nothing.
        shard = os.path.join(str(nodes.procs["c"].runtime_dir), "shard-0.ctl")
        assert ask(shard, stale) == {"taken": True}
        refused = ask(shard, ["cluster", "view", None, [[0, "two", "b", False]]])
        assert refused["status"] == 400 and "is not [ordinal, epoch, node, copy]" in refused["error"]
        assert nodes.log("c").count(told_line) == 2   # the router's line and the shard's, once each


def test_a_slot_map_written_to_etcd_reaches_routers_and_older_news_never_undoes_newer(
        tmp_path: Path, etcd: EtcdServer) -> None:
    with on_etcd(tmp_path, etcd) as nodes:
        nodes.start()
        told(nodes, nodes.names)
        store = client_of(nodes)
        try:
            assert owner(router_state(nodes, "a"), 50)[0] == 0
            # slots 0-99 to shard 1 (not the truth: shard 0 serves them), newer than anything
            slotstore.record(store, [[0, 100]], 1, 1000, [0, 1])
            sees(nodes, nodes.names, 50, (1, 1000))
            assert router_state(nodes, "a")["etcd_slots_changed"] == 100
            # an older map: 0-99 back to shard 0 (epoch 500), and 200-299 to shard 1 (600)
            stale = slotstore.SlotTable.founded([0, 1])
            stale.set([[0, 100]], 0, 500)
            stale.set([[200, 300]], 1, 600)
            _, revision = read_with_revision(store, slotstore.key(store))
            assert compare_and_put(store, slotstore.key(store), revision, stale.encode())
            sees(nodes, nodes.names, 250, (1, 600))   # the newer part is taken...
            for name in nodes.names:                  # ...the older one is not
                assert owner(router_state(nodes, name), 50) == (1, 1000)
        finally:
            store.close()
        refused = ask(control(nodes, "a"), ["cluster", "view", [[0, 99999, 1, 5]], []])
        assert refused["error"] == ("cluster view refused: slot map run [0, 99999, 1, 5] is not "
                                    "[start, end, ordinal, epoch] within 16384 slots")
        # The shards stay the truth: a queue of slot 0-99 is sent to shard 1,
        # which answers MOVED; the router asks every shard and is served by 0.
        queue = next(name for name in (f"q-{i}" for i in range(100_000)) if slot_of(name) < 100)
        with Client(*nodes.address("a")) as client:
            client.add(str(uuid.uuid4()), queue, b"served", 60_000, 600_000)
            assert client.lease([queue], 1000).payload == b"served"
        assert owner(router_state(nodes, "a"), slot_of(queue))[0] == 0


def test_the_watch_comes_back_after_an_etcd_restart(tmp_path: Path, etcd: EtcdServer) -> None:
    with on_etcd(tmp_path, etcd) as nodes:
        nodes.start()
        told(nodes, nodes.names)
        etcd.kill()
        wait_for(lambda: "etcd watch lost" in nodes.log("a"), 20, "node a to see its etcd watch lost")
        etcd.start()
        wait_for(lambda: "etcd watch back" in nodes.log("a"), 20, "node a to see its etcd watch back")
        store = client_of(nodes)
        try:
            slotstore.record(store, [[8192, 8200]], 0, 7, [0, 1])
        finally:
            store.close()
        sees(nodes, nodes.names, 8195, (0, 7))
        assert nodes.log("a").count("etcd watch lost") == 1


def test_a_node_gone_without_a_word_holds_no_request_once_its_lease_lapses(
        tmp_path: Path, etcd: EtcdServer) -> None:
    """Issue 26 (6), a home known to be down from etcd: node a is stopped
    (SIGSTOP: a host gone without a reset, so b's links to it stay up and
    nothing on them is answered). Once a's lease lapses, b drops its links
    to a's shard: the add b's router sent to a's queue is answered that its
    outcome is unknown, the next one 'Shard 0 unavailable' at once, and an
    add to b's queue whose id is at home on a's shard (its claim sent, never
    answered) goes on. Before, both waited for as long as TCP kept the links."""
    with on_etcd(tmp_path, etcd) as nodes:
        nodes.start()
        told(nodes, nodes.names)
        ours, theirs = names_on(1, 1, founders=2)[0], names_on(0, 1, founders=2)[0]
        id = ids_on(0, 1, founders=2)[0]
        proc = nodes.procs["a"]
        assert proc.process is not None
        pids = [proc.process.pid, *proc.child_pids().values()]
        wire = Wire(socket.create_connection(nodes.address("b"), timeout=10))
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            wire.send(add(str(uuid.uuid4()), theirs))
            with Client(*nodes.address("b"), timeout=10) as b:
                b.add(id, ours, b"mine", 60_000, 600_000)
                took = time.monotonic() - stopped
            assert wire.reply() == b"-SERVER-ERROR Outcome unknown: shard 0 went down before answering\r\n"
            assert wire.call(add(str(uuid.uuid4()), theirs)) == b"-SERVER-ERROR Shard 0 unavailable\r\n"
            print(f"answered {took:.2f} s after node a stopped (lease_ttl 3 s)")
            assert took < 6, took
            assert "node a holds no etcd lease any more: dropping the link to shard 0" in nodes.log("b")
        finally:
            wire.close()
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
