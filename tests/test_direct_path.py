"""The direct path through real processes: a connection whose requests go
to one shard is handed to that shard and served there; it comes back to the
router (and moves on again) when it names another shard's queue, with one
reply per request, in order, whatever path each request took."""
from __future__ import annotations

import os
import signal

import pytest

from serverproc import ServerProcess, wait_for
from queueserver.router import shard_for
from wire import Wire, add, inspect_field, names_on_distinct_shards, new_id, qname, server_stat


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=2, protocols=["workq", "takeanumber"],
                         extra=["--direct-path", "--log-level", "debug"]).start()
    yield proc
    proc.stop()


def moves(proc: ServerProcess) -> int:
    return proc.log().count(" moves at ")


def test_a_connection_on_one_shard_is_served_there(server):
    w = Wire(server.connect())
    name = qname("direct")
    before = moves(server)
    id = new_id()
    assert w.call(add(id, name, b"here")) == b"+OK\r\n"
    wait_for(lambda: moves(server) > before, 10, "the connection to move to its shard")
    assert w.call(f"lease {name} 1000\r\n".encode()) == f"+OK 1\r\n{id} {name} 4\r\nhere\r\n".encode()
    assert w.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    assert w.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()
    w.close()


def test_pipelined_requests_across_shards_keep_order(server):
    """Requests for two shards' queues and for every shard, pipelined in one
    write: the connection moves back and forth (or stays forwarded), and
    every reply comes once, in order."""
    a, b = names_on_distinct_shards(2, 2)
    w = Wire(server.connect())
    ids = [new_id() for _ in range(6)]
    stream = b"".join(add(id, (a, b)[i % 2], f"p{i}".encode()) for i, id in enumerate(ids))
    stream += b"inspect queue " + a.encode() + b"\r\n"
    stream += f"lease {a} {b} 1000\r\n".encode() * 6
    stream += f"delete {ids[0]}\r\n".encode()
    w.send(stream)
    for _ in ids:
        assert w.reply() == b"+OK\r\n"
    assert w.reply() == f"+OK 1\r\n{a} 2\r\nready-len 3\r\nscheduled-len 0\r\n".encode()
    leased = {w.reply().split(b"\r\n")[1].split(b" ")[0].decode() for _ in ids}
    assert leased == set(ids)
    assert w.reply() == b"+OK\r\n"
    w.close()


def test_a_job_made_on_a_shard_directly_is_found_by_id_at_once(server):
    """Another connection (served by the router) names the job right after
    it was added on a shard directly, before the router heard of it."""
    t = server.connect("takeanumber")
    workq = Wire(server.connect())
    for _ in range(20):
        name = qname("seen")
        t.sendall(f"ADD {name} 0 body\r\n".encode())
        reply = t.recv(100)
        assert reply.startswith(b"+"), reply
        id = reply[1:-2].decode()
        assert inspect_field(workq, id, "name") == name.encode()
    t.close()
    workq.close()


def test_a_moved_connection_outlives_its_router(server):
    w = Wire(server.connect())
    name = qname("outlive")
    assert w.call(add(new_id(), name)) == b"+OK\r\n"
    wait_for(lambda: " moves at add " in server.log(), 10, "a move")
    router = server.child_pids()["router"]
    os.kill(router, signal.SIGKILL)
    wait_for(lambda: server.child_pids()["router"] != router, 20, "the router to restart")
    assert w.call(add(new_id(), name)) == b"+OK\r\n"        # the same connection, served by its shard
    assert w.call(f"inspect queue {name}\r\n".encode()).startswith(b"+OK 1\r\n")   # back via the new router
    w.close()


def test_moved_connections_are_counted_once(server):
    counter = Wire(server.connect())

    def active() -> int:
        return server_stat(counter, "active-clients")
    base = active()
    wires = [Wire(server.connect()) for _ in range(6)]
    for w in wires:
        assert w.call(add(new_id(), qname("count"))) == b"+OK\r\n"
    wait_for(lambda: active() == base + 6, 10, "six more clients")
    for w in wires:
        w.close()
    wait_for(lambda: active() == base, 10, "the clients to be counted out")
    counter.close()


def test_a_shards_direct_connections_close_with_it_and_are_counted_out():
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--direct-path", "--log-level", "debug"]).start()
    try:
        counter = Wire(proc.connect())

        def active() -> int:
            return server_stat(counter, "active-clients")
        victim = qname("victim")
        shard = shard_for(victim, 2)
        w = Wire(proc.connect())
        assert w.call(add(new_id(), victim)) == b"+OK\r\n"
        wait_for(lambda: active() == 2, 10, "two clients")
        pid = proc.child_pids()[f"shard-{shard}"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: proc.child_pids()[f"shard-{shard}"] != pid, 20, "the shard to restart")
        with pytest.raises(ConnectionError):
            w.call(add(new_id(), victim))            # it lived in the shard's process
        wait_for(lambda: active() == 1, 10, "the dead shard's client to be counted out")

        def served() -> bool:
            fresh = Wire(proc.connect())
            try:
                return fresh.call(add(new_id(), victim)) == b"+OK\r\n"
            finally:
                fresh.close()
        wait_for(served, 20, "a new connection to be served by the restarted shard")
        counter.close()
    finally:
        proc.stop()


def test_a_connection_that_cannot_go_back_ends_what_ends_with_it():
    """A goqueue client reserves a job on its shard's direct path; its router
    dies, so when it then names another shard's queue its connection cannot
    go back and is closed: its reservation ends with it (the job is ready
    again at once, not after its time to process)."""
    from test_binary_protocols_server import GoWire, g_add, g_reserve, reserved_fields
    proc = ServerProcess(shards=2, protocols=["goqueue", "workq"], extra=["--direct-path"],
                         log_level="debug").start()
    try:
        a, b = names_on_distinct_shards(2, 2)
        g = GoWire(proc.connect("goqueue"))
        id = g.add(a, ttp=600)
        wait_for(lambda: " moves at " in proc.log(), 10, "the connection to move to its shard")
        assert reserved_fields(g.call(g_reserve(a)))[0] == id
        router = proc.child_pids()["router"]
        os.kill(router, signal.SIGKILL)
        wait_for(lambda: proc.child_pids()["router"] != router, 20, "the router to restart")
        g.send(g_add(b))   # another shard's queue: the connection would go back to a router that is gone
        with pytest.raises(ConnectionError):
            g.reply()
        other = GoWire(proc.connect("goqueue"))
        assert reserved_fields(other.call(g_reserve(a, timeout=5)))[0] == id
        other.close()
    finally:
        proc.stop()
