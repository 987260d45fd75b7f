"""goqueue and TaskFlux end to end: a real ``queueserver serve`` with 3 shards,
raw bytes over TCP, as clients written for the original servers would talk;
and the same jobs seen across protocols (workq, goqueue, TaskFlux)."""
from __future__ import annotations

import os
import re
import socket
import struct
import time

import pytest

from queueserver.router import shard_for
from serverproc import ServerProcess, replies_across_shard_restart, wait_for
from wire import (SocketReader, add as workq_add, connection_fixture, names_on_distinct_shards,
                  new_id, qname, queue_exists, workq_wire)

SHARDS = 3


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=SHARDS, protocols=["workq", "goqueue", "taskflux"]).start()
    try:
        yield proc
    finally:
        proc.stop()


def assert_closed(sock: socket.socket, leftover: bytes = b"") -> None:
    """The server closes the connection (after ``leftover`` bytes, if any)."""
    got = b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    else:
        raise AssertionError("connection still open")
    assert got == leftover


# ------------------------------------------------------------------ goqueue
def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def gs(text) -> bytes:
    return (text.encode() if isinstance(text, str) else text) + b"\0"


def g_add(queue, priority=0, ttp=60, data=b"data") -> bytes:
    return gs("ADD") + gs(queue) + u32(priority) + u32(ttp) + u32(len(data)) + data


def g_reserve(queue, timeout=0) -> bytes:
    return gs("RESERVE") + gs(queue) + u32(timeout)


def g_delete(id: int) -> bytes:
    return gs("DELETE") + u64(id)


def g_err(message: str) -> bytes:
    return b"ERROR\0" + message.encode() + b"\0"


def reserved(id: int, priority: int, ttp: int, data: bytes) -> bytes:
    return b"RESERVED\0" + u64(id) + u32(priority) + u32(ttp) + b"reserved\0" + u32(len(data)) + data


class GoWire(SocketReader):
    """Reads whole goqueue replies as raw bytes."""

    def string(self) -> bytes:
        return self.until(b"\0")

    def reply(self) -> bytes:
        word = self.string()
        if word == b"ADDED\0":
            return word + self.exact(8)
        if word == b"ERROR\0":
            return word + self.string()
        if word == b"RESERVED\0":
            head = self.exact(16) + self.string() + self.exact(4)
            return word + head + self.exact(struct.unpack("<I", head[-4:])[0])
        return word  # OK, TIMEOUT

    def add(self, queue, priority=0, ttp=60, data=b"data") -> int:
        reply = self.call(g_add(queue, priority, ttp, data))
        assert reply.startswith(b"ADDED\0") and len(reply) == 14, reply
        return struct.unpack("<Q", reply[6:])[0]


def reserved_fields(reply: bytes):
    """(id, priority, ttp, status, data) of a RESERVED reply."""
    assert reply.startswith(b"RESERVED\0"), reply
    id, priority, ttp = struct.unpack("<QII", reply[9:25])
    end = reply.index(b"\0", 25)
    size = struct.unpack("<I", reply[end + 1:end + 5])[0]
    data = reply[end + 5:]
    assert len(data) == size
    return id, priority, ttp, reply[25:end], data


def go_wire(server) -> "GoWire":
    return GoWire(server.connect("goqueue"))


gq = connection_fixture(go_wire)


gq2 = connection_fixture(go_wire)


# ----------------------------------------------------------------- TaskFlux
def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


def tstr(text) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return i32(len(raw)) + raw


def t_packet(body: bytes) -> bytes:
    return b"D" + i32(len(body)) + body


def t_enqueue(queue, key=0, data=b"data") -> bytes:
    return t_packet(b"E" + tstr(queue) + i64(key) + tstr(data))


def t_dequeue(queue) -> bytes:
    return t_packet(b"D" + tstr(queue))


def t_count(queue) -> bytes:
    return t_packet(b"C" + tstr(queue))


def t_response(body: bytes) -> bytes:
    return b"R" + i32(len(body)) + body


def t_business(kind: int, message: str) -> bytes:
    return t_response(b"E" + bytes([kind]) + tstr(message))


def t_transport(message: str) -> bytes:
    return b"e" + tstr(message)


ENQUEUED = t_response(b"e\x01")
EMPTY = t_response(b"d\x00")
INVALID_NAME = t_business(1, "Invalid queue name: at most 255 characters, ASCII 33 to 126 only")


def t_record(key: int, data: bytes) -> bytes:
    return t_response(b"d\x01" + i64(key) + tstr(data))


def t_size(n: int) -> bytes:
    return t_response(b"c" + i32(n))


class FluxWire(SocketReader):
    """Reads whole TaskFlux packets as raw bytes."""

    def reply(self) -> bytes:
        head = self.exact(5)
        return head + self.exact(struct.unpack(">i", head[1:])[0])


def flux_wire(server) -> "FluxWire":
    return FluxWire(server.connect("taskflux"))


tf = connection_fixture(flux_wire)


wq = connection_fixture(workq_wire)


# ========================================================= goqueue commands
def test_goqueue_connect(gq):
    assert gq.call(b"CONNECT\0") == b"OK\0"
    assert gq.call(b"CONNECT\0") == b"OK\0"


def test_goqueue_add_reserve_delete(gq):
    q = qname()
    id = gq.add(q, priority=1, ttp=60, data=b"123")
    assert gq.call(g_reserve(q, 0)) == reserved(id, 1, 60, b"123")
    assert gq.call(g_delete(id)) == b"OK\0"
    assert gq.call(g_delete(id)) == g_err(f"Job {id} already deleted")
    assert gq.call(g_reserve(q, 1)) == b"TIMEOUT\0"


def test_goqueue_delete_of_an_unknown_id(gq):
    assert gq.call(g_delete(2 ** 64 - 1)) == g_err(f"Job {2 ** 64 - 1} already deleted")
    assert gq.call(g_delete(0)) == b"ERROR\0Job 0 already deleted\0"


def test_goqueue_ids_are_unique_and_increase_within_a_queue(gq):
    """Each shard makes numbers of its own residue class (no coordination on
    the direct path): unique everywhere, increasing within one queue."""
    names = names_on_distinct_shards(SHARDS, SHARDS)
    ids = {name: [gq.add(name) for _ in range(3)] for name in names}
    everything = [id for each in ids.values() for id in each]
    assert len(set(everything)) == len(everything) and min(everything) >= 1
    for each in ids.values():
        assert each == sorted(each)


def test_goqueue_lowest_priority_first_fifo_within(gq):
    q = qname()
    jobs = [(5, b"five-a"), (1, b"one-a"), (3, b"three"), (1, b"one-b"), (5, b"five-b"),
            (0, b"zero"), (2 ** 32 - 1, b"max"), (1, b"one-c")]
    for priority, data in jobs:
        gq.add(q, priority=priority, data=data)
    got = [reserved_fields(gq.call(g_reserve(q, 0)))[4] for _ in jobs]
    assert got == [b"zero", b"one-a", b"one-b", b"one-c", b"three", b"five-a", b"five-b", b"max"]


def test_goqueue_reserve_times_out(gq):
    assert gq.call(g_reserve(qname(), 1)) == b"TIMEOUT\0"


def test_goqueue_reserve_without_timeout_waits_for_an_add(gq, gq2, wq):
    q = qname()
    gq.send(g_reserve(q, 0))
    wait_for(lambda: queue_exists(wq, q), what="the RESERVE to park")
    id = gq2.add(q, priority=7, ttp=30, data=b"late")
    assert gq.reply() == reserved(id, 7, 30, b"late")


def test_goqueue_ttp_returns_an_unfinished_job(gq, gq2):
    q = qname()
    id = gq.add(q, priority=0, ttp=1, data=b"slow")
    assert gq.call(g_reserve(q, 0)) == reserved(id, 0, 1, b"slow")
    # Not deleted within its TTP: another worker gets it again.
    assert gq2.call(g_reserve(q, 10)) == reserved(id, 0, 1, b"slow")
    assert gq2.call(g_delete(id)) == b"OK\0"


def test_goqueue_delete_of_a_reserved_job_stops_its_ttp(gq):
    q = qname()
    id = gq.add(q, ttp=1)
    gq.call(g_reserve(q, 0))
    assert gq.call(g_delete(id)) == b"OK\0"
    assert gq.call(g_reserve(q, 2)) == b"TIMEOUT\0"


def test_goqueue_delete_reaches_jobs_on_every_shard(gq, gq2, wq):
    names = names_on_distinct_shards(SHARDS, SHARDS)
    ids = [gq.add(name, data=name.encode()) for name in names]
    for id in ids:
        assert gq2.call(g_delete(id)) == b"OK\0"
    for name in names:
        assert wq.call(f"inspect queue {name}\r\n".encode()) == \
            f"+OK 1\r\n{name} 2\r\nready-len 0\r\nscheduled-len 0\r\n".encode()
    for id in ids:
        assert gq.call(g_delete(id)) == g_err(f"Job {id} already deleted")


def test_goqueue_unknown_command_keeps_the_connection(gq):
    assert gq.call(b"STATS\0") == b"ERROR\0Unknown Command STATS\0"
    assert gq.call(b"CONNECT\0") == b"OK\0"


def test_goqueue_lowercase_command_errors_then_closes(server):
    sock = server.connect("goqueue")
    try:
        sock.sendall(b"connect\0CONNECT\0")
        assert_closed(sock, b"ERROR\0Unknown Command connect\0")
    finally:
        sock.close()


def test_goqueue_binary_junk_errors_then_closes(server):
    sock = server.connect("goqueue")
    try:
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(100))
        got = b""
        while not got.endswith(b"\0") or got.count(b"\0") < 2:
            chunk = sock.recv(4096)
            assert chunk, got
            got += chunk
        assert got.startswith(b"ERROR\0")
        assert_closed(sock)
    finally:
        sock.close()


def test_goqueue_empty_queue_name_on_add(gq):
    assert gq.call(g_add("", 1, 1, b"x")) == b"ERROR\0Error adding new job to queue \0"
    assert gq.call(b"CONNECT\0") == b"OK\0"


def test_goqueue_data_of_one_mebibyte_round_trips(gq):
    q = qname()
    data = os.urandom(1048576)
    id = gq.add(q, data=data)
    assert gq.call(g_reserve(q, 0)) == reserved(id, 0, 60, data)


def test_goqueue_data_over_one_mebibyte_errors_then_closes(server):
    sock = server.connect("goqueue")
    try:
        sock.sendall(gs("ADD") + gs("q") + u32(0) + u32(0) + u32(1048577))
        assert_closed(sock, b"ERROR\0Malformed ADD command: job data longer than 1048576 bytes\0")
    finally:
        sock.close()


def test_goqueue_queue_name_over_64k_errors_then_closes(server):
    sock = server.connect("goqueue")
    try:
        sock.sendall(gs("RESERVE") + b"n" * 65537)
        assert_closed(sock, b"ERROR\0Malformed RESERVE command: queue name longer than 65536 bytes\0")
    finally:
        sock.close()


def test_goqueue_pipelined_requests_are_all_answered_in_order(gq):
    names = names_on_distinct_shards(SHARDS, SHARDS)
    batch = b"CONNECT\0"
    expected_data = []
    for i in range(30):
        data = f"job-{i}".encode()
        batch += g_add(names[i % 3], priority=i, data=data)
        expected_data.append(data)
    batch += b"NOPE\0"
    for i in range(30):
        batch += g_reserve(names[i % 3], 0)
    batch += g_add("", 0, 0, b"") + b"CONNECT\0"
    gq.send(batch)
    assert gq.reply() == b"OK\0"
    ids = []
    for _ in range(30):
        reply = gq.reply()
        assert reply.startswith(b"ADDED\0")
        ids.append(struct.unpack("<Q", reply[6:])[0])
    assert len(set(ids)) == 30
    for k in range(3):   # numbers increase within each queue (each shard makes its own)
        assert ids[k::3] == sorted(ids[k::3])
    assert gq.reply() == b"ERROR\0Unknown Command NOPE\0"
    got = [reserved_fields(gq.reply()) for _ in range(30)]
    # Each queue's jobs come back lowest priority (= earliest here) first.
    assert [(g[0], g[4]) for g in got] == list(zip(ids, expected_data))
    assert gq.reply() == b"ERROR\0Error adding new job to queue \0"
    assert gq.reply() == b"OK\0"
    gq.send(b"".join(g_delete(id) for id in ids) + g_delete(ids[0]))
    for _ in ids:
        assert gq.reply() == b"OK\0"
    assert gq.reply() == g_err(f"Job {ids[0]} already deleted")


def test_goqueue_request_split_into_single_bytes(gq):
    q = qname()
    for byte in g_add(q, 3, 9, b"dribble"):
        gq.send(bytes([byte]))
    reply = gq.reply()
    assert reply.startswith(b"ADDED\0")
    id = struct.unpack("<Q", reply[6:])[0]
    assert gq.call(g_reserve(q, 0)) == reserved(id, 3, 9, b"dribble")


# ======================================================== TaskFlux commands
def test_taskflux_enqueue_count_dequeue(tf):
    q = qname()
    assert tf.call(t_enqueue(q, 7, b"payload")) == ENQUEUED
    assert tf.call(t_enqueue(q, -2, b"")) == ENQUEUED
    assert tf.call(t_count(q)) == t_size(2)
    assert tf.call(t_dequeue(q)) == t_record(-2, b"")
    assert tf.call(t_dequeue(q)) == t_record(7, b"payload")
    assert tf.call(t_count(q)) == t_size(0)
    assert tf.call(t_dequeue(q)) == EMPTY   # the queue exists, it is empty


def test_taskflux_exact_bytes(tf):
    q = "exact-" + new_id()[:8]
    assert tf.call(t_enqueue(q, 1, b"ab")) == b"R\x00\x00\x00\x02e\x01"
    assert tf.call(t_count(q)) == b"R\x00\x00\x00\x05c\x00\x00\x00\x01"
    assert tf.call(t_dequeue(q)) == (b"R\x00\x00\x00\x10d\x01\x00\x00\x00\x00\x00\x00\x00\x01"
                                     b"\x00\x00\x00\x02ab")
    assert tf.call(t_dequeue(q)) == b"R\x00\x00\x00\x02d\x00"


def test_taskflux_smallest_key_first_fifo_within_a_key(tf):
    q = qname()
    records = [(5, b"five-a"), (-1, b"minus-a"), (5, b"five-b"), (0, b"zero"), (-1, b"minus-b"),
               (2 ** 63 - 1, b"max"), (-(2 ** 63), b"min"), (0, b"zero-b")]
    for key, data in records:
        assert tf.call(t_enqueue(q, key, data)) == ENQUEUED
    expected = sorted(range(len(records)), key=lambda i: records[i][0])  # stable: FIFO
    for i in expected:
        assert tf.call(t_dequeue(q)) == t_record(*records[i])
    assert tf.call(t_dequeue(q)) == EMPTY


def test_taskflux_missing_queue_is_type_2(tf):
    q = qname("never")
    assert tf.call(t_count(q)) == t_business(2, f"Queue {q} does not exist")
    assert tf.call(t_dequeue(q)) == t_business(2, f"Queue {q} does not exist")
    assert tf.call(t_enqueue(q, 1)) == ENQUEUED   # Enqueue creates it
    assert tf.call(t_count(q)) == t_size(1)


def test_taskflux_invalid_names_are_type_1(tf):
    for name in ("has space", "x" * 256, "ümlaut", "tab\t"):
        assert tf.call(t_enqueue(name)) == INVALID_NAME
        assert tf.call(t_dequeue(name)) == INVALID_NAME
        assert tf.call(t_count(name)) == INVALID_NAME
    assert tf.call(t_count("x" * 255)) == t_business(2, f"Queue {'x' * 255} does not exist")


def test_taskflux_empty_name_always_exists(tf):
    assert tf.call(t_count("")) == t_size(0)
    assert tf.call(t_dequeue("")) == EMPTY
    assert tf.call(t_enqueue("", 3, b"in the default queue")) == ENQUEUED
    assert tf.call(t_count("")) == t_size(1)
    assert tf.call(t_dequeue("")) == t_record(3, b"in the default queue")


def test_taskflux_malformed_body_keeps_the_connection(tf):
    assert tf.call(t_packet(b"X")) == t_transport("Malformed request: unknown command marker 0x58")
    assert tf.call(t_packet(b"")) == t_transport("Malformed request: empty body")
    assert tf.call(t_packet(b"E" + tstr("q") + b"\x00")) == t_transport("Malformed request: truncated key")
    assert tf.call(t_count(qname("never"))).startswith(b"R")


def test_taskflux_unknown_marker_errors_then_closes(server):
    sock = server.connect("taskflux")
    try:
        sock.sendall(b"A\x4e" + t_count("q"))
        assert_closed(sock, t_transport("Unknown packet marker 0x41"))
    finally:
        sock.close()


def test_taskflux_negative_length_errors_then_closes(server):
    sock = server.connect("taskflux")
    try:
        sock.sendall(b"D" + i32(-5))
        assert_closed(sock, t_transport("Invalid packet length -5"))
    finally:
        sock.close()


def test_taskflux_oversized_length_errors_then_closes(server):
    sock = server.connect("taskflux")
    try:
        sock.sendall(b"D" + i32(2 ** 31 - 1))
        assert_closed(sock, t_transport(f"Packet length {2 ** 31 - 1} exceeds the limit of 1114112 bytes"))
    finally:
        sock.close()


def test_taskflux_one_mebibyte_record_round_trips(tf):
    q = qname()
    data = os.urandom(1048576)
    assert tf.call(t_enqueue(q, 1, data)) == ENQUEUED
    assert tf.call(t_dequeue(q)) == t_record(1, data)


def test_taskflux_pipelined_packets_are_all_answered_in_order(tf):
    names = names_on_distinct_shards(SHARDS, SHARDS)
    batch = b""
    for i in range(30):
        batch += t_enqueue(names[i % 3], 100 - i, f"r{i}".encode())
    batch += t_packet(b"?") + t_count("bad name")
    batch += b"".join(t_count(name) for name in names)
    batch += b"".join(t_dequeue(names[i % 3]) for i in range(30))
    batch += b"".join(t_dequeue(name) for name in names)
    tf.send(batch)
    for _ in range(30):
        assert tf.reply() == ENQUEUED
    assert tf.reply() == t_transport("Malformed request: unknown command marker 0x3f")
    assert tf.reply() == INVALID_NAME
    for _ in names:
        assert tf.reply() == t_size(10)
    # Per queue, the highest key (enqueued first) comes out last.
    per_queue = {name: sorted(((100 - i, f"r{i}".encode()) for i in range(30) if i % 3 == n))
                 for n, name in enumerate(names)}
    for i in range(30):
        assert tf.reply() == t_record(*per_queue[names[i % 3]].pop(0))
    for _ in names:
        assert tf.reply() == EMPTY


def test_taskflux_packet_split_into_single_bytes(tf):
    q = qname()
    for byte in t_enqueue(q, 4, b"dribble") + t_dequeue(q):
        tf.send(bytes([byte]))
    assert tf.reply() == ENQUEUED
    assert tf.reply() == t_record(4, b"dribble")


# ============================================================ across protocols
def test_workq_job_taken_over_goqueue(wq, gq):
    q = qname("cross")
    id = new_id()
    assert wq.call(workq_add(id, q, b"from workq", ttr=5000, flags="-priority=5")) == b"+OK\r\n"
    got = reserved_fields(gq.call(g_reserve(q, 0)))
    # Priority 5 is "before 0" for workq; goqueue cannot show below 0. TTP = TTR in seconds.
    assert got[1:] == (0, 5, b"reserved", b"from workq")
    assert wq.call(f"inspect job {id}\r\n".encode()).startswith(f"+OK 1\r\n{id} 12\r\n".encode())
    assert gq.call(g_delete(got[0])) == b"OK\0"   # the goqueue id deletes the workq job
    assert wq.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"


def test_workq_job_taken_over_taskflux(wq, tf):
    q = qname("cross")
    id = new_id()
    assert wq.call(workq_add(id, q, b"via workq", flags="-priority=-9")) == b"+OK\r\n"
    assert tf.call(t_count(q)) == t_size(1)
    assert tf.call(t_dequeue(q)) == t_record(9, b"via workq")   # key = -priority
    assert wq.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"  # Dequeue removed it


def test_taskflux_record_leased_over_workq(tf, wq):
    q = qname("cross")
    assert tf.call(t_enqueue(q, 2, b"to workq")) == ENQUEUED
    reply = wq.call(f"lease {q} 1000\r\n".encode())
    m = re.fullmatch(rb"\+OK 1\r\n([0-9a-f-]{36}) (\S+) 8\r\nto workq\r\n", reply)
    assert m and m.group(2) == q.encode(), reply
    id = m.group(1).decode()
    assert wq.call(f"complete {id} 2\r\nok\r\n".encode()) == b"+OK\r\n"
    assert wq.call(f"result {id} 0\r\n".encode()) == f"+OK 1\r\n{id} 1 2\r\nok\r\n".encode()


def test_goqueue_and_taskflux_share_one_order(gq, tf):
    q = qname("cross")
    gq.add(q, priority=3, data=b"g3")
    assert tf.call(t_enqueue(q, 1, b"t1")) == ENQUEUED
    gq.add(q, priority=2, data=b"g2")
    assert tf.call(t_enqueue(q, 3, b"t3")) == ENQUEUED
    # goqueue priority p and TaskFlux key k both map to engine priority -p / -k.
    assert tf.call(t_dequeue(q)) == t_record(1, b"t1")
    assert reserved_fields(gq.call(g_reserve(q, 0)))[1:] == (2, 60, b"reserved", b"g2")
    assert tf.call(t_dequeue(q)) == t_record(3, b"g3")
    got = reserved_fields(gq.call(g_reserve(q, 0)))
    assert got[1:] == (3, 0, b"reserved", b"t3")   # TaskFlux records have no TTP
    assert gq.call(g_delete(got[0])) == b"OK\0"
    assert tf.call(t_count(q)) == t_size(0)


def test_goqueue_reserved_job_is_not_countable_over_taskflux(gq, tf):
    q = qname("cross")
    gq.add(q, ttp=60)
    gq.call(g_reserve(q, 0))
    assert tf.call(t_count(q)) == t_size(0)
    assert tf.call(t_dequeue(q)) == EMPTY


# ================================================================ shard down
def test_a_dead_shard_is_reported_in_each_protocols_error_form():
    # Router-served connections (a shard's direct connections die with it).
    proc = ServerProcess(shards=2, protocols=["goqueue", "taskflux"], extra=["--no-direct-path"]).start()
    try:
        q = "victim-queue"
        shard = shard_for(q, 2)
        gq = GoWire(proc.connect("goqueue"))
        tf = FluxWire(proc.connect("taskflux"))
        unavailable = f"Shard {shard} unavailable"
        unknown = f"Outcome unknown: shard {shard} went down before answering"   # sent just as it died

        def outage(call, request, is_ok) -> list:
            """Kill the shard; collect replies until it answers normally again."""
            return replies_across_shard_restart(proc, shard, lambda: call(request), is_ok)

        replies = outage(gq.call, g_add(q), lambda r: r.startswith(b"ADDED\0"))
        assert g_err(unavailable) in replies
        added = {r for r in replies if r.startswith(b"ADDED\0")}
        assert set(replies) <= {g_err(unavailable), g_err(unknown)} | added
        replies = outage(tf.call, t_enqueue(q), lambda r: r == ENQUEUED)
        assert t_business(0, unavailable) in replies
        assert set(replies) <= {t_business(0, unavailable), t_business(0, unknown), ENQUEUED}
        gq.close()
        tf.close()
    finally:
        proc.stop()
