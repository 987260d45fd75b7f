"""The access file through real server processes: every protocol and verb,
an allowed and a refused identity (source networks on loopback: 127.0.0.1
is ``boss``, 127.0.0.2 ``limited``, 127.0.0.3 nobody), jobs named by id or
number whose queue the identity may not see, an unknown client refused at
connect, a reload by SIGHUP while a connection stays open, and the
refusals on ``/metrics``. With the direct path on and off, over 2 shards."""
from __future__ import annotations

import base64
import os
import re
import signal
import socket
import struct
import time
import uuid
from typing import Iterator, List

import pytest

from queueserver.placement import shard_for
from tests.serverproc import ServerProcess, http_get, wait_for

ACL = """
[identities.boss]
networks = ["127.0.0.1/32"]
produce = ["*"]
consume = ["*"]
inspect = ["*"]
admin = ["*"]

[identities.limited]
networks = ["127.0.0.2/32"]
produce = ["open*"]
consume = ["open*"]
inspect = ["open*", "seen*"]
admin = ["open*"]
"""

BOSS, LIMITED, NOBODY = "127.0.0.1", "127.0.0.2", "127.0.0.3"
PROTOCOLS = ("workq", "takeanumber", "goqueue", "queued", "taskflux")


class Client:
    """A blocking client from a chosen source address; ``ask`` sends and reads one answer."""

    def __init__(self, proc: ServerProcess, protocol: str, source: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.settimeout(10)
        self.sock.connect((proc.host, proc.port(protocol)))
        self.buffer = b""

    def ask(self, data: bytes, until: bytes = b"\r\n", size: int = 0) -> bytes:
        self.sock.sendall(data)
        return self.read(until, size)

    def read(self, until: bytes = b"\r\n", size: int = 0) -> bytes:
        """Up to and with ``until`` (and ``size`` more bytes), or ``size`` bytes if no ``until``."""
        while True:
            if until and until in self.buffer:
                end = self.buffer.index(until) + len(until)
                if len(self.buffer) >= end + size:
                    out, self.buffer = self.buffer[:end + size], self.buffer[end + size:]
                    return out
            elif not until and len(self.buffer) >= size:
                out, self.buffer = self.buffer[:size], self.buffer[size:]
                return out
            chunk = self.sock.recv(65536)
            if not chunk:
                out, self.buffer = self.buffer, b""
                return out
            self.buffer += chunk

    def drain(self) -> bytes:
        """What else arrives within a moment (the rest of a long answer)."""
        self.sock.settimeout(0.3)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.buffer += chunk
        except socket.timeout:
            pass
        self.sock.settimeout(10)
        out, self.buffer = self.buffer, b""
        return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module", params=["direct", "forwarded"])
def server(request, tmp_path_factory) -> Iterator[ServerProcess]:
    acl = tmp_path_factory.mktemp("acl") / "access.toml"
    acl.write_text(ACL)
    flag = "--direct-path" if request.param == "direct" else "--no-direct-path"
    with ServerProcess(shards=2, extra=["--acl", str(acl), flag]) as proc:
        proc.acl = acl
        yield proc


# ------------------------------------------------------------------ workq
def workq_add(client: Client, queue: str, body: bytes = b"x") -> bytes:
    id = str(uuid.uuid4())
    reply = client.ask(f"add {id} {queue} 60000 60000 {len(body)}\r\n".encode() + body + b"\r\n")
    return reply if reply != b"+OK\r\n" else id.encode()


def test_workq_by_queue_name(server):
    boss, limited = Client(server, "workq", BOSS), Client(server, "workq", LIMITED)
    denied = b"-CLIENT-ERROR Permission denied: limited may not "
    assert len(workq_add(limited, "open.a")) == 36
    assert workq_add(limited, "secret.a") == denied + b"produce queue secret.a\r\n"
    assert limited.ask(b"lease secret.a 0\r\n") == denied + b"consume queue secret.a\r\n"
    assert limited.ask(b"lease open.a secret.b 0\r\n") == denied + b"consume queue secret.b\r\n"
    assert limited.ask(b"lease open.a 0\r\n").startswith(b"+OK 1\r\n")
    assert b" open.a 1\r\nx\r\n" in limited.drain()
    assert limited.ask(b"inspect queue secret.a\r\n") == denied + b"inspect queue secret.a\r\n"
    assert limited.ask(b"inspect queue open.a\r\n").startswith(b"+OK 1\r\n")
    limited.drain()
    assert limited.ask(b"inspect server\r\n") == denied + b"inspect every queue\r\n"
    assert limited.ask(b"inspect queues 0 10\r\n") == denied + b"inspect every queue\r\n"
    assert boss.ask(b"inspect server\r\n").startswith(b"+OK 1\r\n")
    boss.close()
    limited.close()


@pytest.mark.parametrize("queue, seen", [("secret.j", False), ("seen.j", True)])
def test_workq_jobs_by_id_check_the_jobs_queue(server, queue, seen):
    """complete, fail, delete, result, inspect job: a job of a queue the
    identity may not see is not found; one it may see but not touch is
    refused; either way the job is untouched."""
    boss, limited = Client(server, "workq", BOSS), Client(server, "workq", LIMITED)
    id = workq_add(boss, queue).decode()
    # with the direct path, a request for the job's shard moves the connection there: its shard checks
    beside = next(f"open.{i}" for i in range(100) if shard_for(f"open.{i}", 2) == shard_for(queue, 2))
    assert len(workq_add(limited, beside)) == 36
    refusals = {
        f"complete {id} 1\r\nr\r\n": "consume", f"fail {id} 1\r\nr\r\n": "consume",
        f"delete {id}\r\n": "admin", f"result {id} 0\r\n": "inspect", f"inspect job {id}\r\n": "inspect",
    }
    for request, verb in refusals.items():
        reply = limited.ask(request.encode())
        if seen and verb != "inspect":
            assert reply == f"-CLIENT-ERROR Permission denied: limited may not {verb} queue {queue}\r\n".encode()
        elif seen:   # may inspect it: shown
            assert reply.startswith((b"+OK", b"-TIMEOUT")), (request, reply)
            limited.drain()
        else:
            assert reply == b"-NOT-FOUND\r\n", (request, reply)
    # untouched: still ready in its queue, and the connection still serves
    assert boss.ask(f"inspect job {id}\r\n".encode()).startswith(b"+OK 1\r\n")
    assert b"state 0" in boss.drain()   # ready, never leased, finished or failed
    boss.close()
    mine = workq_add(limited, "open.j")
    assert limited.ask(f"delete {mine.decode()}\r\n".encode()) == b"+OK\r\n"
    assert limited.ask(f"delete {mine.decode()}\r\n".encode()) == b"-NOT-FOUND\r\n"
    limited.close()
    check = Client(server, "workq", BOSS)
    assert check.ask(f"delete {id}\r\n".encode()) == b"+OK\r\n"   # it was still there
    check.close()


def test_workq_complete_of_a_leased_job_elsewhere(server):
    """A job leased by boss in a queue limited may not consume: limited's
    complete does not finish it; boss's does."""
    boss, limited = Client(server, "workq", BOSS), Client(server, "workq", LIMITED)
    id = workq_add(boss, "secret.c").decode()
    assert boss.ask(b"lease secret.c 0\r\n").startswith(b"+OK 1\r\n")
    boss.drain()
    assert limited.ask(f"complete {id} 1\r\nr\r\n".encode()) == b"-NOT-FOUND\r\n"
    assert boss.ask(f"complete {id} 1\r\nr\r\n".encode()) == b"+OK\r\n"
    boss.close()
    limited.close()


# ------------------------------------------------------------ takeanumber
def test_takeanumber(server):
    boss, limited = Client(server, "takeanumber", BOSS), Client(server, "takeanumber", LIMITED)
    assert limited.ask(b"ADD open.t 0 hello\r\n").startswith(b"+")
    assert limited.ask(b"ADD secret.t 0 hello\r\n") == \
        b"-ERR Permission denied: limited may not produce queue secret.t\r\n"
    assert limited.ask(b"LEN secret.t\r\n") == b"-ERR Permission denied: limited may not inspect queue secret.t\r\n"
    secret = boss.ask(b"ADD secret.t 0 hello\r\n")[1:-2].decode()
    assert boss.ask(b"RESERVE secret.t\r\n").startswith(b"+" + secret.encode())
    assert limited.ask(b"RESERVE secret.t\r\n") == \
        b"-ERR Permission denied: limited may not consume queue secret.t\r\n"
    assert limited.ask(f"DONE secret.t {secret}\r\n".encode()) == \
        b"-ERR Permission denied: limited may not consume queue secret.t\r\n"
    assert limited.ask(f"RETRY secret.t {secret}\r\n".encode()) == \
        b"-ERR Permission denied: limited may not consume queue secret.t\r\n"
    assert boss.ask(f"DONE secret.t {secret}\r\n".encode()) == b"+OK\r\n"   # still reserved: boss finishes it
    assert limited.ask(b"LEN open.t\r\n") == b":1\r\n"
    boss.close()
    limited.close()


# ---------------------------------------------------------------- goqueue
def goqueue_add(client: Client, queue: str) -> bytes:
    client.sock.sendall(b"ADD\0" + queue.encode() + b"\0" + struct.pack("<III", 0, 60, 1) + b"x")
    head = client.read(until=b"\0")
    if head == b"ADDED\0":
        return head + client.read(until=b"", size=8)
    return head + client.read(until=b"\0")


def test_goqueue(server):
    boss, limited = Client(server, "goqueue", BOSS), Client(server, "goqueue", LIMITED)
    assert goqueue_add(limited, "open.g").startswith(b"ADDED\0")
    assert goqueue_add(limited, "secret.g") == b"ERROR\0Permission denied: limited may not produce queue secret.g\0"
    added = goqueue_add(boss, "secret.g")
    number = struct.unpack("<Q", added[6:])[0]
    limited.sock.sendall(b"RESERVE\0secret.g\0" + struct.pack("<I", 0))
    assert limited.read(until=b"\0") + limited.read(until=b"\0") == \
        b"ERROR\0Permission denied: limited may not consume queue secret.g\0"
    limited.sock.sendall(b"DELETE\0" + struct.pack("<Q", number))   # a queue it may not see: not found
    assert limited.read(until=b"\0") + limited.read(until=b"\0") == b"ERROR\0" + \
        f"Job {number} already deleted".encode() + b"\0"
    boss.sock.sendall(b"DELETE\0" + struct.pack("<Q", number))   # it was still there
    assert boss.read(until=b"\0") == b"OK\0"
    boss.close()
    limited.close()


# ----------------------------------------------------------------- queued
def test_queued(server):
    limited = Client(server, "queued", LIMITED)
    item = base64.b64encode(b"item")
    assert limited.ask(b"USE secret.q\n", b"\n") == b"ERROR " + base64.b64encode(
        b"Permission denied: limited may not inspect queue secret.q") + b"\n"   # it is in use all the same
    denied = base64.b64encode(b"Permission denied: limited may not produce queue secret.q")
    assert limited.ask(b"ENQUE " + item + b"\n", b"\n") == b"ERROR " + denied + b"\n"
    assert limited.ask(b"DEQUE\n", b"\n") == b"ERROR " + base64.b64encode(
        b"Permission denied: limited may not consume queue secret.q") + b"\n"
    assert limited.ask(b"SIZE\n", b"\n").startswith(b"ERROR ")
    assert limited.ask(b"USE seen.q\n", b"\n") == b"OK\n"   # may see it, may not add to it
    assert limited.ask(b"ENQUE " + item + b"\n", b"\n").startswith(b"ERROR ")
    assert limited.ask(b"USE open.q\n", b"\n") == b"OK\n"
    assert limited.ask(b"ENQUE " + item + b"\n", b"\n") == b"OK\n"
    assert limited.ask(b"SIZE\n", b"\n") == b"SIZE 1\n"
    assert limited.ask(b"DEQUE\n", b"\n") == b"ITEM " + item + b"\n"
    limited.close()


# --------------------------------------------------------------- taskflux
def _tf(body: bytes) -> bytes:
    return b"D" + struct.pack(">i", len(body)) + body


def _tf_string(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


def taskflux_ask(client: Client, body: bytes) -> bytes:
    client.sock.sendall(_tf(body))
    head = client.read(until=b"", size=5)
    return head + client.read(until=b"", size=struct.unpack(">i", head[1:])[0])


def test_taskflux(server):
    boss, limited = Client(server, "taskflux", BOSS), Client(server, "taskflux", LIMITED)
    enqueue = lambda q: b"E" + _tf_string(q) + struct.pack(">q", 5) + _tf_string(b"body")   # noqa: E731
    assert taskflux_ask(boss, enqueue(b"secret.f")) == b"R\0\0\0\x02e\x01"
    assert taskflux_ask(boss, b"C" + _tf_string(b"secret.f")) == b"R\0\0\0\x05c\0\0\0\x01"
    reply = taskflux_ask(limited, b"C" + _tf_string(b"secret.f"))
    assert reply[5:7] == b"E\x00" and b"may not inspect queue secret.f" in reply
    reply = taskflux_ask(limited, enqueue(b"secret.f"))
    assert reply[5:7] == b"E\x00" and b"Permission denied: limited may not produce queue secret.f" in reply
    reply = taskflux_ask(limited, b"D" + _tf_string(b"secret.f"))
    assert reply[5:7] == b"E\x00" and b"may not consume queue secret.f" in reply
    assert taskflux_ask(boss, enqueue(b"secret.f")) == b"R\0\0\0\x02e\x01"
    boss.close()
    limited.close()


# --------------------------------------------------------- at connect
@pytest.mark.parametrize("protocol, refusal", [
    ("workq", b"-SERVER-ERROR Unknown client: not allowed to connect\r\n"),
    ("takeanumber", b"-ERR Unknown client: not allowed to connect\r\n"),
    ("goqueue", b"ERROR\0Unknown client: not allowed to connect\0"),
])
def test_an_unknown_client_is_refused_at_connect(server, protocol, refusal):
    client = Client(server, protocol, NOBODY)
    assert client.read(until=b"", size=len(refusal)) == refusal
    assert client.sock.recv(10) == b""   # and closed
    client.close()
    assert "refused: " in server.log() and "from 127.0.0.3" in server.log()


# ------------------------------------------------------------ reloading
def test_sighup_changes_a_permission_while_a_connection_stays_open(server):
    limited = Client(server, "workq", LIMITED)
    assert workq_add(limited, "later.a").startswith(b"-CLIENT-ERROR Permission denied")
    server.acl.write_text(ACL.replace('produce = ["open*"]', 'produce = ["open*", "later*"]'))
    try:
        os.kill(server.pid, signal.SIGHUP)
        wait_for(lambda: len(workq_add(limited, "later.a")) == 36, timeout=10)
        server.acl.write_text("[identities.limited\n")   # a bad file: the rules stay
        os.kill(server.pid, signal.SIGHUP)
        wait_for(lambda: "the access rules stay as they were" in server.log(), timeout=10)
        assert len(workq_add(limited, "later.b")) == 36
    finally:
        server.acl.write_text(ACL)
        os.kill(server.pid, signal.SIGHUP)
        wait_for(lambda: workq_add(limited, "later.c").startswith(b"-CLIENT-ERROR"), timeout=10)
        limited.close()


# --------------------------------------------------------------- metrics
def test_refusals_are_on_metrics(server):
    limited = Client(server, "workq", LIMITED)
    workq_add(limited, "secret.m")
    limited.close()
    Client(server, "workq", NOBODY).close()

    def counted() -> List[str]:
        text = http_get(server, "/metrics").decode()
        return re.findall(r'queueserver_access_refusals_total\{[^}]*\} [0-9.e+]+', text)

    def has(identity: str, verb: str) -> bool:
        return any(f'identity="{identity}"' in line and f'verb="{verb}"' in line and
                   float(line.rsplit(" ", 1)[1]) >= 1 for line in counted())

    wait_for(lambda: has("limited", "produce") and has("unknown", "connect"), timeout=10, what=lambda: str(counted()))
    assert not has("boss", "produce")
