"""Clients that shut down their writing side and then read (``printf ... |
nc -N``, a script that sends its requests and waits): every request read
before the FIN is answered, in order, before the server closes; a request
that would wait stops waiting; a job leased after the FIN counts only once
the client's kernel acknowledged it, and comes back if the client was gone;
a job taken (queued, TaskFlux: destructive) counts once its answer was
written whole, and comes back only if it was not. Real server, real
sockets, every protocol."""
from __future__ import annotations

import base64
import socket
import struct
import time

import pytest

from queueserver.placement import shard_for
from serverproc import ServerProcess, wait_for
from test_binary_protocols_server import (ENQUEUED, g_add, g_reserve, t_count, t_dequeue, t_enqueue, t_record,
                                          t_size)
from test_text_protocols_server import b64
from wire import add, inspect_field, new_id, qname, read_exactly, read_to_eof, workq_wire


@pytest.fixture
def server():
    proc = ServerProcess(shards=2).start()
    yield proc
    proc.stop()


def same_shard(name: str, shards: int) -> str:
    """A fresh queue name on the shard of queue ``name``."""
    while True:
        other = qname()
        if shard_for(other, shards) == shard_for(name, shards):
            return other


def half_closed(server, protocol: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data``, shut down the writing side, and read until the server
    closes: everything it answered."""
    sock = server.connect(protocol)
    sock.settimeout(timeout)
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    got = read_to_eof(sock)
    sock.close()
    return got


def test_workq_inspect_through_a_half_closed_connection(server):
    q = qname()
    w = workq_wire(server)
    assert w.call(add(new_id(), q)) == b"+OK\r\n"
    w.close()
    reply = half_closed(server, "workq", f"inspect queue {q}\r\n".encode())
    assert reply == f"+OK 1\r\n{q} 2\r\nready-len 1\r\nscheduled-len 0\r\n".encode()
    # the README's by-hand example: printf 'inspect queues 0 10\r\n' | nc -N 127.0.0.1 9922
    reply = half_closed(server, "workq", b"inspect queues 0 10\r\n")
    assert reply == f"+OK 1\r\n{q} 2\r\nready-len 1\r\nscheduled-len 0\r\n".encode()


def test_a_half_closed_producer_has_every_add_acknowledged(server):
    q = qname()
    ids = [new_id() for _ in range(3)]
    assert half_closed(server, "workq", b"".join(add(id, q) for id in ids)) == b"+OK\r\n" * 3
    reply = half_closed(server, "takeanumber", b"".join(f"ADD {q} 1 job{i}\r\n".encode() for i in range(3)))
    lines = reply.split(b"\r\n")
    assert len(lines) == 4 and lines[-1] == b"" and all(line.startswith(b"+") for line in lines[:3]), reply
    w = workq_wire(server)
    assert w.call(f"inspect queue {q}\r\n".encode()).endswith(b"ready-len 6\r\nscheduled-len 0\r\n")
    w.close()


def test_the_binary_and_queued_protocols_answer_before_closing(server):
    q = qname()
    reply = half_closed(server, "goqueue", g_add(q, data=b"one") + g_add(q, data=b"two"))
    assert reply[:6] == b"ADDED\0" and reply[14:20] == b"ADDED\0" and len(reply) == 28, reply
    assert half_closed(server, "queued", f"USE {q}\nENQUE ".encode() + b64(b"x") + b"\nSIZE\n") == \
        b"OK\nOK\nSIZE 3\n"
    assert half_closed(server, "taskflux", t_enqueue(q, 1, b"flux")) == b"R\x00\x00\x00\x02e\x01"


def test_a_lease_through_a_half_closed_connection_is_delivered_and_stays_leased(server):
    q, id = qname(), new_id()
    w = workq_wire(server)
    assert w.call(add(id, q)) == b"+OK\r\n"
    reply = half_closed(server, "workq", f"lease {q} 5000\r\n".encode())
    assert reply == f"+OK 1\r\n{id} {q} 4\r\ndata\r\n".encode()
    time.sleep(0.3)   # a give-back would have happened by now
    assert inspect_field(w, id, "state") == b"4"      # leased (4), by the client that read it
    w.close()


def test_a_waiting_request_stops_waiting_at_the_fin(server):
    """Nothing more can come from the client: its blocking lease is answered
    at once, as its timeout would answer it, and the connection closes."""
    started = time.monotonic()
    assert half_closed(server, "workq", f"lease {qname()} 60000\r\n".encode()) == b"-TIMEOUT\r\n"
    assert half_closed(server, "goqueue", g_reserve(qname(), 60)) == b"TIMEOUT\0"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("protocol", ["workq"])
def test_a_job_handed_to_a_client_that_closed_for_good_comes_back(server, protocol):
    """A client sends a lease, then a marker job, and closes without
    reading: the job it was leased counts only once acknowledged, so it is
    back at its place for the next client."""
    q = qname()
    marks = same_shard(q, server.shards)   # the marker needs no move of the connection
    w = workq_wire(server)
    # An answer bigger than what the client's kernel accepts unread: never
    # acknowledged in full, whenever the client closes (even if it is slow to).
    keep = b"k" * 262144
    for i in range(10):
        id = new_id()
        assert w.call(add(id, q, keep)) == b"+OK\r\n"
        request = {"workq": f"lease {q} 5000\r\n".encode() + add(new_id(), marks)}[protocol]
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((server.host, server.port(protocol)))
        sock.sendall(request)
        sock.close()   # without reading
        # the marker is there: the lease (or dequeue) before it was executed
        wait_for(lambda: w.call(f"inspect queue {marks}\r\n".encode()).endswith(
            f"ready-len {i + 1}\r\nscheduled-len 0\r\n".encode()), 10, "the marker job")
        wait_for(lambda: w.call(f"inspect queue {q}\r\n".encode()).endswith(
            b"ready-len 1\r\nscheduled-len 0\r\n"), 10, "the job to be back in line")
        assert inspect_field(w, id, "state") == b"0" and inspect_field(w, id, "attempts") == b"0"
        assert w.call(f"delete {id}\r\n".encode()) == b"+OK\r\n"
    w.close()


def _read_line(sock: socket.socket) -> bytes:
    """One line, read without reading past it (peek, then take)."""
    line = b""
    while not line.endswith(b"\n"):
        ahead = sock.recv(1 << 20, socket.MSG_PEEK)
        assert ahead, "closed early"
        end = ahead.find(b"\n")
        line += read_exactly(sock, end + 1 if end >= 0 else len(ahead))
    return line


@pytest.mark.parametrize("protocol", ["queued", "taskflux"])
def test_a_take_read_whole_then_reset_is_not_delivered_again(server, protocol):
    """A take (queued's DEQUE, TaskFlux's dequeue) is destructive: once its
    answer was written whole it is delivered, even when the client resets
    at once after reading it, before its kernel's delayed ACK left."""
    q = qname()
    producer = server.connect(protocol)
    producer.settimeout(10)
    if protocol == "queued":
        producer.sendall(f"USE {q}\n".encode())
        assert read_exactly(producer, 3) == b"OK\n"
    for i in range(40):
        payload = b"item-%d" % i
        if protocol == "queued":
            producer.sendall(b"ENQUE " + b64(payload) + b"\n")
            assert read_exactly(producer, 3) == b"OK\n"
            first, first_answer = f"USE {q}\n".encode(), b"OK\n"
            take, answer = b"DEQUE\n", b"ITEM " + b64(payload) + b"\n"
        else:
            producer.sendall(t_enqueue(q, 0, payload))
            assert read_exactly(producer, len(ENQUEUED)) == ENQUEUED
            first, first_answer = t_count(q), t_size(1)
            take, answer = t_dequeue(q), t_record(0, payload)
        consumer = server.connect(protocol)
        consumer.settimeout(10)
        # One exchange first: the client's kernel then delays its ACKs (a
        # new connection's first answers are acknowledged at once).
        consumer.sendall(first)
        assert read_exactly(consumer, len(first_answer)) == first_answer
        consumer.sendall(take)
        assert read_exactly(consumer, len(answer)) == answer
        if i % 2:
            time.sleep(0.01)
        consumer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        consumer.close()   # a reset, likely before the delayed ACK of the answer left
        time.sleep(0.05)
        # the job was delivered once: the queue stays empty
        if protocol == "queued":
            producer.sendall(b"SIZE\n")
            assert read_exactly(producer, 7) == b"SIZE 0\n", i
        else:
            producer.sendall(t_count(q))
            assert read_exactly(producer, len(t_size(0))) == t_size(0), i
    producer.close()


@pytest.mark.parametrize("protocol", ["queued", "taskflux"])
def test_takes_whose_answers_were_not_written_whole_come_back(server, protocol):
    """A client pipelines more dequeues of big jobs than the kernels'
    buffers hold and resets without reading: the takes whose answers were
    written whole are delivered (gone), the rest come back at their places,
    so what is left is the line's tail, in order, none lost, none twice."""
    q = qname()
    big = 262144
    count = 40          # ~10 MiB of answers: more than both kernels buffer unread
    w = server.connect(protocol)
    w.settimeout(10)
    if protocol == "queued":
        w.sendall(f"USE {q}\n".encode())
        assert read_exactly(w, 3) == b"OK\n"
    for i in range(count):
        payload = b"%04d" % i + b"j" * big
        if protocol == "queued":
            w.sendall(b"ENQUE " + b64(payload) + b"\n")
            assert read_exactly(w, 3) == b"OK\n"
        else:
            w.sendall(t_enqueue(q, 0, payload))
            assert read_exactly(w, len(ENQUEUED)) == ENQUEUED
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((server.host, server.port(protocol)))
    takes = (f"USE {q}\n".encode() + b"DEQUE\n" * count) if protocol == "queued" else t_dequeue(q) * count
    sock.sendall(takes)
    time.sleep(0.5)      # the server executes what it can and fills the buffers
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()         # a reset: what the kernels held is lost with it
    size = (lambda: w.sendall(b"SIZE\n") or _read_line(w)) if protocol == "queued" else \
        (lambda: w.sendall(t_count(q)) or read_exactly(w, len(t_size(0))))
    sizes = [size()]
    while len(sizes) < 3 or len(set(sizes[-3:])) > 1:   # every take given back is back
        time.sleep(0.1)
        sizes.append(size())
    left = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if protocol == "queued":
            w.sendall(b"DEQUE\n")
            line = _read_line(w)
            if line == b"ERROR cXVldWUgaXMgZW1wdHk=\n":
                break
            left.append(base64.b64decode(line[5:-1])[:4])
        else:
            w.sendall(t_dequeue(q))
            head = read_exactly(w, 5)
            body = read_exactly(w, struct.unpack(">i", head[1:])[0])
            if body[:2] != b"d\x01":   # a record (an empty queue answers d, 0)
                break
            left.append(body[14:18])   # d, 1, key (8), length (4), then the data
    w.close()
    assert left, "every take counted as delivered: the unwritten ones were lost"
    first = int(left[0])
    assert left == [b"%04d" % i for i in range(first, count)], b" ".join(left)
    assert first > 0, "no take was delivered: the kernels' buffers took nothing"
