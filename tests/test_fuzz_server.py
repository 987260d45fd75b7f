"""Random bytes at every port of a real server: it stays up, no process
restarts, nothing is logged as a crash, and a well-behaved client on the
same port is served correctly all the while."""
from __future__ import annotations

import os
import random
import socket
import struct
import threading

import pytest

from serverproc import ServerProcess
from wire import Wire, add, new_id, qname, read_exactly

PROTOCOLS = ["workq", "takeanumber", "goqueue", "queued", "taskflux"]
SEED = int(os.environ.get("QS_FUZZ_SEED", "20261123"))


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=2, protocols=PROTOCOLS).start()
    yield proc
    proc.stop()


def junk(rng: random.Random) -> bytes:
    """Random bytes, salted with what the protocols treat specially."""
    pieces = []
    for _ in range(rng.randint(1, 40)):
        kind = rng.random()
        if kind < 0.5:
            pieces.append(rng.randbytes(rng.randint(0, 300)))
        elif kind < 0.7:
            pieces.append(rng.choice([b"\r\n", b"\n", b"\0", b" ", b"D", b"E", b"R", b"\xff" * 8]))
        else:
            pieces.append(rng.choice([b"add ", b"lease ", b"ADD ", b"RESERVE\0", b"ENQUE ", b"USE ",
                                      b"inspect queues 0 ", b"DELETE\0", b"CONNECT\0", b"999999999"]))
    return b"".join(pieces)


def hammer(proc: ServerProcess, protocol: str, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    for _ in range(rounds):
        try:
            sock = socket.create_connection(("127.0.0.1", proc.port(protocol)), timeout=2)
        except OSError:
            continue
        try:
            sock.sendall(junk(rng))
            sock.settimeout(0.05)
            while sock.recv(65536):
                pass
        except OSError:
            pass
        finally:
            sock.close()


def well_behaved(proc: ServerProcess, protocol: str) -> None:
    """One correct round trip in ``protocol``, checked byte for byte."""
    name = qname("fz")
    sock = socket.create_connection(("127.0.0.1", proc.port(protocol)), timeout=10)
    try:
        if protocol == "workq":
            w = Wire(sock)
            id = new_id()
            assert w.call(add(id, name, b"ok")) == b"+OK\r\n"
            assert w.call(f"lease {name} 1000\r\n".encode()) == f"+OK 1\r\n{id} {name} 2\r\nok\r\n".encode()
        elif protocol == "takeanumber":
            sock.sendall(f"ADD {name} 0 ok\r\nLEN {name}\r\n".encode())
            assert _read(sock, 2, b"\r\n")[1] == b":1\r\n"
        elif protocol == "goqueue":
            sock.sendall(b"CONNECT\0")
            assert read_exactly(sock, 3) == b"OK\0"
        elif protocol == "queued":
            sock.sendall(f"USE {name}\nENQUE b2s=\nSIZE\n".encode())
            assert _read(sock, 3, b"\n") == [b"OK\n", b"OK\n", b"SIZE 1\n"]
        else:
            body = b"C" + struct.pack(">i", 0)
            sock.sendall(b"D" + struct.pack(">i", len(body)) + body)
            assert read_exactly(sock, 10) == b"R" + struct.pack(">i", 5) + b"c" + struct.pack(">i", 0)
    finally:
        sock.close()




def _read(sock: socket.socket, lines: int, eol: bytes) -> list:
    data = b""
    while data.count(eol) < lines:
        chunk = sock.recv(65536)
        assert chunk, "server closed the connection"
        data += chunk
    return [part + eol for part in data.split(eol)[:lines]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_random_bytes_leave_the_server_up_and_others_served(server, protocol):
    pids = server.child_pids()
    threads = [threading.Thread(target=hammer, args=(server, protocol, SEED + i, 25)) for i in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(10):
        well_behaved(server, protocol)
    for thread in threads:
        thread.join(60)
    well_behaved(server, protocol)
    assert server.child_pids() == pids, "a process was restarted"
    log = server.log()
    assert "Traceback" not in log and "exited with status" not in log, log[-3000:]
