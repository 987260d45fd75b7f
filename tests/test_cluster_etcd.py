"""Liveness on etcd: a node's lease in a real etcd (Debian's etcd-server,
started per test on free loopback ports), the cluster file's ``[etcd]``
table, and ``queueserver cluster status`` reading who is alive."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cluster_nodes import Nodes, ensure_loopback_aliases
from etcd_server import EtcdServer, etcd  # noqa: F401 (the fixture)
from serverproc import wait_for
from queueserver.cluster.clusterfile import ClusterError, EtcdSpec, load_cluster
from queueserver.cluster.coordination import CoordinationError, Etcd, Membership, live_nodes


def _cluster_file(tmp_path: Path, etcd_table: str) -> Path:
    secret = tmp_path / "s"
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o600)
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(f"""\
        secret_file = "s"
        {etcd_table}
        [[node]]
        name = "a"
        host = "127.0.0.1"
        link_port = 7400
        shards = 1
        """))
    return path


def test_the_cluster_file_names_etcd(tmp_path: Path) -> None:
    spec = load_cluster(str(_cluster_file(tmp_path, textwrap.dedent("""\
        [etcd]
        endpoints = ["http://127.0.0.1:2379", "https://10.0.0.9:2379"]
        prefix = "/prod/queues/"
        lease_ttl = 4
        ca = "ca.crt"
        cert = "n.crt"
        key = "n.key"
        """))))
    assert spec.etcd == EtcdSpec(("http://127.0.0.1:2379", "https://10.0.0.9:2379"), "/prod/queues", 4,
                                 str(tmp_path / "ca.crt"), str(tmp_path / "n.crt"), str(tmp_path / "n.key"))
    assert load_cluster(str(_cluster_file(tmp_path, ""))).etcd is None
    for table, message in [
            ("[etcd]\nprefix = '/x'", "needs endpoints"),
            ("[etcd]\nendpoints = ['127.0.0.1:2379']", r"must be http\(s\)://host:port"),
            ("[etcd]\nendpoints = ['http://h:port']", r"must be http\(s\)://host:port"),
            ("[etcd]\nendpoints = ['http://h:1']\nlease_ttl = 1", "lease_ttl must be whole seconds"),
            ("[etcd]\nendpoints = ['http://h:1']\nprefix = 'x'", "prefix must be a key path"),
            ("[etcd]\nendpoints = ['http://h:1']\ncert = 'c'", "cert and key go together"),
            ("[etcd]\nendpoints = ['http://h:1']\nusername = 'u'", "unknown key username")]:
        with pytest.raises(ClusterError, match=message):
            load_cluster(str(_cluster_file(tmp_path, table)))


def _spec(*endpoints: str, ttl: int = 2) -> EtcdSpec:
    return EtcdSpec(tuple(endpoints), "/qs-test", ttl)


def test_a_member_is_listed_while_it_lives_and_gone_when_it_stops(etcd: EtcdServer) -> None:
    client = Etcd(_spec(etcd.endpoint))
    member = Membership(client, "a", {"host": "127.0.0.1", "shards": 2})
    member.start()
    try:
        assert member.registered.is_set()
        listed = live_nodes(client)
        assert set(listed) == {"a"} and listed["a"]["shards"] == 2 and listed["a"]["host"] == "127.0.0.1"
        time.sleep(3.5)   # past the 2 s TTL: the thread keeps the lease alive
        assert set(live_nodes(client)) == {"a"}
    finally:
        member.stop()
    assert live_nodes(client) == {}   # revoked: gone at once
    client.close()


def test_a_killed_member_lapses_after_its_ttl(etcd: EtcdServer) -> None:
    code = ("import sys, time; from queueserver.cluster.coordination import Etcd, Membership; "
            "from queueserver.cluster.clusterfile import EtcdSpec; "
            f"m = Membership(Etcd(EtcdSpec(({etcd.endpoint!r},), '/qs-test', 2)), 'b', {{}}); m.start(); "
            "print('up', flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    client = Etcd(_spec(etcd.endpoint))
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        assert "b" in live_nodes(client)
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed = time.monotonic()
        wait_for(lambda: "b" not in live_nodes(client), 10, "the killed member's lease to lapse")
        assert time.monotonic() - killed < 2 + 4   # the TTL, and etcd's lease check (every 500 ms) on a busy machine
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        client.close()


def test_calls_go_to_the_next_endpoint_when_one_is_down(etcd: EtcdServer) -> None:
    dead = EtcdServer(etcd.directory, "dead")   # ports found free, nothing listening
    client = Etcd(_spec(dead.endpoint, etcd.endpoint))
    assert live_nodes(client) == {}
    client.close()
    nobody = Etcd(_spec(dead.endpoint))
    with pytest.raises(CoordinationError, match=f"no etcd endpoint answered.*{dead.endpoint}"):
        live_nodes(nobody)
    nobody.close()


def test_a_member_registers_again_when_etcd_lost_its_lease(etcd: EtcdServer) -> None:
    client = Etcd(_spec(etcd.endpoint))
    member = Membership(client, "a", {})
    member.start()
    try:
        etcd.kill()
        etcd.wipe()            # every key and lease gone
        etcd.start()
        wait_for(lambda: "a" in live_nodes(client), 15, "the member to register again")
    finally:
        member.stop()
        client.close()


def test_cluster_status_says_which_nodes_are_alive(tmp_path: Path, etcd: EtcdServer) -> None:
    ensure_loopback_aliases()
    with Nodes(tmp_path, shards=(1, 1), protocols=["workq"]) as nodes:
        with open(nodes.file, "a") as f:
            f.write(f'[etcd]\nendpoints = ["{etcd.endpoint}"]\nprefix = "/qs-test"\nlease_ttl = 2\n')
        nodes.start()
        client = Etcd(_spec(etcd.endpoint))
        wait_for(lambda: set(live_nodes(client)) == {"a", "b"}, 15, "both nodes to register")
        rows = {row["shard"]: row for row in nodes.status()}
        assert {name: (row["node"], row["etcd"], row["up"]) for name, row in rows.items()} == \
            {"a/0": ("a", "alive", True), "b/0": ("b", "alive", True)}
        info = live_nodes(client)["b"]
        assert info["host"] == "127.0.0.2" and info["shards"] == 1 and info["metrics_port"] > 0
        nodes.kill("b")   # kill -9: no goodbye, the lease lapses
        wait_for(lambda: set(live_nodes(client)) == {"a"}, 10, "b's lease to lapse")
        result = nodes.cli("status")
        assert "etcd: lapsed" in result.stdout and "DOWN" in result.stdout, result.stdout
        nodes.procs["a"].stop()   # a graceful stop revokes at once
        assert live_nodes(client) == {}
        client.close()
    assert "registered" in nodes.log("a")


def test_a_node_keeps_its_lease_through_the_loss_of_the_etcd_member_it_talks_to(tmp_path: Path) -> None:
    """Three etcd members, the node's endpoints listing all three: the member
    it talks to is killed, and its lease stays alive through the others (a
    quorum of two); a new lease can still be had and CAS writes still work."""
    from etcd_server import etcd_cluster
    from queueserver.cluster import groups

    members = etcd_cluster(tmp_path)
    try:
        client = Etcd(_spec(*(m.endpoint for m in members), ttl=2))
        member = Membership(client, "a", {})
        member.start()
        try:
            lease = member._lease
            members[0].kill()   # the first endpoint: the one in use
            time.sleep(3.0)     # past the TTL: refreshed through another member
            # If the killed member led etcd, refreshes wait for the next
            # leader's election (longer on a loaded machine); etcd keeps the
            # leases alive across it.
            deadline = time.monotonic() + 10.0
            while member.silent_for() >= 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert member._lease is lease   # the same lease: it never lapsed and was taken again
            assert "a" in live_nodes(client) and member.silent_for() < 2
            fresh = groups.Group(primary="a", epoch=1, isr=[], copy=False)
            assert groups.swap(client, 7, 0, fresh)
            assert not groups.swap(client, 7, 0, fresh)   # created once only
            assert groups.read(client, 7)[0] == fresh
        finally:
            member.stop()
            client.close()
    finally:
        for m in members:
            m.kill()
