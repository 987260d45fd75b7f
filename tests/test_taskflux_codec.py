"""The TaskFlux codec on its own: packets in, commands out, replies rendered to packets."""
from __future__ import annotations

import struct

import pytest

from codec_helpers import only_command

from queueserver.engine.job import UNLIMITED_ATTEMPTS
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT
from queueserver.protocols import codec_class
from queueserver.protocols.base import BY_NAME, LOCAL, SERVER_ID
from queueserver.protocols.taskflux import (
    MAX_BODY, TaskFluxCodec, render_count, render_dequeued, render_enqueued,
)


# ------------------------------------------------------------------ helpers
def i32(n: int) -> bytes:
    return struct.pack(">i", n)


def i64(n: int) -> bytes:
    return struct.pack(">q", n)


def string(text) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return i32(len(raw)) + raw


def packet(body: bytes) -> bytes:
    return b"D" + i32(len(body)) + body


def enqueue(queue="q", key=0, data=b"data") -> bytes:
    return packet(b"E" + string(queue) + i64(key) + string(data))


def dequeue(queue="q") -> bytes:
    return packet(b"D" + string(queue))


def count(queue="q") -> bytes:
    return packet(b"C" + string(queue))


def response(body: bytes) -> bytes:
    return b"R" + i32(len(body)) + body


def business(kind: int, message: str) -> bytes:
    return response(b"E" + bytes([kind]) + string(message))


def transport(message: str) -> bytes:
    return b"e" + string(message)


INVALID_NAME = business(1, "Invalid queue name: at most 255 characters, ASCII 33 to 126 only")


def describe(cmd):
    return (cmd.op, tuple(cmd.args), cmd.route, cmd.key, cmd.reply, cmd.close, cmd.new_id)


def one(data: bytes, codec=None):
    return only_command((codec or TaskFluxCodec()).receive(data))


def view(key=0, payload=b"data", number=3):
    """An engine lease view of a TaskFlux job (engine priority = -key)."""
    return ["a-uuid", "q", payload, number, -key, 0, 0, (key, 0, 0, number)]


def test_registry_finds_the_codec_and_unknown_options_are_ignored():
    cls = codec_class("taskflux")
    assert cls is TaskFluxCodec
    assert one(count(), cls(allow_dups=True, whatever=1)).op == "size"


# ------------------------------------------------------------------ Enqueue
def test_enqueue_becomes_an_engine_add():
    cmd = one(enqueue("jobs", 42, b"\x00\x01payload"))
    assert cmd.op == "add"
    assert tuple(cmd.args) == (None, "jobs", b"\x00\x01payload", -42, 0, 0, UNLIMITED_ATTEMPTS, 0, None, False)
    assert cmd.route == BY_NAME and cmd.key == "jobs" and cmd.new_id == SERVER_ID


def test_enqueue_key_range_and_empty_data():
    assert one(enqueue(key=-(2 ** 63))).args[3] == 2 ** 63
    assert one(enqueue(key=2 ** 63 - 1)).args[3] == -(2 ** 63 - 1)
    assert one(enqueue(data=b"")).args[2] == b""


def test_enqueue_reply_bytes():
    cmd = one(enqueue())
    assert cmd.render([OK, ["uuid", 1]]) == b"R\x00\x00\x00\x02e\x01"
    assert render_enqueued([OK, None]) == response(b"e\x00")


def test_enqueue_errors_are_business_errors_of_type_0():
    cmd = one(enqueue())
    assert cmd.render([SERVER_ERROR, "Shard 1 unavailable"]) == business(0, "Shard 1 unavailable")
    assert cmd.render([CLIENT_ERROR, "Duplicate job"]) == business(0, "Duplicate job")
    assert cmd.render([SERVER_ERROR, ""]) == business(0, "Internal error")


def test_enqueue_to_the_empty_name():
    cmd = one(enqueue("", 1))
    assert cmd.op == "add" and cmd.key == ""


# ------------------------------------------------------------------ Dequeue
def test_dequeue_becomes_a_take_that_requires_the_queue():
    cmd = one(dequeue("jobs"))
    assert cmd.op == "take" and tuple(cmd.args) == ("jobs", True)
    assert cmd.route == BY_NAME and cmd.key == "jobs"


def test_dequeue_of_the_empty_name_never_misses_the_queue():
    cmd = one(dequeue(""))
    assert tuple(cmd.args) == ("", False)


def test_dequeue_reply_bytes():
    cmd = one(dequeue())
    assert cmd.render([OK, view(key=5, payload=b"hi")]) == (
        b"R\x00\x00\x00\x10d\x01\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x02hi")
    assert cmd.render([TIMEOUT, ""]) == b"R\x00\x00\x00\x02d\x00"


def test_dequeue_key_of_other_protocols_jobs():
    # A workq job of priority 5 (engine 5) shows key -5; keys clamp to Int64.
    assert render_dequeued([OK, ["id", "q", b"", 1, 5, 0, 0, None]]) == response(
        b"d\x01" + i64(-5) + string(b""))
    assert render_dequeued([OK, ["id", "q", b"", 1, -(2 ** 64), 0, 0, None]]) == response(
        b"d\x01" + i64(2 ** 63 - 1) + string(b""))
    assert render_dequeued([OK, view(key=-(2 ** 63))]) == response(
        b"d\x01" + i64(-(2 ** 63)) + string(b"data"))


def test_dequeue_of_a_missing_queue_is_type_2():
    cmd = one(dequeue("nope"))
    assert cmd.render([NOT_FOUND, ""]) == business(2, "Queue nope does not exist")
    assert cmd.render([SERVER_ERROR, "Shard 0 unavailable"]) == business(0, "Shard 0 unavailable")


# -------------------------------------------------------------------- Count
def test_count_becomes_a_size_that_requires_the_queue():
    cmd = one(count("jobs"))
    assert cmd.op == "size" and tuple(cmd.args) == ("jobs", True) and cmd.key == "jobs"
    assert tuple(one(count("")).args) == ("", False)


def test_count_reply_bytes():
    cmd = one(count("jobs"))
    assert cmd.render([OK, 3]) == b"R\x00\x00\x00\x05c\x00\x00\x00\x03"
    assert cmd.render([OK, 0]) == response(b"c" + i32(0))
    assert render_count([OK, 2 ** 40]) == response(b"c" + i32(2 ** 31 - 1))
    assert cmd.render([NOT_FOUND, ""]) == business(2, "Queue jobs does not exist")
    assert cmd.render([SERVER_ERROR, "boom"]) == business(0, "boom")


# --------------------------------------------------------------- queue names
@pytest.mark.parametrize("build", [enqueue, dequeue, count])
@pytest.mark.parametrize("name", [
    "has space", "tab\t", "x" * 256, "ünïcode", "del\x7f", b"\x00", b"\xff\xfe", "~" * 255 + "!",
])
def test_invalid_queue_names_are_type_1(build, name):
    codec = TaskFluxCodec()
    cmds = codec.receive(build(name) + count("ok"))
    assert cmds[0].route == LOCAL and cmds[0].reply == INVALID_NAME and not cmds[0].close
    assert cmds[1].op == "size"


@pytest.mark.parametrize("name", ["!", "~", "a" * 255, "queue:1/{x}", "".join(map(chr, range(33, 127)))])
def test_valid_queue_names(name):
    assert one(count(name)).key == name


def test_business_error_bytes_exactly():
    assert INVALID_NAME == (b"R\x00\x00\x00\x46E\x01\x00\x00\x00\x40"
                            b"Invalid queue name: at most 255 characters, ASCII 33 to 126 only")


# -------------------------------------------------------- malformed bodies
@pytest.mark.parametrize("body,message", [
    (b"", "Malformed request: empty body"),
    (b"X", "Malformed request: unknown command marker 0x58"),
    (b"e\x01", "Malformed request: unknown command marker 0x65"),
    (b"E", "Malformed request: truncated queue name"),
    (b"E\x00\x00", "Malformed request: truncated queue name"),
    (b"E" + i32(5) + b"abc", "Malformed request: truncated queue name"),
    (b"E" + i32(-1), "Malformed request: negative length -1 of queue name"),
    (b"E" + string("q") + b"\x00\x00\x00", "Malformed request: truncated key"),
    (b"E" + string("q") + i64(1), "Malformed request: truncated data"),
    (b"E" + string("q") + i64(1) + i32(4) + b"ab", "Malformed request: truncated data"),
    (b"E" + string("q") + i64(1) + i32(-2), "Malformed request: negative length -2 of data"),
    (b"E" + string("q") + i64(1) + string("d") + b"!!", "Malformed request: 2 unexpected bytes after the Enqueue request"),
    (b"D", "Malformed request: truncated queue name"),
    (b"D" + string("q") + b"?", "Malformed request: 1 unexpected bytes after the Dequeue request"),
    (b"C" + i32(2) + b"q", "Malformed request: truncated queue name"),
    (b"C" + string("q") + b"??", "Malformed request: 2 unexpected bytes after the Count request"),
])
def test_unparseable_body_is_a_transport_error_and_the_connection_stays(body, message):
    codec = TaskFluxCodec()
    cmds = codec.receive(packet(body) + count("after"))
    assert len(cmds) == 2
    assert cmds[0].route == LOCAL and cmds[0].reply == transport(message) and not cmds[0].close
    assert cmds[1].op == "size" and cmds[1].key == "after"


def test_transport_error_bytes_exactly():
    cmd = one(packet(b"X"))
    assert cmd.reply == b"e\x00\x00\x00\x2eMalformed request: unknown command marker 0x58"


# ---------------------------------------------------------- framing errors
@pytest.mark.parametrize("marker", [b"A", b"B", b"C", b"R", b"d", b"e", b"\x00", b"\xff"])
def test_unknown_packet_marker_errors_then_closes(marker):
    codec = TaskFluxCodec()
    cmds = codec.receive(marker + b"\x00\x00\x00\x00" + count())
    assert len(cmds) == 1 and cmds[0].close
    assert cmds[0].reply == transport(f"Unknown packet marker 0x{marker[0]:02x}")
    assert codec.receive(count()) == []


def test_unknown_marker_is_detected_from_its_first_byte():
    cmd = one(b"A")
    assert cmd.close and cmd.reply == transport("Unknown packet marker 0x41")


def test_negative_length_errors_then_closes():
    cmd = one(b"D" + i32(-1))
    assert cmd.close and cmd.reply == transport("Invalid packet length -1")


def test_oversized_length_errors_then_closes():
    codec = TaskFluxCodec()
    cmds = codec.receive(b"D" + i32(MAX_BODY + 1))
    assert len(cmds) == 1 and cmds[0].close
    assert cmds[0].reply == transport("Packet length 1114113 exceeds the limit of 1114112 bytes")
    assert codec.receive(count()) == []


def test_body_at_the_limit_is_read():
    """A packet of exactly the limit keeps the framing; its data is over max_payload."""
    data = b"x" * (MAX_BODY - 1 - 5 - 8 - 4)
    stream = enqueue("q", 1, data)
    assert len(stream) == 5 + MAX_BODY
    cmds = TaskFluxCodec().receive(stream + count("q"))
    assert cmds[0].reply == business(0, "Data too large: at most 1048576 bytes")
    assert not cmds[0].close and cmds[1].op == "size"


@pytest.mark.parametrize("limit", [0, 5, 1048576])
def test_data_at_max_payload_accepted_one_more_refused(limit):
    codec = TaskFluxCodec(max_payload=limit)
    assert codec.max_body == limit + 65536
    cmds = codec.receive(enqueue("q", 1, b"x" * limit) + enqueue("q", 1, b"x" * (limit + 1)) + count("q"))
    assert cmds[0].op == "add" and cmds[0].args[2] == b"x" * limit
    assert cmds[1].route == LOCAL and not cmds[1].close
    assert cmds[1].reply == business(0, f"Data too large: at most {limit} bytes")
    assert cmds[2].op == "size"


def test_invalid_name_is_reported_before_oversized_data():
    cmd = one(enqueue("a b", 1, b"xx"), TaskFluxCodec(max_payload=1))
    assert cmd.reply == INVALID_NAME


def test_limit_is_configurable():
    cmd = one(dequeue("queue"), TaskFluxCodec(max_body=5))
    assert cmd.close and cmd.reply == transport("Packet length 10 exceeds the limit of 5 bytes")


def test_commands_before_a_framing_error_are_kept():
    cmds = TaskFluxCodec().receive(count("a") + enqueue("b") + b"Z" + count("c"))
    assert [c.op for c in cmds] == ["size", "add", None]
    assert cmds[2].close and not cmds[0].close


# -------------------------------------------------- streaming and pipelining
MIXED = (enqueue("q1", 5, b"hello") + dequeue("q1") + count("q1") + packet(b"X")
         + count("bad name") + enqueue("", -3, b"") + dequeue("") + count("")
         + packet(b"D" + string("q") + b"!") + enqueue("q2", 2 ** 63 - 1, bytes(range(256))))


def test_pipelined_packets_all_decoded_in_order():
    cmds = TaskFluxCodec().receive(MIXED)
    assert [c.op for c in cmds] == ["add", "take", "size", None, None, "add", "take", "size",
                                    None, "add"]
    assert cmds[3].reply == transport("Malformed request: unknown command marker 0x58")
    assert cmds[4].reply == INVALID_NAME
    assert not any(c.close for c in cmds)


def test_byte_by_byte_equals_all_at_once():
    whole = [describe(c) for c in TaskFluxCodec().receive(MIXED)]
    codec = TaskFluxCodec()
    split = []
    for i in range(len(MIXED)):
        split.extend(describe(c) for c in codec.receive(MIXED[i:i + 1]))
    assert split == whole


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 7, 100])
def test_any_chunking_equals_all_at_once(size):
    whole = [describe(c) for c in TaskFluxCodec().receive(MIXED)]
    codec = TaskFluxCodec()
    split = []
    for i in range(0, len(MIXED), size):
        split.extend(describe(c) for c in codec.receive(MIXED[i:i + size]))
    assert split == whole


def test_incomplete_packets_wait_for_more():
    codec = TaskFluxCodec()
    stream = count("queue")
    for i in range(len(stream) - 1):
        assert codec.receive(stream[i:i + 1]) == []
    assert codec.receive(stream[-1:])[0].key == "queue"


def test_errors_then_resync():
    stream = (packet(b"") + packet(b"?") + count("x" * 300) + packet(b"E" + i32(-9))
              + dequeue("good"))
    cmds = TaskFluxCodec().receive(stream)
    assert [c.reply for c in cmds[:4]] == [
        transport("Malformed request: empty body"),
        transport("Malformed request: unknown command marker 0x3f"),
        INVALID_NAME,
        transport("Malformed request: negative length -9 of queue name"),
    ]
    assert cmds[4].op == "take" and cmds[4].key == "good"
    assert not any(c.close for c in cmds)
