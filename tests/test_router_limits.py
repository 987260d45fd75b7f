"""What one careless or hostile client can cost everyone else, through a
real server: jobs never stranded with a dead client or a dead router,
memory bounded per connection, descriptors and connections capped.

Each test starts its own server (so memory figures are its own) and stops it.
"""
from __future__ import annotations

import os
import resource
import signal
import socket
import time

import pytest

from serverproc import ServerProcess, wait_for
from test_binary_protocols_server import GoWire, g_add, g_reserve, reserved_fields
from wire import Wire, add, new_id, qname, queue_exists, server_stat


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def started():
    """Start servers with ``started(**kwargs)``; all are stopped afterwards."""
    servers = []

    def start(**kwargs) -> ServerProcess:
        servers.append(ServerProcess(**kwargs).start())
        return servers[-1]
    yield start
    for proc in servers:
        proc.stop()


def go(proc: ServerProcess) -> GoWire:
    return GoWire(proc.connect("goqueue"))


# ------------------------------------------------------ jobs lost or stuck
def test_a_goqueue_client_that_floods_reserves_then_leaves_takes_no_job(started):
    """More RESERVEs than the router keeps in flight, never read, then a
    close: the paused connection's close is noticed, its waiters go, and the
    next job goes to a live client."""
    proc = started(protocols=["goqueue"])
    name = qname()
    flood = socket.create_connection(("127.0.0.1", proc.port("goqueue")))
    flood.sendall(g_reserve(name, 0) * 5000)       # timeout 0: wait without limit
    time.sleep(0.5)                                 # let the router read and park them
    flood.close()
    time.sleep(0.5)
    producer, worker = go(proc), go(proc)
    assert producer.call(g_add(name, data=b"for the living"))[:6] == b"ADDED\0"
    reply = worker.call(g_reserve(name, 5))
    assert reply.startswith(b"RESERVED\0"), reply
    assert reserved_fields(reply)[-1] == b"for the living"


def test_goqueue_reservations_end_with_the_connection(started):
    proc = started(protocols=["goqueue"])
    name = qname()
    producer = go(proc)
    producer.call(g_add(name, ttp=0, data=b"held"))
    holder = go(proc)
    assert holder.call(g_reserve(name, 1)).startswith(b"RESERVED\0")
    other = go(proc)
    assert other.call(g_reserve(name, 1)) == b"TIMEOUT\0"
    holder.close()
    assert reserved_fields(other.call(g_reserve(name, 5)))[-1] == b"held"


def test_a_killed_router_strands_no_goqueue_reservation(started):
    """kill -9 of the router: the shard sees its link drop and treats every
    connection of that router as closed; a TTP 0 job is ready again."""
    # Router-served connections: a direct one lives on in its shard.
    proc = started(protocols=["goqueue"], shards=2, extra=["--no-direct-path"])
    name = qname()
    go(proc).call(g_add(name, ttp=0, data=b"survivor"))
    holder = go(proc)
    assert holder.call(g_reserve(name, 1)).startswith(b"RESERVED\0")
    old = proc.child_pids()["router"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: proc.child_pids()["router"] != old, 15, "the router to be restarted")

    def served() -> bool:
        try:
            reply = go(proc).call(g_reserve(name, 1))
        except OSError:
            return False
        assert reply.startswith(b"RESERVED\0"), reply
        assert reserved_fields(reply)[-1] == b"survivor"
        return True
    wait_for(served, 20, "the job to be reserved through the new router")


# ------------------------------------------------------------------ memory
def test_clients_leaving_parked_leases_leave_no_router_memory_behind(started):
    """Each client parks one lease naming 2,000 queues over two shards and
    leaves. The withdrawn requests are answered and forgotten: the router's
    memory returns to where it began."""
    proc = started(shards=2, protocols=["workq"])
    router = proc.child_pids()["router"]
    names = " ".join(f"m{i}" for i in range(2000))
    line = f"lease {names} 60000\r\n".encode()
    counter = Wire(proc.connect())

    def active() -> int:
        return server_stat(counter, "active-clients")

    def round_of_clients(count: int) -> None:
        socks = []
        for _ in range(count):
            sock = proc.connect()
            sock.sendall(line)
            socks.append(sock)
        wait_for(lambda: active() == count + 1, 20, "every client to be served")
        for sock in socks:
            sock.close()
        wait_for(lambda: active() == 1, 20, "every close to be seen")

    for _ in range(2):
        round_of_clients(40)                            # warm up allocator and caches
    before = rss_kb(router)
    for _ in range(5):
        round_of_clients(40)
    after = rss_kb(router)
    assert after <= before * 1.10, (before, after)


def test_unread_big_answers_are_bounded_per_connection(started):
    """A client pipelines inspections of a 1 MiB job without reading: the
    router stops reading it once its answers fill the budget, memory stays
    bounded, other clients are served meanwhile, and every answer still
    comes, in order, once the client reads."""
    proc = started(shards=1, protocols=["workq"])
    pids = proc.child_pids()
    w = Wire(proc.connect())
    id = new_id()
    payload = os.urandom(1048576).replace(b"\r", b"r")  # the test wire reads lines
    assert w.call(add(id, "big", payload)) == b"+OK\r\n"
    base = {name: rss_kb(pid) for name, pid in pids.items()}
    flood = Wire(proc.connect())
    count = 300
    flood.sock.sendall(f"inspect job {id}\r\n".encode() * count)
    time.sleep(1.0)
    for name, pid in pids.items():       # 300 MiB of answers would be asked for
        assert rss_kb(pid) - base[name] < 80 * 1024, (name, base[name], rss_kb(pid))
    other = Wire(proc.connect(timeout=2.0))
    started_at = time.monotonic()
    assert other.call(add(new_id(), "small")) == b"+OK\r\n"
    assert time.monotonic() - started_at < 1.0
    for _ in range(count):
        reply = flood.reply()
        assert reply.startswith(f"+OK 1\r\n{id} ".encode()) and payload in reply
    assert flood.call(add(new_id(), "after")) == b"+OK\r\n"


def test_not_found_answers_do_not_grow_the_shard(started):
    proc = started(shards=1, protocols=["workq"])
    shard = proc.child_pids()["shard-0"]
    w = Wire(proc.connect())
    batch = b"".join(f"delete {new_id()}\r\n".encode() for _ in range(1000))

    def run(batches: int) -> None:
        for _ in range(batches):
            w.send(batch)
            for _ in range(1000):
                assert w.line() == b"-NOT-FOUND\r\n"
    run(10)
    before = rss_kb(shard)
    run(100)                                            # 100,000 not-found operations
    assert rss_kb(shard) - before < 4 * 1024, (before, rss_kb(shard))


# ------------------------------------------------------------- descriptors
def test_connections_past_max_connections_are_refused_cleanly(started):
    proc = started(protocols=["workq", "goqueue"], extra=["--max-connections", "3"])
    kept = [Wire(proc.connect()) for _ in range(3)]
    for kept_wire in kept:
        assert kept_wire.call(add(new_id(), "cap")) == b"+OK\r\n"
    refused = Wire(proc.connect())
    assert refused.line() == b"-SERVER-ERROR Too many connections\r\n"
    assert refused.sock.recv(10) == b""
    refused_go = proc.connect("goqueue")
    assert refused_go.recv(100) == b"ERROR\0Too many connections\0"
    kept[0].close()

    def served() -> bool:
        w = Wire(proc.connect())
        reply = w.call(add(new_id(), "cap"))
        w.close()
        return reply == b"+OK\r\n"
    wait_for(served, 10, "a connection to be served once one left")


def test_running_out_of_descriptors_refuses_without_spinning(started):
    """Under a low RLIMIT_NOFILE the router refuses connections it has no
    descriptor for, does not spin, logs once per interval, and serves again
    once descriptors are free."""
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    proc = started(protocols=["workq"], preexec=low_limit)
    router = proc.child_pids()["router"]
    socks = []
    for _ in range(80):
        socks.append(socket.create_connection(("127.0.0.1", proc.port())))
    time.sleep(0.5)
    cpu_before = cpu_seconds(router)
    time.sleep(1.0)
    assert cpu_seconds(router) - cpu_before < 0.3           # not spinning
    refused = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            data = sock.recv(100)
        except (BlockingIOError, ConnectionResetError):
            continue
        if data == b"-SERVER-ERROR Out of file descriptors\r\n":
            refused += 1
    assert refused >= 10
    log = proc.log()
    assert log.count("out of file descriptors") <= 3, log[-2000:]
    assert len(log) < 100_000
    for sock in socks:
        sock.close()

    def served() -> bool:
        try:
            w = Wire(proc.connect(timeout=2.0))
            reply = w.call(add(new_id(), "fd"))
            w.close()
        except OSError:
            return False
        return reply == b"+OK\r\n"
    wait_for(served, 10, "a connection to be served once descriptors were free")


def test_debug_log_shows_connections_and_commands(started):
    proc = started(protocols=["workq"], extra=["--log-level", "debug"])
    w = Wire(proc.connect())
    name = qname()
    assert w.call(add(new_id(), name)) == b"+OK\r\n"
    w.close()
    wait_for(lambda: "closed" in proc.log() and name in proc.log(), 10, "debug lines")
    log = proc.log()
    assert "opened: workq from 127.0.0.1:" in log
    assert f"add '{name}'" in log


# ------------------------------------------------------------------- queues
def queue_lines(w: Wire) -> list:
    reply = w.call(b"inspect queues 0 100\r\n")
    return [line.split(b" ")[0] for line in reply.split(b"\r\n")[1:] if line.endswith(b" 2")]


def test_unused_queues_are_removed_after_the_idle_time(started):
    proc = started(protocols=["workq"], shards=2, extra=["--queue-idle-timeout", "0.5"])
    w = Wire(proc.connect())
    empty, kept = qname("empty"), qname("kept")
    assert w.call(f"lease {empty} 0\r\n".encode()) == b"-TIMEOUT\r\n"   # creates the queue
    assert w.call(add(new_id(), kept)) == b"+OK\r\n"
    assert set(queue_lines(w)) == {empty.encode(), kept.encode()}
    wait_for(lambda: queue_lines(w) == [kept.encode()], 10, "the unused queue to go")


def test_queue_cap_refuses_in_each_protocols_form(started):
    proc = started(protocols=["workq", "takeanumber"], shards=1, extra=["--max-queues", "2"])
    w = Wire(proc.connect())
    assert w.call(add(new_id(), "one")) == b"+OK\r\n"
    assert w.call(add(new_id(), "two")) == b"+OK\r\n"
    assert w.call(add(new_id(), "three")) == b"-SERVER-ERROR Too many queues\r\n"
    tan = proc.connect("takeanumber")
    tan.sendall(b"ADD three 0 body\r\n")
    assert tan.recv(100) == b"-ERR Too many queues\r\n"
    assert w.call(add(new_id(), "one")) == b"+OK\r\n"     # existing queues still work


def test_a_job_never_goes_to_a_parked_lease_whose_client_has_left(started):
    """The client's FIN is in, not yet read, when a job comes for its parked
    lease (from another router, or served directly): the job is not written
    to the closed socket (to come back only at its TTR) but given back at once."""
    proc = started(shards=3, protocols=["workq"], extra=["--routers", "2"])
    wire = Wire(proc.connect())
    for _ in range(40):
        name = qname("left")
        gone = Wire(proc.connect())
        gone.send(f"lease {name} 10000\r\n".encode())
        wait_for(lambda: queue_exists(wire, name), 10, "the lease to be parked")
        gone.close()
        id = new_id()
        assert wire.call(add(id, name, ttr=10000)) == b"+OK\r\n"
        reply = wire.call(f"lease {name} 2000\r\n".encode())
        assert reply.startswith(f"+OK 1\r\n{id} ".encode()), reply
        assert wire.call(f"complete {id} 0\r\n\r\n".encode()) == b"+OK\r\n"
