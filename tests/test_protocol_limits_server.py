"""The one payload limit, and the framing rules every protocol shares, through a
real ``queueserver serve``: each protocol takes exactly ``max_payload`` bytes
(1048576 by default, or as configured) and refuses one byte more with its own error, in step
with the requests that follow (one request, one reply, whatever its size)."""
from __future__ import annotations

import base64
import struct

import pytest

from serverproc import ServerProcess
from wire import SocketReader, Wire, new_id, qname

DEFAULT = 1048576


@pytest.fixture(scope="module", params=[DEFAULT, 1000], ids=["default", "configured"])
def limit(request) -> int:
    return request.param


@pytest.fixture(scope="module")
def server(limit):
    """A server with the default limit, and one started with ``--max-payload 1000``."""
    proc = ServerProcess(shards=1, extra=[] if limit == DEFAULT else ["--max-payload", str(limit)]).start()
    try:
        yield proc
    finally:
        proc.stop()


class Lines(SocketReader):
    """takeanumber (``\\r\\n``) and queued (``\\n``): one line per reply."""

    def reply(self) -> bytes:
        return self.until(b"\n")


class Goqueue(SocketReader):
    def reply(self) -> bytes:
        word = self.until(b"\0")
        if word == b"ADDED\0":
            return word + self.exact(8)
        if word == b"ERROR\0":
            return word + self.until(b"\0")
        return word


class TaskFlux(SocketReader):
    def reply(self) -> bytes:
        head = self.exact(5)
        return head + self.exact(struct.unpack(">i", head[1:])[0])


def wire(server, protocol, kind):
    return kind(server.connect(protocol, timeout=30))


def test_workq_payload_limit(server, limit):
    w = wire(server, "workq", Wire)
    try:
        q = qname()
        for size, reply in ((limit, b"+OK\r\n"),
                            (limit + 1, b"-CLIENT-ERROR Invalid payload size\r\n")):
            w.send(f"add {new_id()} {q} 1000 60000 {size}\r\n".encode() + b"x" * size + b"\r\n")
            assert w.reply() == reply
        assert w.call(f"inspect queue {q}\r\n".encode()) == \
            f"+OK 1\r\n{q} 2\r\nready-len 1\r\nscheduled-len 0\r\n".encode()
    finally:
        w.close()


def test_takeanumber_body_limit(server, limit):
    t = wire(server, "takeanumber", Lines)
    try:
        q = qname()
        assert t.call(f"ADD {q} 0 ".encode() + b"x" * limit + b"\r\n").startswith(b"+")
        assert t.call(f"ADD {q} 0 ".encode() + b"x" * (limit + 1) + b"\r\n") == \
            b"-ERR Body too large.\r\n"
        assert t.call(f"LEN {q}\r\n".encode()) == b":1\r\n"
    finally:
        t.close()


def test_queued_item_limit(server, limit):
    c = wire(server, "queued", Lines)
    try:
        assert c.call(f"USE {qname()}\n".encode()) == b"OK\n"
        assert c.call(b"ENQUE " + base64.b64encode(b"x" * limit) + b"\n") == b"OK\n"
        assert c.call(b"ENQUE " + base64.b64encode(b"y" * (limit + 1)) + b"\n") == \
            b"ERROR " + base64.b64encode(b"item too large") + b"\n"
        assert c.call(b"SIZE\n") == b"SIZE 1\n"
    finally:
        c.close()


def test_goqueue_data_limit(server, limit):
    def add(q: str, size: int) -> bytes:
        return b"ADD\0" + q.encode() + b"\0" + struct.pack("<III", 0, 0, size) + b"x" * size

    g = wire(server, "goqueue", Goqueue)
    try:
        q = qname()
        assert g.call(add(q, limit)).startswith(b"ADDED\0")
        assert g.call(add(q, limit + 1)) == \
            f"ERROR\0Malformed ADD command: job data longer than {limit} bytes\0".encode()
    finally:
        g.close()


def test_taskflux_data_limit(server, limit):
    def enqueue(q: str, size: int) -> bytes:
        body = b"E" + struct.pack(">i", len(q)) + q.encode() + struct.pack(">qi", 0, size) + b"x" * size
        return b"D" + struct.pack(">i", len(body)) + body

    def count(q: str) -> bytes:
        body = b"C" + struct.pack(">i", len(q)) + q.encode()
        return b"D" + struct.pack(">i", len(body)) + body

    message = f"Data too large: at most {limit} bytes".encode()
    f = wire(server, "taskflux", TaskFlux)
    try:
        q = qname()
        assert f.call(enqueue(q, limit)) == b"R\0\0\0\x02e\x01"
        body = b"E\0" + struct.pack(">i", len(message)) + message
        assert f.call(enqueue(q, limit + 1)) == b"R" + struct.pack(">i", len(body)) + body
        assert f.call(count(q)) == b"R\0\0\0\x05c\0\0\0\x01"
        # the empty name, TaskFlux's own queue, stays printable over workq
        assert f.call(enqueue("", 1)) == b"R\0\0\0\x02e\x01"
    finally:
        f.close()
    w = wire(server, "workq", Wire)
    try:
        reply = w.call(b"inspect queues 0 100\r\n")
        lines = reply[:-2].split(b"\r\n")
        assert len(lines) == 1 + 3 * int(lines[0][4:])
        assert b'"" 2' in lines[1::3]
    finally:
        w.close()


def test_workq_refused_block_command_answers_once_per_line(server):
    """Too few arguments leave no size to read: the line is answered at once
    and its would-be block is a line of its own. Too many leave the size
    readable at its place: the block is read and the add answered once. In
    both, the connection stays in step and nothing is added."""
    w = wire(server, "workq", Wire)
    try:
        q = qname()
        for bad, replies in ((f"add {new_id()} {q} 1000 4\r\npong\r\n",
                              [b"-CLIENT-ERROR Invalid command args\r\n", b"-CLIENT-ERROR Unknown command\r\n"]),
                             (f"complete {new_id()} x 4\r\npong\r\n",
                              [b"-CLIENT-ERROR Invalid command args\r\n", b"-CLIENT-ERROR Unknown command\r\n"]),
                             (f"add {new_id()} {q} 1000 60000 4 -priority 5\r\nping\r\n",
                              [b"-CLIENT-ERROR Invalid command args\r\n"]),
                             (f"complete {new_id()} 4 extra\r\npong\r\n",
                              [b"-CLIENT-ERROR Invalid command args\r\n"])):
            w.send(bad.encode() + f"add {new_id()} {q} 1000 60000 2\r\nok\r\n".encode())
            for reply in replies:
                assert w.reply() == reply
            assert w.reply() == b"+OK\r\n"     # the next valid add, answered after the one error
        w.send(f"inspect queue {q}\r\n".encode())
        assert w.reply() == f"+OK 1\r\n{q} 2\r\nready-len 4\r\nscheduled-len 0\r\n".encode()
    finally:
        w.close()
