"""A raw workq wire reader for tests: sends bytes, reads exactly one reply.

It parses replies the way a client written for the original server does
(line, then length-prefixed blocks), so tests compare exact bytes.
"""
from __future__ import annotations

import socket
import threading
import uuid
from abc import ABC, abstractmethod
from typing import Dict, Tuple


def new_id() -> str:
    return str(uuid.uuid4())


def qname(prefix: str = "q") -> str:
    """A fresh queue name, so tests sharing a server never share a queue."""
    return f"{prefix}-{new_id()[:8]}"


def names_on_distinct_shards(shards: int, count: int):
    """Queue names that hash to ``count`` different shards (at most ``shards``)."""
    from queueserver.router import shard_for
    found = {}
    i = 0
    while len(found) < min(count, shards):
        name = f"spread-{new_id()[:6]}-{i}"
        found.setdefault(shard_for(name, shards), name)
        i += 1
    return list(found.values())


class SocketReader(ABC):
    """A client socket with a receive buffer: each protocol's test wire reads
    its replies with ``until`` and ``exact``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def until(self, sep: bytes) -> bytes:
        """Everything up to and including the next ``sep``."""
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        data, self.buf = self.buf[:i], self.buf[i:]
        return data

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def call(self, data: bytes) -> bytes:
        self.send(data)
        return self.reply()

    @abstractmethod
    def reply(self) -> bytes:
        """One whole reply of the wire's protocol, as bytes."""

    def close(self) -> None:
        self.sock.close()


class Wire(SocketReader):
    """workq."""

    def line(self) -> bytes:
        return self.until(b"\r\n")

    def reply(self) -> bytes:
        """One whole workq reply, as bytes."""
        first = self.line()
        if not first.startswith(b"+OK ") :
            return first
        count = int(first[4:-2])
        out = [first]
        for _ in range(count):
            head = self.line()
            out.append(head)
            parts = head[:-2].split(b" ")
            if len(parts) == 3:  # lease / result / run: "<id> <x> <size>" then a block
                out.append(self.exact(int(parts[2]) + 2))
                continue
            payload_size = 0
            for _ in range(int(parts[1])):  # inspect: "<id|name> <key-count>" then keys
                key_line = self.line()
                if key_line.startswith(b"payload-size "):
                    payload_size = int(key_line[13:-2])
                elif key_line.startswith(b"payload "):
                    # the payload may hold CRLF: trust payload-size
                    missing = payload_size - (len(key_line) - len(b"payload ") - 2)
                    if missing > 0:
                        key_line += self.exact(missing) + self.line()
                out.append(key_line)
        return b"".join(out)



def connection_fixture(make):
    """A pytest fixture: ``make(server)`` opens a wire; the test closes nothing."""
    import pytest

    @pytest.fixture
    def fixture(server):
        w = make(server)
        yield w
        w.close()
    return fixture


def workq_wire(server) -> Wire:
    return Wire(server.connect("workq"))


def inspect_field(w: Wire, id: str, key: str) -> bytes:
    """One key of ``inspect job`` over workq."""
    reply = w.call(f"inspect job {id}\r\n".encode())
    for line in reply.split(b"\r\n"):
        if line.startswith(key.encode() + b" "):
            return line.split(b" ", 1)[1]
    raise AssertionError(f"{key} not in {reply!r}")


def add(id: str, name: str = "q", payload: bytes = b"data", ttr: int = 10000, ttl: int = 60000,
        flags: str = "") -> bytes:
    flags = f" {flags}" if flags else ""
    return f"add {id} {name} {ttr} {ttl} {len(payload)}{flags}\r\n".encode() + payload + b"\r\n"


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return got
        got += chunk


def read_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes of what the server sends (it closing first fails the test)."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "server closed the connection"
        data += chunk
    return data


def racing_adds(id: str, first: "Tuple[Wire, str]", second: "Tuple[Wire, str]") -> Dict[str, bytes]:
    """``add id`` sent at the same instant over two connections, each to its
    queue (``(wire, queue)``): each queue's reply."""
    start = threading.Barrier(2)
    replies: Dict[str, bytes] = {}

    def send(wire: Wire, name: str) -> None:
        start.wait()
        replies[name] = wire.call(add(id, name))

    threads = [threading.Thread(target=send, args=pair) for pair in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return replies


def queue_exists(w: Wire, name: str) -> bool:
    """Whether a shard holds queue ``name`` (over workq): a lease on it, even
    one that parks, makes it, so this tells that the lease reached its shard."""
    return w.call(f"inspect queue {name}\r\n".encode()) != b"-NOT-FOUND\r\n"


def server_stat(w: Wire, key: str) -> int:
    """One count of ``inspect server`` over workq: ``active-clients`` (every
    router's clients) or ``evicted-jobs``."""
    reply = w.call(b"inspect server\r\n")
    return int(reply.split(f"{key} ".encode())[1].split(b"\r\n")[0])


def line_exchange(port: int, *lines: bytes) -> list:
    """Send each line on one new connection and read one answer line after
    each (takeanumber and other line protocols)."""
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        reader = sock.makefile("rb")
        answers = []
        for line in lines:
            sock.sendall(line)
            answers.append(reader.readline())
        return answers
