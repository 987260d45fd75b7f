"""The workq protocol end to end: a real ``queueserver serve`` with 1 and 3
shards, raw bytes over TCP, as a client written for the original would talk."""
from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from queueserver.router import shard_for
from serverproc import ServerProcess, replies_across_shard_restart, wait_for
from wire import (Wire, add, connection_fixture, inspect_field, names_on_distinct_shards, new_id,
                  qname, queue_exists, server_stat, workq_wire)


@pytest.fixture(scope="module", params=[(1, 1), (3, 1), (3, 2)],
                ids=["1shard", "3shards", "3shards-2routers"])
def server(request):
    shards, routers = request.param
    proc = ServerProcess(shards=shards, protocols=["workq"], extra=["--routers", str(routers)]).start()
    proc.routers = routers
    yield proc
    proc.stop()


wire = connection_fixture(workq_wire)


other = connection_fixture(workq_wire)


# ------------------------------------------------------------------ commands
def test_add_lease_complete_result(wire, other):
    q, id = qname(), new_id()
    assert wire.call(add(id, q, b"ping", flags="-priority=10 -max-attempts=3 -max-fails=1")) == b"+OK\r\n"
    assert wire.call(f"lease {q} 1000\r\n".encode()) == f"+OK 1\r\n{id} {q} 4\r\nping\r\n".encode()
    assert other.call(f"complete {id} 4\r\npong\r\n".encode()) == b"+OK\r\n"
    assert other.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 4\r\npong\r\n".encode()
    assert wire.call(f"complete {id} 1\r\nx\r\n".encode()) == b"-CLIENT-ERROR Duplicate result\r\n"
    assert inspect_field(wire, id, "state") == b"1"


def test_duplicate_job_is_rejected(wire):
    id = new_id()
    assert wire.call(add(id, qname())) == b"+OK\r\n"
    assert wire.call(add(id, qname())) == b"-CLIENT-ERROR Duplicate job\r\n"


def test_inspect_job_reply_bytes(wire):
    q, id = qname(), new_id()
    wire.call(add(id, q, b"ping", ttr=1000, ttl=600000))
    reply = wire.call(f"inspect job {id}\r\n".encode())
    head, created = reply.rsplit(b"created ", 1)
    assert head == (f"+OK 1\r\n{id} 12\r\nname {q}\r\nttr 1000\r\nttl 600000\r\npayload-size 4\r\n"
                    "payload ping\r\nmax-attempts 0\r\nattempts 0\r\nmax-fails 0\r\nfails 0\r\n"
                    "priority 0\r\nstate 0\r\n").encode()
    assert len(created) == len(b"2016-08-22T01:50:51Z\r\n") and created.endswith(b"Z\r\n")


def test_fail_requeues_until_max_fails_then_fails(wire, other):
    q, id = qname(), new_id()
    wire.call(add(id, q, flags="-max-fails=2"))
    wire.call(f"lease {q} 1000\r\n".encode())
    assert other.call(f"fail {id} 3\r\nbad\r\n".encode()) == b"+OK\r\n"
    assert inspect_field(wire, id, "state") == b"3"
    assert wire.call(f"lease {q} 1000\r\n".encode()).startswith(b"+OK 1\r\n")
    assert other.call(f"fail {id} 3\r\nbad\r\n".encode()) == b"+OK\r\n"
    assert inspect_field(wire, id, "state") == b"2"
    assert wire.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 0 3\r\nbad\r\n".encode()


def test_delete_and_not_found(wire):
    id = new_id()
    wire.call(add(id, qname()))
    assert wire.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
    assert wire.call(f"delete {id}\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert wire.call(f"complete {id} 0\r\n\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert wire.call(f"result {id} 100\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert wire.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"


def test_inspect_queues_queue_and_server(wire):
    a, b = "aaa-" + new_id()[:8], "aab-" + new_id()[:8]
    wire.call(add(new_id(), a))
    wire.call(add(new_id(), a))
    assert wire.call(f"lease {b} 0\r\n".encode()) == b"-TIMEOUT\r\n"  # lease creates the queue
    assert wire.call(f"inspect queue {a}\r\n".encode()) == \
        f"+OK 1\r\n{a} 2\r\nready-len 2\r\nscheduled-len 0\r\n".encode()
    reply = wire.call(b"inspect queues 0 100\r\n")
    blocks = reply.split(b"\r\n")
    names = [line.split(b" ")[0] for line in blocks[1:]
             if line.endswith(b" 2") and not line.startswith((b"ready-len", b"scheduled-len"))]
    assert names == sorted(names)
    assert a.encode() in names and b.encode() in names
    assert f"{b} 2\r\nready-len 0\r\nscheduled-len 0\r\n".encode() in reply
    server_reply = wire.call(b"inspect server\r\n")
    lines = server_reply.split(b"\r\n")
    assert lines[0] == b"+OK 1" and lines[1] == b"server 3"
    assert lines[2].startswith(b"active-clients ") and int(lines[2].split()[1]) >= 1
    assert lines[3].startswith(b"evicted-jobs ")
    assert lines[4].startswith(b"started ") and lines[4].endswith(b"Z")
    assert wire.call(b"inspect queue never-made-xyz\r\n") == b"-NOT-FOUND\r\n"


def test_inspect_jobs_paging(wire):
    q = qname()
    ids = [new_id() for _ in range(3)]
    for i, id in enumerate(ids):
        wire.call(add(id, q, flags=f"-priority={10 - i}"))
    first = wire.call(f"inspect jobs {q} 0 2\r\n".encode())
    assert first.startswith(b"+OK 2\r\n")
    assert first.index(ids[0].encode()) < first.index(ids[1].encode())
    second = wire.call(f"inspect jobs {q} 2 2\r\n".encode())
    assert second.startswith(f"+OK 1\r\n{ids[2]} 12\r\n".encode())
    assert wire.call(f"inspect jobs {q} 5 2\r\n".encode()) == b"+OK 0\r\n"


# ---------------------------------------------------------------- blocking
def test_blocking_lease_gets_a_later_job(wire, other):
    q, id = qname(), new_id()
    wire.send(f"lease {q} 10000\r\n".encode())
    wait_for(lambda: queue_exists(other, q), what="the lease to park")
    assert other.call(add(id, q, b"late")) == b"+OK\r\n"
    assert wire.reply() == f"+OK 1\r\n{id} {q} 4\r\nlate\r\n".encode()


def test_blocking_lease_times_out(wire):
    assert wire.call(f"lease {qname()} 200\r\n".encode()) == b"-TIMEOUT\r\n"


def test_blocking_lease_does_not_delay_other_traffic(wire, other):
    q = qname()
    wire.send(f"lease {q} 5000\r\n".encode())
    started = time.monotonic()
    for _ in range(5):
        assert other.call(add(new_id(), qname())) == b"+OK\r\n"
    assert time.monotonic() - started < 4  # not serialised behind the parked lease
    other.call(add(new_id(), q))
    assert wire.reply().startswith(b"+OK 1\r\n")


def test_result_blocks_until_complete(wire, other):
    q, id = qname(), new_id()
    wire.call(add(id, q))
    # A parked result is not visible, so a marker job follows it on the same
    # connection: requests reach the shard in order, and once the marker
    # exists the result is parked there.
    marker = new_id()
    other.send(f"result {id} 10000\r\n".encode() + add(marker, q))
    wait_for(lambda: wire.call(f"inspect job {marker}\r\n".encode()) != b"-NOT-FOUND\r\n",
             what="the result to park")
    wire.call(f"lease {q} 0\r\n".encode())
    wire.call(f"complete {id} 2\r\nok\r\n".encode())
    assert other.reply() == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()
    assert other.reply() == b"+OK\r\n"   # the marker


def test_result_times_out(wire):
    id = new_id()
    wire.call(add(id, qname()))
    assert wire.call(f"result {id} 200\r\n".encode()) == b"-TIMEOUT\r\n"


def test_run_returns_the_workers_result_and_removes_the_job(wire, other):
    q, id = qname(), new_id()
    wire.send(f"run {id} {q} 5000 10000 4\r\nping\r\n".encode())
    leased = other.call(f"lease {q} 5000\r\n".encode())
    assert leased == f"+OK 1\r\n{id} {q} 4\r\nping\r\n".encode()
    assert other.call(f"complete {id} 4\r\npong\r\n".encode()) == b"+OK\r\n"
    assert wire.reply() == f"+OK 1\r\n{id} 1 4\r\npong\r\n".encode()
    assert other.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"


def test_run_times_out_when_nobody_leases(wire):
    q, id = qname(), new_id()
    assert wire.call(f"run {id} {q} 5000 200 4\r\nping\r\n".encode()) == b"-TIMEOUT\r\n"
    assert wire.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"


def test_run_leased_waits_for_ttr(wire, other):
    q, id = qname(), new_id()
    sent = time.monotonic()
    wire.send(f"run {id} {q} 600 100 4\r\nping\r\n".encode())
    assert other.call(f"lease {q} 5000\r\n".encode()).startswith(b"+OK 1\r\n")
    # Sleeping is the point: time passes beyond the run's wait-timeout (100 ms)
    # while its job is leased (TTR 600 ms), and the run must keep waiting.
    time.sleep(0.3)  # past the wait-timeout, inside the TTR: still waiting
    assert other.call(f"inspect job {id}\r\n".encode()).startswith(b"+OK 1\r\n")
    assert wire.reply() == b"-TIMEOUT\r\n"
    # Not by luck: the TTR starts at the lease, after ``sent``, so the answer
    # cannot come before 0.6 s; a run ended at its wait-timeout would have
    # answered at about 0.1 s.
    assert time.monotonic() - sent >= 0.5
    assert other.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"


# ------------------------------------------------------------------ timers
def test_ttr_expiry_requeues_as_pending(wire):
    q, id = qname(), new_id()
    wire.call(add(id, q, ttr=150))
    assert wire.call(f"lease {q} 0\r\n".encode()).startswith(b"+OK 1\r\n")
    # The next lease parks until the TTR returns the job to the queue.
    assert wire.call(f"lease {q} 5000\r\n".encode()).startswith(f"+OK 1\r\n{id}".encode())
    assert inspect_field(wire, id, "attempts") == b"2"


def test_ttr_expiry_with_max_attempts_fails_the_job(wire):
    q, id = qname(), new_id()
    wire.call(add(id, q, ttr=100, flags="-max-attempts=1"))
    wire.call(f"lease {q} 0\r\n".encode())
    assert wire.call(f"result {id} 5000\r\n".encode()) == f"+OK 1\r\n{id} 0 0\r\n\r\n".encode()
    assert inspect_field(wire, id, "state") == b"2"


def test_ttl_eviction_counts_evicted_jobs(wire):
    before = server_stat(wire, "evicted-jobs")
    q, id = qname(), new_id()
    wire.call(add(id, q, ttl=150))
    wait_for(lambda: wire.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n",
             what="the TTL to evict the job")
    assert server_stat(wire, "evicted-jobs") == before + 1
    assert wire.call(add(id, q)) == b"+OK\r\n"  # the id is free again


def test_schedule_wakes_at_its_time(wire):
    q, id = qname(), new_id()
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(time.time()) + 2))
    assert wire.call(f"schedule {id} {q} 1000 60000 {at} 4\r\nlate\r\n".encode()) == b"+OK\r\n"
    assert wire.call(f"inspect queue {q}\r\n".encode()) == \
        f"+OK 1\r\n{q} 2\r\nready-len 0\r\nscheduled-len 1\r\n".encode()
    listed = wire.call(f"inspect scheduled-jobs {q} 0 10\r\n".encode())
    assert listed.startswith(f"+OK 1\r\n{id} 13\r\n".encode()) and f"time {at}\r\n".encode() in listed
    assert wire.call(f"lease {q} 0\r\n".encode()) == b"-TIMEOUT\r\n"
    assert wire.call(f"lease {q} 5000\r\n".encode()) == f"+OK 1\r\n{id} {q} 4\r\nlate\r\n".encode()


# ------------------------------------------------------------- across shards
def test_multi_name_lease_takes_the_best_job_across_shards(server, wire, other):
    names = names_on_distinct_shards(server.shards, 3)
    ids = {}
    for priority, name in enumerate(names):
        ids[name] = new_id()
        wire.call(add(ids[name], name, flags=f"-priority={priority}"))
    lease = f"lease {' '.join(names)} 0\r\n".encode()
    got = []
    for _ in names:
        reply = other.call(lease)
        assert reply.startswith(b"+OK 1\r\n")
        got.append(reply.split(b"\r\n")[1].split(b" ")[0].decode())
    assert got == [ids[n] for n in reversed(names)]  # highest priority first
    assert other.call(lease) == b"-TIMEOUT\r\n"
    for id in got:  # exactly one attempt charged each: nothing lost or double-leased
        assert inspect_field(wire, id, "attempts") == b"1"
        assert inspect_field(wire, id, "state") == b"4"


def test_blocking_multi_name_lease_across_shards_leaves_no_stuck_waiter(server, wire, other):
    names = names_on_distinct_shards(server.shards, 3)
    wire.send(f"lease {' '.join(names)} 10000\r\n".encode())
    # Every queue exists once the first round (take what is ready) reached
    # its shard; nothing was ready, so the lease then parks on every shard.
    wait_for(lambda: all(queue_exists(other, name) for name in names), what="the lease to park")
    id = new_id()
    other.call(add(id, names[-1]))
    assert wire.reply().startswith(f"+OK 1\r\n{id}".encode())
    # Parked leases on the other shards were withdrawn: their next jobs are free.
    # A withdrawal may still be on its way (from another router), and a job
    # such a lease took meanwhile is given back uncharged: the lease waits
    # for the job instead of a sleep; a stuck waiter keeps it and fails here.
    for name in names[:-1]:
        later = new_id()
        other.call(add(later, name))
        assert other.call(f"lease {name} 5000\r\n".encode()).startswith(f"+OK 1\r\n{later}".encode())
        assert inspect_field(other, later, "attempts") == b"1"


def test_id_only_commands_reach_the_owning_shard(server, wire, other):
    jobs = [(new_id(), name) for name in names_on_distinct_shards(server.shards, 3)]
    for id, name in jobs:
        wire.call(add(id, name))
    for id, name in jobs:
        assert other.call(f"inspect job {id}\r\n".encode()).startswith(f"+OK 1\r\n{id}".encode())
        other.call(f"lease {name} 0\r\n".encode())
    for id, _ in jobs:
        assert other.call(f"complete {id} 1\r\nr\r\n".encode()) == b"+OK\r\n"
        assert wire.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 1\r\nr\r\n".encode()
        assert wire.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"


def test_leased_job_of_a_vanished_client_is_given_back(server, wire):
    q = qname()
    # Earlier tests' connections are counted out first: only ``wire`` is left.
    wait_for(lambda: server_stat(wire, "active-clients") == 1, what="earlier clients to leave")
    clients = 1
    gone = Wire(server.connect())
    gone.send(f"lease {q} 10000\r\n".encode())
    wait_for(lambda: queue_exists(wire, q), what="the lease to park")
    wait_for(lambda: server_stat(wire, "active-clients") > clients, what="the client to count")
    gone.close()
    # Once the server no longer counts the client, it has withdrawn its lease.
    wait_for(lambda: server_stat(wire, "active-clients") <= clients, what="the client to leave")
    id = new_id()
    wire.call(add(id, q))
    assert wire.call(f"lease {q} 2000\r\n".encode()).startswith(f"+OK 1\r\n{id}".encode())
    assert inspect_field(wire, id, "attempts") == b"1"


# ------------------------------------------------------- framing and errors
def test_pipelined_requests_are_answered_in_order(server, wire):
    names = names_on_distinct_shards(server.shards, 3)
    ids = [new_id() for _ in range(60)]
    batch = b"".join(add(id, names[i % len(names)]) for i, id in enumerate(ids))
    batch += b"".join(f"inspect job {id}\r\n".encode() for id in ids)
    batch += b"bogus\r\n" + b"inspect server\r\n"
    wire.send(batch)
    for _ in ids:
        assert wire.reply() == b"+OK\r\n"
    for id in ids:
        assert wire.reply().startswith(f"+OK 1\r\n{id} 12\r\n".encode())
    assert wire.reply() == b"-CLIENT-ERROR Unknown command\r\n"
    assert wire.reply().startswith(b"+OK 1\r\nserver 3\r\n")


def test_errors_keep_the_connection_usable(wire):
    assert wire.call(b"add nope q 1 1 1\r\nx\r\n") == b"-CLIENT-ERROR Invalid ID\r\n"
    assert wire.call(f"add {new_id()} q 1000 1000 5\r\ntoolong\r\n".encode()) == \
        b"-CLIENT-ERROR Invalid payload size\r\n"
    assert wire.call(b"lease q\r\n") == b"-CLIENT-ERROR Invalid command args\r\n"
    assert wire.call(b"\r\n") == b"-CLIENT-ERROR Unknown command\r\n"
    assert wire.call(add(new_id(), qname())) == b"+OK\r\n"


def test_add_with_its_size_missing_is_answered_at_once(wire):
    """``add <id> <q> 1000`` (no TTL, no size): no size is readable with the
    wrong argument count, so the answer comes with no further byte sent, and
    the next line is a command of its own."""
    q = qname()
    wire.sock.settimeout(5)
    assert wire.call(f"add {new_id()} {q} 1000\r\n".encode()) == \
        b"-CLIENT-ERROR Invalid command args\r\n"
    assert wire.call(f"add {new_id()} {q} 1000 4\r\n".encode()) == \
        b"-CLIENT-ERROR Invalid command args\r\n"
    assert wire.call(b"ping\r\n") == b"-CLIENT-ERROR Unknown command\r\n"
    assert wire.call(f"inspect queue {q}\r\n".encode()) == b"-NOT-FOUND\r\n"


def test_payload_limit_is_one_mebibyte(wire):
    q, id = qname(), new_id()
    big = os.urandom(1048576)
    assert wire.call(add(id, q, big)) == b"+OK\r\n"
    assert wire.call(f"lease {q} 0\r\n".encode()) == \
        f"+OK 1\r\n{id} {q} 1048576\r\n".encode() + big + b"\r\n"
    too_big = b"x" * 1048577
    assert wire.call(add(new_id(), q, too_big)) == b"-CLIENT-ERROR Invalid payload size\r\n"
    assert wire.call(add(new_id(), q)) == b"+OK\r\n"


def test_binary_payload_round_trips(wire):
    q, id = qname(), new_id()
    payload = b"\x00\r\n\xff-+OK\r\n"
    wire.call(add(id, q, payload))
    assert wire.call(f"lease {q} 0\r\n".encode()) == \
        f"+OK 1\r\n{id} {q} {len(payload)}\r\n".encode() + payload + b"\r\n"


def test_many_concurrent_clients(server):
    q = qname()
    errors = []

    def producer_consumer(n: int) -> None:
        try:
            w = Wire(server.connect())
            for _ in range(20):
                id = new_id()
                assert w.call(add(id, q)) == b"+OK\r\n"
                reply = w.call(f"lease {q} 2000\r\n".encode())
                leased = reply.split(b"\r\n")[1].split(b" ")[0].decode()
                assert w.call(f"complete {leased} 0\r\n\r\n".encode()) == b"+OK\r\n"
            w.close()
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=producer_consumer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


# --------------------------------------------------------------- processes
def test_killed_shard_is_restarted_and_router_answers_server_error_meanwhile():
    # Router-served connections (a shard's direct connections die with it).
    proc = ServerProcess(shards=2, protocols=["workq"], extra=["--no-direct-path"]).start()
    try:
        w = Wire(proc.connect())
        q = "victim-queue"
        shard = shard_for(q, 2)
        w.call(add(new_id(), q))
        replies = replies_across_shard_restart(proc, shard, lambda: w.call(add(new_id(), q)),
                                               lambda reply: reply == b"+OK\r\n")
        assert any(reply.startswith(b"-SERVER-ERROR") for reply in replies)
        # The restarted shard starts empty (no durability yet); it works again.
        assert w.call(f"inspect queue {q}\r\n".encode()).endswith(b"ready-len 1\r\nscheduled-len 0\r\n")
        w.close()
    finally:
        proc.stop()


def test_sigterm_shuts_everything_down_cleanly():
    proc = ServerProcess(shards=2, protocols=["workq"]).start()
    pids = proc.child_pids()
    w = Wire(proc.connect())
    w.call(add(new_id(), qname()))
    proc.process.send_signal(signal.SIGTERM)
    assert proc.process.wait(15) == 0
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proc.port()), timeout=1)
    w.close()
    proc.stop()


def test_an_id_is_unique_across_shards(server, wire, other):
    first, second = names_on_distinct_shards(server.shards, 2)[:2] if server.shards > 1 else ("u1", "u2")
    id = new_id()
    assert wire.call(add(id, first)) == b"+OK\r\n"
    assert other.call(add(id, second)) == b"-CLIENT-ERROR Duplicate job\r\n"
    assert wire.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
    # free again once gone (another router may learn it a moment later)
    wait_for(lambda: other.call(add(id, second)) == b"+OK\r\n", what="the id to be free")
    assert other.call(f"inspect job {id}\r\n".encode()).startswith(f"+OK 1\r\n{id} 12\r\nname {second}\r\n".encode())


def test_active_clients_counts_every_routers_clients(server):
    wires = [Wire(server.connect()) for _ in range(10)]
    try:
        for w in wires:  # every connection is served (and counted) before we ask
            assert w.call(add(new_id(), qname())) == b"+OK\r\n"
        for w in wires:
            reply = w.call(b"inspect server\r\n")
            assert int(reply.split(b"active-clients ")[1].split(b"\r\n")[0]) >= 10
    finally:
        for w in wires:
            w.close()


def test_no_job_is_lost_by_cross_shard_leases_and_vanishing_workers(server):
    """Conservation under churn: every job ends completed. A lease whose
    client vanished before the answer left is given back at once; one whose
    answer went to a socket the client had just closed returns at its TTR."""
    names = names_on_distinct_shards(server.shards, 3)
    producer = Wire(server.connect())
    ids = {new_id() for _ in range(120)}
    for i, id in enumerate(sorted(ids)):
        assert producer.call(add(id, names[i % len(names)], ttr=1000)) == b"+OK\r\n"
    lease = f"lease {' '.join(names)} 2500\r\n".encode()
    completed, errors = set(), []

    def worker(n: int) -> None:
        try:
            w = Wire(server.connect())
            vanish = 5 if n % 2 == 0 else 0
            while True:
                if vanish:
                    vanish -= 1
                    w.send(lease)   # ask for a job and vanish without reading the answer
                    w.close()
                    w = Wire(server.connect())
                    continue
                reply = w.call(lease)
                if reply == b"-TIMEOUT\r\n":
                    break
                id = reply.split(b"\r\n")[1].split(b" ")[0].decode()
                answer = w.call(f"complete {id} 0\r\n\r\n".encode())
                # A slow worker may finish a job whose TTR already gave it to another.
                assert answer in (b"+OK\r\n", b"-CLIENT-ERROR Duplicate result\r\n"), answer
                completed.add(id)
            w.close()
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors
    assert completed == ids
    for id in ids:
        assert inspect_field(producer, id, "state") == b"1"
    producer.close()
