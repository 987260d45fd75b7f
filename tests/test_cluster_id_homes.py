"""Job ids at home across the nodes of a cluster (three real nodes on
127.0.0.1-3): an id stays unique cluster-wide when two adds race on two
nodes, and across slot moves of the id's home and of the job's queue; any
node finds any job by its id."""
from __future__ import annotations

import uuid

from cluster_nodes import Nodes
from queueserver.client import Client
from queueserver.client.client import WorkqError
from queueserver.placement import initial_owners, slot_of
from test_cluster import FOUNDERS, name_on
from wire import Wire, add, inspect_field, racing_adds


def id_on(ordinal: int) -> str:
    """A fresh id whose home (its slot's owner) is shard ``ordinal`` of the new cluster."""
    owners = initial_owners(FOUNDERS)
    while True:
        id = str(uuid.uuid4())
        if owners[slot_of(id)] == ordinal:
            return id


def wires(nodes: Nodes, *names: str):
    return [Wire(_connect(nodes, name)) for name in names]


def _connect(nodes: Nodes, name: str):
    import socket
    sock = socket.create_connection(nodes.address(name), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def test_ids_stay_unique_and_found_across_nodes_and_moves(tmp_path):
    with Nodes(tmp_path) as nodes:
        nodes.start()
        on_a, on_b, on_c = name_on(0, "h"), name_on(2, "h"), name_on(3, "h")
        a, b, c = wires(nodes, "a", "b", "c")
        # two adds of one id racing on two nodes, to queues of two nodes' shards
        for round in range(40):
            id = id_on(round % FOUNDERS)
            replies = racing_adds(id, (a, on_b), (b, on_c))
            assert sorted(replies.values()) == [b"+OK\r\n", b"-CLIENT-ERROR Duplicate job\r\n"], replies
            winner = next(name for name, reply in replies.items() if reply == b"+OK\r\n")
            assert inspect_field(c, id, "name") == winner.encode()       # found from the third node
        # an id at home on c, its job on b: the home's slot moves to a, then the job's queue's slot too
        id = id_on(3)
        assert a.call(add(id, on_b, b"moving")) == b"+OK\r\n"
        result = nodes.cli("move", "--slots", str(slot_of(id)), "--to", "a/1")
        assert result.returncode == 0, result.stdout + result.stderr
        assert b.call(add(id, on_c)) == b"-CLIENT-ERROR Duplicate job\r\n"   # its new home knows it
        result = nodes.cli("move", "--slots", str(slot_of(on_b)), "--to", "c/0")
        assert result.returncode == 0, result.stdout + result.stderr
        for wire in (a, b, c):
            assert inspect_field(wire, id, "name") == on_b.encode()
        assert c.call(add(id, on_a)) == b"-CLIENT-ERROR Duplicate job\r\n"
        assert a.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
        with Client(*nodes.address("c")) as client:
            def free() -> bool:
                try:
                    client.add(id, on_a, b"again", 60_000, 600_000)
                    return True
                except WorkqError:
                    return False
            from serverproc import wait_for
            wait_for(free, 10, "the id to be free once its job is gone")
        for wire in (a, b, c):
            wire.close()
