"""Failover on etcd: a replicated shard's primary node killed with SIGKILL,
an in-sync follower promoted, routers sending its queues there, and no
acknowledged job lost (real nodes on 127.0.0.1-3, a real etcd)."""
from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import List, Set

from cluster_nodes import Nodes, ensure_loopback_aliases
from etcd_server import EtcdServer, etcd  # noqa: F401 (the fixture)
from queueserver.client import Client
from queueserver.client.client import WorkqError
from queueserver.cluster.slots import initial_owners, slot_of
from serverproc import wait_for


def names_on(ordinal: int, count: int, founders: int = 3) -> List[str]:
    owners, names = initial_owners(founders), []
    while len(names) < count:
        name = f"f-{uuid.uuid4().hex[:8]}"
        if owners[slot_of(name)] == ordinal:
            names.append(name)
    return names


def replicated(tmp_path: Path, etcd: EtcdServer, ttl: int = 3) -> Nodes:
    ensure_loopback_aliases()
    nodes = Nodes(tmp_path, shards=(1, 1, 1), protocols=["workq"])
    nodes.file.write_text("replicas = 1\n" + nodes.file.read_text()
                          + f'[etcd]\nendpoints = ["{etcd.endpoint}"]\nprefix = "/qs-{uuid.uuid4().hex[:6]}"\n'
                            f"lease_ttl = {ttl}\n")
    return nodes


def in_sync(nodes: Nodes, running: List[str], count: int) -> None:
    wait_for(lambda: sum(nodes.log(n).count("is in sync at position") for n in running) >= count,
             30, f"{count} followers in sync")


def drain(client: Client, names: List[str]) -> Set[str]:
    """Every job left in ``names``, leased and completed."""
    seen: Set[str] = set()
    for name in names:
        while True:
            try:
                job = client.lease([name], 200)
            except WorkqError:   # TIMEOUT: the queue is empty
                break
            seen.add(job.id)
            client.complete(job.id)
    return seen


def test_a_killed_primary_is_replaced_by_its_follower_with_no_acknowledged_job_lost(
        tmp_path: Path, etcd: EtcdServer) -> None:
    with replicated(tmp_path, etcd) as nodes:
        nodes.start()
        in_sync(nodes, nodes.names, 3)
        queues = names_on(0, 4)   # shard a/0, followed by node b
        acked: Set[str] = set()
        with Client(*nodes.address("c")) as c:
            for i in range(120):
                id = str(uuid.uuid4())
                c.add(id, queues[i % 4], f"job {i}".encode(), 60_000, 600_000)
                acked.add(id)
        nodes.kill("a")
        killed = time.monotonic()
        taken_over = None
        with Client(*nodes.address("c"), timeout=5) as c:
            while time.monotonic() - killed < 30:
                try:
                    c.add(str(uuid.uuid4()), queues[0], b"probe", 60_000, 600_000)
                    taken_over = time.monotonic() - killed
                    break
                except (WorkqError, OSError):
                    time.sleep(0.1)
            assert taken_over is not None, "shard a/0's queues were not served again within 30 s"
            assert "is its primary now" in nodes.log("b")
            seen = drain(c, queues)
        lost = acked - seen
        assert not lost, f"{len(lost)} acknowledged jobs lost"
        print(f"failover in {taken_over:.1f} s")
        assert taken_over < 10
