"""takeanumber and queued end to end: a real ``queueserver serve`` with 3
shards, raw bytes over TCP, plus the same queues seen through workq.

Two servers are started per module (each stopped when the module is done):
one with the defaults (reservations never time out, queued drops duplicate
items) and one with ``--reservation-timeout 300 --allow-dups``.
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import struct
import uuid

import pytest

from queueserver.router import shard_for
from serverproc import ServerProcess, poll, replies_across_shard_restart, wait_for
from wire import (SocketReader, Wire, add, connection_fixture, inspect_field, names_on_distinct_shards,
                  new_id, qname, server_stat, workq_wire)

PROTOCOLS = ["workq", "takeanumber", "queued"]
SHARDS = 3
UUID4 = re.compile(rb"\A[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\Z")
EMPTY = b"ERROR cXVldWUgaXMgZW1wdHk=\n"


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess(shards=SHARDS, protocols=PROTOCOLS).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def tuned():
    proc = ServerProcess(shards=SHARDS, protocols=PROTOCOLS,
                         extra=["--reservation-timeout", "300", "--allow-dups"]).start()
    yield proc
    proc.stop()


class TextWire(SocketReader):
    """Reads whole reply lines (``\\r\\n`` for takeanumber, ``\\n`` for queued)."""

    def __init__(self, sock: socket.socket, eol: bytes) -> None:
        super().__init__(sock)
        self.eol = eol

    def line(self) -> bytes:
        return self.until(self.eol)

    reply = line

    def lines(self, n: int) -> list:
        return [self.line() for _ in range(n)]

    def at_eof(self) -> bool:
        """True once the server has closed the connection (nothing more to read)."""
        return not self.buf and self.sock.recv(65536) == b""


def tan(proc: ServerProcess) -> TextWire:
    return TextWire(proc.connect("takeanumber"), b"\r\n")


def qd(proc: ServerProcess) -> TextWire:
    return TextWire(proc.connect("queued"), b"\n")


t = connection_fixture(tan)


t2 = connection_fixture(tan)


q = connection_fixture(qd)


q2 = connection_fixture(qd)


wq = connection_fixture(workq_wire)


def b64(data: bytes) -> bytes:
    return base64.b64encode(data)


def err(message: bytes) -> bytes:
    return b"ERROR " + b64(message) + b"\n"


def added_id(reply: bytes) -> str:
    assert reply.startswith(b"+") and reply.endswith(b"\r\n"), reply
    id = reply[1:-2]
    assert UUID4.match(id), reply
    return id.decode()


# =============================================================== takeanumber
def test_tan_add_len_reserve_done(t):
    name = qname()
    assert t.call(f"LEN {name}\r\n".encode()) == b":0\r\n"
    id = added_id(t.call(f'ADD {name} 3 {{"thing": 1, "also": "abc"}}\r\n'.encode()))
    assert t.call(f"LEN {name}\r\n".encode()) == b":1\r\n"
    assert t.call(f"RESERVE {name}\r\n".encode()) == f'+{id} {{"thing": 1, "also": "abc"}}\r\n'.encode()
    assert t.call(f"LEN {name}\r\n".encode()) == b":0\r\n"     # LEN counts ready jobs only
    assert t.call(f"RESERVE {name}\r\n".encode()) == b":-1\r\n"
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"+OK\r\n"
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"
    assert t.call(f"RETRY {name} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"


def test_tan_ids_are_fresh_uuid4s(t):
    name = qname()
    ids = {added_id(t.call(f"ADD {name} 0 same\r\n".encode())) for _ in range(20)}
    assert len(ids) == 20
    assert all(uuid.UUID(i).version == 4 for i in ids)


def test_tan_seed_error_examples(t):
    assert t.call(b"ADD nopenopenope 1 \r\n") == b"-ERR No body provided.\r\n"
    assert t.call(b"DONE nopenopenope 0269073f-ffff-4444-8888-ab3d194137b3\r\n") == b"-ERR No such Id.\r\n"
    assert t.call(b"LEN nopenopenope-never\r\n") == b":0\r\n"


def test_tan_every_error_keeps_the_connection_usable(t):
    name = qname()
    cases = [
        (b"ADD q\r\n", b"-ERR Missing ADD parameters.\r\n"),
        (b"ADD q 1\r\n", b"-ERR No body provided.\r\n"),
        (b"ADD q 1 \t \r\n", b"-ERR No body provided.\r\n"),
        (b"ADD\r\n", b"-ERR Missing ADD parameters.\r\n"),
        (b"ADD q many body\r\n", b"-ERR Invalid number of retries.\r\n"),
        (b"ADD q 1 \r\n", b"-ERR No body provided.\r\n"),
        (b"ADD q\xff 1 body\r\n", b"-ERR Invalid queue name.\r\n"),
        (b"LEN q\xff\r\n", b"-ERR Invalid queue name.\r\n"),
        (b"RESERVE a\tb\r\n", b"-ERR Invalid queue name.\r\n"),
        (b"RETRY q\r\n", b"-ERR Missing RETRY parameters.\r\n"),
        (b"DONE q\r\n", b"-ERR Missing DONE parameters.\r\n"),
        (b"LEN\r\n", b"-ERR Missing LEN parameters.\r\n"),
        (b"RESERVE\r\n", b"-ERR Missing RESERVE parameters.\r\n"),
        (f"RETRY {name} {new_id()}\r\n".encode(), b"-ERR No such Id.\r\n"),
        (b"len q\r\n", b"-ERR Unrecognized command.\r\n"),
        (b"FLUSH\r\n", b"-ERR Unrecognized command.\r\n"),
        (b"\r\n", b"-ERR Unrecognized command.\r\n"),
    ]
    for request, reply in cases:
        assert t.call(request) == reply, request
    assert added_id(t.call(f"ADD {name} 1 still fine\r\n".encode()))
    assert t.call(f"LEN {name}\r\n".encode()) == b":1\r\n"


def test_tan_bare_lf_line_ends(t):
    name = qname()
    id = added_id(t.call(f"ADD {name} 0 lf only\n".encode()))
    assert t.call(f"RESERVE {name}\n".encode()) == f"+{id} lf only\r\n".encode()
    assert t.call(f"DONE {name} {id}\n".encode()) == b"+OK\r\n"


def test_tan_fifo_order(t, t2):
    name = qname()
    ids = [added_id(t.call(f"ADD {name} 0 job-{i}\r\n".encode())) for i in range(10)]
    got = [t2.call(f"RESERVE {name}\r\n".encode()) for _ in ids]
    assert got == [f"+{id} job-{i}\r\n".encode() for i, id in enumerate(ids)]
    assert t2.call(f"RESERVE {name}\r\n".encode()) == b":-1\r\n"


def test_tan_retry_puts_the_job_back_at_its_place_in_add_order(t, t2):
    name = qname()
    a, b, c, d = (added_id(t.call(f"ADD {name} 5 {x}\r\n".encode())) for x in "abcd")
    for id, body in ((a, "a"), (b, "b"), (c, "c")):
        assert t2.call(f"RESERVE {name}\r\n".encode()) == f"+{id} {body}\r\n".encode()
    assert t.call(f"LEN {name}\r\n".encode()) == b":1\r\n"
    assert t2.call(f"RETRY {name} {c}\r\n".encode()) == b"+OK\r\n"
    assert t2.call(f"RETRY {name} {a}\r\n".encode()) == b"+OK\r\n"
    assert t.call(f"LEN {name}\r\n".encode()) == b":3\r\n"
    # As the original: one list in add order, RESERVE takes the first free item.
    for id, body in ((a, "a"), (c, "c"), (d, "d")):
        assert t2.call(f"RESERVE {name}\r\n".encode()) == f"+{id} {body}\r\n".encode()


def test_tan_retries_run_out(t):
    name = qname()
    id = added_id(t.call(f"ADD {name} 2 twice\r\n".encode()))
    for _ in range(2):
        assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{id} twice\r\n".encode()
        assert t.call(f"RETRY {name} {id}\r\n".encode()) == b"+OK\r\n"
    assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{id} twice\r\n".encode()
    assert t.call(f"RETRY {name} {id}\r\n".encode()) == b"-ERR No retries remaining.\r\n"
    # Out of retries, the job is gone.
    assert t.call(f"LEN {name}\r\n".encode()) == b":0\r\n"
    assert t.call(f"RESERVE {name}\r\n".encode()) == b":-1\r\n"
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"


def test_tan_retries_are_not_capped_by_workq_attempts(t):
    # `retries` is how many RETRY calls are allowed: 300 means 301 reservations.
    # (Fails while the engine applies workq's 255-attempt cap to jobs with
    # max_attempts 0: the 256th lease silently marks the job FAILED.)
    name = qname()
    id = added_id(t.call(f"ADD {name} 300 again\r\n".encode()))
    t.send(f"RESERVE {name}\r\nRETRY {name} {id}\r\n".encode() * 300)
    replies = t.lines(600)
    assert replies == [f"+{id} again\r\n".encode(), b"+OK\r\n"] * 300
    assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{id} again\r\n".encode()
    assert t.call(f"RETRY {name} {id}\r\n".encode()) == b"-ERR No retries remaining.\r\n"


@pytest.mark.parametrize("retries", ["0", "-3"])
def test_tan_zero_or_negative_retries_allow_none(t, retries):
    name = qname()
    id = added_id(t.call(f"ADD {name} {retries} once\r\n".encode()))
    t.call(f"RESERVE {name}\r\n".encode())
    assert t.call(f"RETRY {name} {id}\r\n".encode()) == b"-ERR No retries remaining.\r\n"
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"


def test_tan_retry_and_done_need_the_right_queue(t):
    name, other = names_on_distinct_shards(SHARDS, 2)
    id = added_id(t.call(f"ADD {name} 3 mine\r\n".encode()))
    assert t.call(f"RETRY {other} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"
    assert t.call(f"DONE {other} {id}\r\n".encode()) == b"-ERR No such Id.\r\n"
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"+OK\r\n"


def test_tan_done_on_a_ready_job_removes_it(t):
    name = qname()
    id = added_id(t.call(f"ADD {name} 0 unreserved\r\n".encode()))
    assert t.call(f"DONE {name} {id}\r\n".encode()) == b"+OK\r\n"
    assert t.call(f"LEN {name}\r\n".encode()) == b":0\r\n"


def test_tan_body_bytes_round_trip(t):
    name = qname()
    for body in (b"  spaced  out", b"\ttabs", b"\x00\xff\x80 binary \x01", b"-ERR :1 +OK", b"x" * 100000):
        id = added_id(t.call(f"ADD {name} 0 ".encode() + body + b"\r\n"))
        assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{id} ".encode() + body + b"\r\n"
        assert t.call(f"DONE {name} {id}\r\n".encode()) == b"+OK\r\n"


def test_tan_mebibyte_body_and_overlong_line(t):
    name = qname()
    body = b"b" * 1048576
    id = added_id(t.call(f"ADD {name} 0 ".encode() + body + b"\r\n"))
    assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{id} ".encode() + body + b"\r\n"
    too_long = f"ADD {name} 0 ".encode() + b"z" * (1048576 + 2048) + b"\r\n"
    assert t.call(too_long + f"LEN {name}\r\n".encode()) == b"-ERR Line too long.\r\n"
    assert t.line() == b":0\r\n"   # resynchronised at the newline


def test_tan_pipelined_requests_across_shards_answer_in_order(t):
    names = names_on_distinct_shards(SHARDS, SHARDS)
    count = 60
    batch = b"".join(f"ADD {names[i % 3]} 1 job {i}\r\n".encode() for i in range(count))
    batch += b"".join(f"LEN {n}\r\n".encode() for n in names)
    batch += b"BOGUS\r\nADD x 1 \r\n"
    batch += b"".join(f"RESERVE {names[i % 3]}\r\n".encode() for i in range(count))
    batch += b"".join(f"RESERVE {n}\r\n".encode() for n in names)
    t.send(batch)
    ids = [added_id(t.line()) for _ in range(count)]
    assert t.lines(3) == [f":{count // 3}\r\n".encode()] * 3
    assert t.lines(2) == [b"-ERR Unrecognized command.\r\n", b"-ERR No body provided.\r\n"]
    assert t.lines(count) == [f"+{id} job {i}\r\n".encode() for i, id in enumerate(ids)]
    assert t.lines(3) == [b":-1\r\n"] * 3
    t.send(b"".join(f"DONE {names[i % 3]} {id}\r\n".encode() for i, id in enumerate(ids)))
    assert t.lines(count) == [b"+OK\r\n"] * count


def test_tan_byte_by_byte(t):
    name = qname()
    for byte in f"ADD {name} 0 slow body\r\nLEN {name}\nRESERVE {name}\r\n".encode():
        t.send(bytes([byte]))
    id = added_id(t.line())
    assert t.lines(2) == [b":1\r\n", f"+{id} slow body\r\n".encode()]


def test_tan_close_answers_nothing_and_runs_nothing_after(server, t2):
    name = qname()
    w = tan(server)
    try:
        w.send(f"ADD {name} 0 before\r\nCLOSE\r\nADD {name} 0 after\r\n".encode())
        added_id(w.line())
        assert w.at_eof()
    finally:
        w.close()
    assert t2.call(f"LEN {name}\r\n".encode()) == b":1\r\n"
    assert t2.call(f"RESERVE {name}\r\n".encode()).endswith(b" before\r\n")


def test_tan_reservations_never_time_out_by_default(t, wq):
    name = qname()
    id = added_id(t.call(f"ADD {name} 0 keep\r\n".encode()))
    assert inspect_field(wq, id, "ttr") == b"0"
    t.call(f"RESERVE {name}\r\n".encode())
    assert inspect_field(wq, id, "state") == b"4"   # leased, with no lease timer


def test_tan_reservation_timeout_makes_the_job_reservable_again(tuned):
    w, wq = tan(tuned), Wire(tuned.connect("workq"))
    try:
        name = qname()
        id = added_id(w.call(f"ADD {name} 0 comeback\r\n".encode()))
        assert inspect_field(wq, id, "ttr") == b"300"
        assert w.call(f"RESERVE {name}\r\n".encode()) == f"+{id} comeback\r\n".encode()
        wait_for(lambda: inspect_field(wq, id, "state") != b"4", what="the reservation to time out")
        assert w.call(f"RESERVE {name}\r\n".encode()) == f"+{id} comeback\r\n".encode()
        assert w.call(f"DONE {name} {id}\r\n".encode()) == b"+OK\r\n"
        assert w.call(f"LEN {name}\r\n".encode()) == b":0\r\n"
    finally:
        w.close()
        wq.close()


# ==================================================================== queued
def use(w: TextWire, name: str) -> None:
    assert w.call(f"USE {name}\n".encode()) == b"OK\n"


def test_queued_enque_size_has_deque(q):
    use(q, qname())
    assert q.call(b"SIZE\n") == b"SIZE 0\n"
    assert q.call(b"HAS SjPqzV+mXysuKHHNExKGtTxBWxMWZtcRc7tuP+WTYbM=\n") == b"FALSE\n"
    assert q.call(b"ENQUE " + b64(b"item") + b"\n") == b"OK\n"
    assert q.call(b"SIZE\n") == b"SIZE 1\n"
    assert q.call(b"HAS SjPqzV+mXysuKHHNExKGtTxBWxMWZtcRc7tuP+WTYbM=\n") == b"TRUE\n"  # seed hash
    assert q.call(b"DEQUE\n") == b"ITEM aXRlbQ==\n"
    assert q.call(b"HAS SjPqzV+mXysuKHHNExKGtTxBWxMWZtcRc7tuP+WTYbM=\n") == b"FALSE\n"
    assert q.call(b"DEQUE\n") == EMPTY
    assert q.call(b"SIZE\n") == b"SIZE 0\n"


def test_queued_connection_starts_on_default(server):
    a, b = qd(server), qd(server)
    try:
        while a.call(b"DEQUE\n") != EMPTY:   # only this test uses "default"
            pass
        item = os.urandom(16)
        assert a.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
        assert b.call(b"USE default\n") == b"OK\n"
        assert b.call(b"SIZE\n") == b"SIZE 1\n"
        assert b.call(b"DEQUE\n") == b"ITEM " + b64(item) + b"\n"
        assert a.call(b"SIZE\n") == b"SIZE 0\n"
    finally:
        a.close()
        b.close()


def test_queued_errors_keep_the_connection_usable(q):
    use(q, qname())
    cases = [
        (b"ENQUE !!!\n", err(b"bad line '!!!'")),
        (b"ENQUE aXRlbQ\n", err(b"bad line 'aXRlbQ'")),
        (b"ENQUE\n", err(b"bad line ''")),
        (b"HAS\n", err(b"bad line ''")),
        (b"HAS " + b64(b"short") + b"\n", err(b"Expected a hash of size 32 got 5")),
        (b"DEQUE now\n", err(b"recieved msg data when none was expected")),
        (b"USE\n", err(b"Must supply a queue name")),
        (b"USE \n", err(b"Must supply a (non-blank) queue name")),
        (b"enque aXRlbQ==\n", err(b"bad command recieved, 'enque'")),
        (b"POP\n", err(b"bad command recieved, 'POP'")),
        (b"\n", err(b"bad command recieved, ''")),
    ]
    for request, reply in cases:
        assert q.call(request) == reply, request
    assert q.call(b"USE\n") == b"ERROR TXVzdCBzdXBwbHkgYSBxdWV1ZSBuYW1l\n"
    assert q.call(b"ENQUE aXRlbQ==\n") == b"OK\n"
    assert q.call(b"SIZE\n") == b"SIZE 1\n"   # still on the queue chosen before the errors


def test_queued_crlf_tolerated(q):
    use(q, qname())
    assert q.call(b"ENQUE aXRlbQ==\r\n") == b"OK\n"
    assert q.call(b"SIZE\r\n") == b"SIZE 1\n"
    assert q.call(b"DEQUE\r\n") == b"ITEM aXRlbQ==\n"


def test_queued_use_switches_queues(q, q2):
    one, two = names_on_distinct_shards(SHARDS, 2)
    use(q, one)
    assert q.call(b"ENQUE " + b64(b"in one") + b"\n") == b"OK\n"
    use(q, two)
    assert q.call(b"SIZE\n") == b"SIZE 0\n"
    assert q.call(b"ENQUE " + b64(b"in two") + b"\n") == b"OK\n"
    assert q.call(b"ENQUE " + b64(b"two again") + b"\n") == b"OK\n"
    use(q2, one)   # another connection's USE does not move this one
    assert q.call(b"SIZE\n") == b"SIZE 2\n"
    assert q2.call(b"SIZE\n") == b"SIZE 1\n"
    use(q, one)
    assert q.call(b"DEQUE\n") == b"ITEM " + b64(b"in one") + b"\n"
    assert q2.call(b"DEQUE\n") == EMPTY


def test_queued_unicode_queue_name(q, t):
    name = f"очередь-{new_id()[:6]}"
    use(q, name)
    assert q.call(b"ENQUE " + b64(b"u") + b"\n") == b"OK\n"
    assert t.call(f"LEN {name}\r\n".encode()) == b":1\r\n"


def test_queued_fifo_order(q, q2):
    name = qname()
    use(q, name)
    use(q2, name)
    items = [f"item {i}".encode() for i in range(10)]
    for item in items:
        assert q.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
    assert [q2.call(b"DEQUE\n") for _ in items] == [b"ITEM " + b64(i) + b"\n" for i in items]


def test_queued_duplicates_are_dropped_across_connections(q, q2):
    name = qname()
    use(q, name)
    use(q2, name)
    item = os.urandom(24)
    digest = b64(hashlib.sha256(item).digest())
    assert q.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
    assert q2.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"     # dropped, still OK
    assert q.call(b"SIZE\n") == b"SIZE 1\n"
    assert q2.call(b"HAS " + digest + b"\n") == b"TRUE\n"
    assert q.call(b"DEQUE\n") == b"ITEM " + b64(item) + b"\n"
    assert q2.call(b"HAS " + digest + b"\n") == b"FALSE\n"
    assert q2.call(b"DEQUE\n") == EMPTY
    # Once dequeued, the same item may be queued again.
    assert q2.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
    assert q.call(b"SIZE\n") == b"SIZE 1\n"


def test_queued_same_item_in_two_queues_is_no_duplicate(q):
    one, two = names_on_distinct_shards(SHARDS, 2)
    for name in (one, two):
        use(q, name)
        assert q.call(b"ENQUE " + b64(b"shared") + b"\n") == b"OK\n"
        assert q.call(b"SIZE\n") == b"SIZE 1\n"


def test_queued_allow_dups_keeps_every_copy(tuned):
    a, b = qd(tuned), qd(tuned)
    try:
        name = qname()
        use(a, name)
        use(b, name)
        item = os.urandom(24)
        digest = b64(hashlib.sha256(item).digest())
        assert a.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
        assert b.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
        assert a.call(b"SIZE\n") == b"SIZE 2\n"
        assert a.call(b"DEQUE\n") == b"ITEM " + b64(item) + b"\n"
        assert b.call(b"HAS " + digest + b"\n") == b"TRUE\n"    # one copy is left
        assert b.call(b"DEQUE\n") == b"ITEM " + b64(item) + b"\n"
        assert a.call(b"HAS " + digest + b"\n") == b"FALSE\n"
        assert a.call(b"DEQUE\n") == EMPTY
    finally:
        a.close()
        b.close()


def test_queued_binary_empty_and_mebibyte_items(q):
    use(q, qname())
    for item in (bytes(range(256)), b"", b"\n\r\n", os.urandom(1048576)):
        assert q.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
        assert q.call(b"DEQUE\n") == b"ITEM " + b64(item) + b"\n"


def test_queued_overlong_line_resyncs(q):
    use(q, qname())
    q.send(b"ENQUE " + b"A" * (2 * 1048576) + b"\nSIZE\n")
    assert q.line() == err(b"line too long")
    assert q.line() == b"SIZE 0\n"


def test_queued_pipelined_with_use_answers_in_order(q):
    names = names_on_distinct_shards(SHARDS, SHARDS)
    batch = b""
    expected = []
    for round in range(10):
        for name in names:
            batch += f"USE {name}\n".encode() + b"ENQUE " + b64(f"{name}:{round}".encode()) + b"\n"
            expected += [b"OK\n", b"OK\n"]
    batch += b"BAD\n"
    expected.append(err(b"bad command recieved, 'BAD'"))
    for name in names:
        batch += f"USE {name}\nSIZE\n".encode() + b"DEQUE\n" * 11
        expected += [b"OK\n", b"SIZE 10\n"]
        expected += [b"ITEM " + b64(f"{name}:{r}".encode()) + b"\n" for r in range(10)] + [EMPTY]
    q.send(batch)
    assert q.lines(len(expected)) == expected


def test_queued_byte_by_byte(q):
    name = qname()
    for byte in f"USE {name}\nENQUE ".encode() + b64(b"slow") + b"\r\nSIZE\nDEQUE\n":
        q.send(bytes([byte]))
    assert q.lines(4) == [b"OK\n", b"OK\n", b"SIZE 1\n", b"ITEM " + b64(b"slow") + b"\n"]


# ============================================================= cross-protocol
def test_takeanumber_add_then_workq_inspect_and_lease(t, wq):
    name = qname("x")
    ids = [added_id(t.call(f"ADD {name} 2 payload {i}\r\n".encode())) for i in range(2)]
    assert wq.call(f"inspect queue {name}\r\n".encode()) == \
        f"+OK 1\r\n{name} 2\r\nready-len 2\r\nscheduled-len 0\r\n".encode()
    assert inspect_field(wq, ids[0], "max-fails") == b"2"
    assert wq.call(f"lease {name} 0\r\n".encode()) == \
        f"+OK 1\r\n{ids[0]} {name} 9\r\npayload 0\r\n".encode()
    assert t.call(f"LEN {name}\r\n".encode()) == b":1\r\n"
    assert t.call(f"RESERVE {name}\r\n".encode()) == f"+{ids[1]} payload 1\r\n".encode()
    assert wq.call(f"lease {name} 0\r\n".encode()) == b"-TIMEOUT\r\n"
    assert t.call(f"DONE {name} {ids[0]}\r\n".encode()) == b"+OK\r\n"   # done what workq leased


def test_queued_enque_then_takeanumber_reserve(q, t):
    name = qname()
    use(q, name)
    assert q.call(b"ENQUE " + b64(b"from queued") + b"\n") == b"OK\n"
    reply = t.call(f"RESERVE {name}\r\n".encode())
    assert reply.startswith(b"+") and reply.endswith(b" from queued\r\n")
    id = reply[1:].split(b" ", 1)[0]
    assert UUID4.match(id)
    assert q.call(b"SIZE\n") == b"SIZE 0\n"
    assert t.call(f"DONE {name} {id.decode()}\r\n".encode()) == b"+OK\r\n"


def test_workq_add_then_queued_deque(wq, q):
    name = qname()
    id = new_id()
    assert wq.call(add(id, name, b"from workq")) == b"+OK\r\n"
    use(q, name)
    assert q.call(b"SIZE\n") == b"SIZE 1\n"
    assert q.call(b"HAS " + b64(hashlib.sha256(b"from workq").digest()) + b"\n") == b"TRUE\n"
    assert q.call(b"DEQUE\n") == b"ITEM " + b64(b"from workq") + b"\n"
    assert wq.call(f"inspect job {id}\r\n".encode()) == b"-NOT-FOUND\r\n"   # DEQUE removed it


def test_queued_dedup_sees_jobs_added_over_other_protocols(t, q):
    name = qname()
    added_id(t.call(f"ADD {name} 0 same bytes\r\n".encode()))
    use(q, name)
    assert q.call(b"ENQUE " + b64(b"same bytes") + b"\n") == b"OK\n"   # dropped: already held
    assert q.call(b"SIZE\n") == b"SIZE 1\n"


# ================================================================ server errors
def _shard_error_then_recovery(proc, shard, call, request, error_reply, ok_reply, unknown_reply):
    """``unknown_reply``: a request sent just as the shard died, answered that
    its outcome is unknown (rare: the kill comes first)."""
    replies = replies_across_shard_restart(proc, shard, lambda: call(request),
                                           lambda reply: reply == ok_reply)
    assert set(replies) <= {error_reply, ok_reply, unknown_reply}, replies
    assert error_reply in replies


def test_shard_down_is_answered_in_each_protocols_error_form():
    # Router-served connections (a shard's direct connections die with it).
    proc = ServerProcess(shards=2, protocols=["takeanumber", "queued"], extra=["--no-direct-path"]).start()
    try:
        name = "victim-queue"
        shard = shard_for(name, 2)
        message = f"Shard {shard} unavailable".encode()
        unknown = f"Outcome unknown: shard {shard} went down before answering".encode()
        w = tan(proc)
        _shard_error_then_recovery(proc, shard, w.call, f"LEN {name}\r\n".encode(),
                                   b"-ERR " + message + b"\r\n", b":0\r\n", b"-ERR " + unknown + b"\r\n")
        w.close()
        w = qd(proc)
        use(w, name)
        _shard_error_then_recovery(proc, shard, w.call, b"SIZE\n", err(message), b"SIZE 0\n", err(unknown))
        w.close()
    finally:
        proc.stop()


def test_a_dequeue_whose_client_left_puts_the_item_back(server):
    """When the server learns a client reset its connection before its
    dequeue's answer was written, the item goes back to its place. (An answer
    written whole before that is delivered: a dequeue is destructive, and no
    protocol ack exists to tell.) The race is retried until the server sees
    the reset first."""
    producer = qd(server)
    counter = Wire(server.connect("workq"))
    for attempt in range(30):
        name = qname("lost")
        producer.call(f"USE {name}\n".encode())
        for item in (b"first", b"second"):
            assert producer.call(b"ENQUE " + b64(item) + b"\n") == b"OK\n"
        clients = server_stat(counter, "active-clients")
        gone = server.connect("queued")
        wait_for(lambda: server_stat(counter, "active-clients") > clients, what="the client to count")
        gone.sendall(f"USE {name}\nDEQUE\n".encode())
        gone.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        gone.close()   # a reset
        # Once the server no longer counts the client it has read all it sent
        # (the DEQUE too) and seen it leave; the item comes back when the
        # DEQUE's answer does, unless it was written before the close was seen.
        wait_for(lambda: server_stat(counter, "active-clients") <= clients, what="the client to leave")
        if poll(lambda: producer.call(b"SIZE\n") == b"SIZE 2\n", 1.0):
            assert producer.call(b"DEQUE\n") == b"ITEM " + b64(b"first") + b"\n"  # its old place
            assert producer.call(b"DEQUE\n") == b"ITEM " + b64(b"second") + b"\n"
            break
    else:
        raise AssertionError("no dequeue of a vanished client was ever put back")
    producer.close()
    counter.close()
