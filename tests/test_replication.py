"""Replicas: each shard's followers on other nodes keep its log, and an
answer waits for every in-sync follower (real nodes on 127.0.0.1 and .2,
real processes killed with SIGKILL, logs read back as a restart would)."""
from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Dict, Set

from cluster_nodes import Nodes, ensure_loopback_aliases
from queueserver.client import Client
from queueserver.cluster.clusterfile import MAX_SHARDS
from queueserver.placement import initial_owners, slot_of
from queueserver.engine import Engine
from queueserver.store import recover
from serverproc import wait_for


def name_on(ordinal: int, founders: int = 2) -> str:
    owners = initial_owners(founders)
    while True:
        name = f"r-{uuid.uuid4().hex[:8]}"
        if owners[slot_of(name)] == ordinal:
            return name


def replicated_nodes(tmp_path: Path) -> Nodes:
    ensure_loopback_aliases()
    nodes = Nodes(tmp_path, shards=(1, 1), protocols=["workq"])
    nodes.file.write_text("replicas = 1\n" + nodes.file.read_text())
    return nodes


def wait_in_sync(nodes: Nodes, count: int = 2) -> None:
    wait_for(lambda: sum(nodes.log(n).count("is in sync at position") for n in nodes.names) >= count,
             30, "every shard's follower to be in sync")


def jobs_in(directory: Path, ordinal: int) -> Set[str]:
    """The job ids shard ``ordinal``'s log holds, read back as a restart reads it."""
    engine = Engine(shard=ordinal, shards=MAX_SHARDS)
    engine.replay(recover(str(directory), ordinal, MAX_SHARDS))
    return set(engine.jobs)


def test_every_acknowledged_job_is_on_another_node_when_a_host_is_lost(tmp_path: Path) -> None:
    with replicated_nodes(tmp_path) as nodes:
        nodes.start()
        wait_in_sync(nodes)
        acked: Dict[str, str] = {}
        with Client(*nodes.address("a")) as a, Client(*nodes.address("b")) as b:
            for i in range(200):
                name = name_on(i % 2)
                id = str(uuid.uuid4())
                (a if i % 3 else b).add(id, name, f"payload {i}".encode(), 60_000, 600_000)
                acked[id] = name
        # Host a is lost, disk and all; then b stops too (kill -9 both).
        nodes.kill("a")
        nodes.kill("b")
        on_b = jobs_in(tmp_path / "data-b" / "shard-0", 1) | jobs_in(tmp_path / "data-b" / "replicas" / "0", 0)
        assert set(acked) <= on_b, f"{len(set(acked) - on_b)} acknowledged jobs are only on host a"
        on_a_shard = jobs_in(tmp_path / "data-a" / "shard-0", 0)
        assert on_a_shard and on_a_shard <= jobs_in(tmp_path / "data-b" / "replicas" / "0", 0)
        # and a's copy of b's shard holds b's jobs
        on_b_shard = jobs_in(tmp_path / "data-b" / "shard-0", 1)
        assert on_b_shard and on_b_shard <= jobs_in(tmp_path / "data-a" / "replicas" / "1", 1)


def test_an_answer_waits_for_the_in_sync_follower_until_it_drops_out(tmp_path: Path) -> None:
    with replicated_nodes(tmp_path) as nodes:
        nodes.start()
        wait_in_sync(nodes)
        stuck = nodes.follower_pid(0)   # b's copy of a's shard
        os.kill(stuck, signal.SIGSTOP)
        try:
            with Client(*nodes.address("a")) as a:
                started = time.monotonic()
                a.add(str(uuid.uuid4()), name_on(0), b"x", 60_000, 600_000)
                waited = time.monotonic() - started
                assert waited >= 1.5, f"answered in {waited:.2f} s, before the follower held it"
                assert "left the in-sync set" in nodes.log("a")
                started = time.monotonic()
                a.add(str(uuid.uuid4()), name_on(0), b"y", 60_000, 600_000)
                assert time.monotonic() - started < 1.5   # out of the set: no longer waited for
        finally:
            os.kill(stuck, signal.SIGCONT)
        # It dials again, takes the live state and is in sync once more.
        wait_in_sync(nodes, 3)
        wait_for(lambda: all(row["followers"] and row["followers"][0]["state"] == "in-sync"
                             for row in nodes.status()), 15, "cluster status to show both followers in sync")
        rows = {row["shard"]: row for row in nodes.status()}
        assert [(f["node"], f["state"]) for f in rows["a/0"]["followers"]] == [("b", "in-sync")]
        assert [(f["node"], f["state"]) for f in rows["b/0"]["followers"]] == [("a", "in-sync")]
        assert rows["a/0"]["followers"][0]["lag"] >= 0
        assert "follower on b: in-sync" in nodes.cli("status").stdout


def test_a_follower_restarted_takes_the_live_state_again(tmp_path: Path) -> None:
    with replicated_nodes(tmp_path) as nodes:
        nodes.start()
        wait_in_sync(nodes)
        with Client(*nodes.address("a")) as a:
            ids = [str(uuid.uuid4()) for _ in range(20)]
            for id in ids:
                a.add(id, name_on(0), b"z", 60_000, 600_000)
            os.kill(nodes.follower_pid(0), signal.SIGKILL)   # the supervisor starts it again
            wait_in_sync(nodes, 3)
            later = str(uuid.uuid4())
            a.add(later, name_on(0), b"after", 60_000, 600_000)
        nodes.kill("a")
        nodes.kill("b")
        assert set(ids) | {later} <= jobs_in(tmp_path / "data-b" / "replicas" / "0", 0)


def _file(tmp_path: Path, head: str, nodes: int = 3, removed: Set[str] = frozenset()) -> Path:
    (tmp_path / "s").write_bytes(b"x" * 32)
    (tmp_path / "s").chmod(0o600)
    lines = [head, 'secret_file = "s"']
    for i in range(nodes):
        name = "abcde"[i]
        lines += ["[[node]]", f'name = "{name}"', f'host = "127.0.0.{i + 1}"', "link_port = 7400",
                  "shards = 2"] + (["removed = true"] if name in removed else [])
    path = tmp_path / "cluster.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_followers_are_the_next_nodes_of_the_file(tmp_path: Path) -> None:
    from queueserver.cluster.clusterfile import load_cluster
    spec = load_cluster(str(_file(tmp_path, "replicas = 1")))
    assert [spec.followers_of(o) for o in range(6)] == [["b"], ["b"], ["c"], ["c"], ["a"], ["a"]]
    spec = load_cluster(str(_file(tmp_path, "replicas = 2")))
    assert spec.followers_of(0) == ["b", "c"] and spec.followers_of(5) == ["a", "b"]
    spec = load_cluster(str(_file(tmp_path, "replicas = 1", nodes=4, removed={"b"})))
    assert spec.followers_of(0) == ["c"] and spec.followers_of(7) == ["a"]
    assert load_cluster(str(_file(tmp_path, ""))).replicas == 0


def test_replicas_must_fit_the_nodes(tmp_path: Path) -> None:
    import pytest
    from queueserver.cluster.clusterfile import ClusterError, load_cluster
    for head, message in [("replicas = 3", "replicas must be 0, 1 or 2"),
                          ("replicas = true", "replicas must be 0, 1 or 2"),
                          ("replicas = 2", "needs at least 3 nodes"),
                          ("replicas = 1\nreplica_backlog = 0", "replica_backlog must be a number of events"),
                          ("replicas = 1\nreplica_backlog = \"lots\"", "replica_backlog must be a number")]:
        with pytest.raises(ClusterError, match=message):
            load_cluster(str(_file(tmp_path, head, nodes=2)))
    assert load_cluster(str(_file(tmp_path, "replicas = 1", nodes=2))).replica_backlog == 1_000_000
    assert load_cluster(str(_file(tmp_path, "replicas = 1\nreplica_backlog = 5000", nodes=2))).replica_backlog == 5000
