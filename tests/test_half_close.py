"""Clients that shut down their writing side and then read (``printf ... |
nc -N``, a script that sends its requests and waits): every request read
before the FIN is answered, in order, before the server closes; a request
that would wait stops waiting; a job handed over after the FIN counts only
once the client's kernel acknowledged it, and comes back if the client was
gone. Real server, real sockets, every protocol."""
from __future__ import annotations

import socket
import struct
import time

import pytest

from queueserver.sharding import shard_for
from serverproc import ServerProcess, wait_for
from test_binary_protocols_server import g_add, g_reserve, t_dequeue, t_enqueue, t_record
from test_text_protocols_server import b64
from wire import add, inspect_field, new_id, qname, read_to_eof, workq_wire


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


@pytest.mark.parametrize("protocol", ["workq", "queued", "taskflux"])
def test_a_job_handed_to_a_client_that_closed_for_good_comes_back(server, protocol):
    """A client sends a lease (or a dequeue, which has no acknowledgement),
    then a marker job, and closes without reading: the job it was handed
    counts only once acknowledged, so it is back at its place for the next
    client."""
    q = qname()
    marks = same_shard(q, server.shards)   # the marker needs no move of the connection
    w = workq_wire(server)
    # An answer bigger than what the client's kernel accepts unread: never
    # acknowledged in full, whenever the client closes (even if it is slow to).
    keep = b"k" * 262144
    for i in range(10):
        id = new_id()
        assert w.call(add(id, q, keep)) == b"+OK\r\n"
        request = {"workq": f"lease {q} 5000\r\n".encode() + add(new_id(), marks),
                   "queued": f"USE {q}\nDEQUE\nUSE {marks}\nENQUE ".encode() + b64(b"%d" % i) + b"\n",
                   "taskflux": t_dequeue(q) + t_enqueue(marks, 0, b"%d" % i)}[protocol]
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
