"""The goqueue codec on its own: bytes in, commands out, replies rendered to bytes."""
from __future__ import annotations

import struct

import pytest

from codec_helpers import only_command

from queueserver.engine.job import UNLIMITED_ATTEMPTS
from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT
from queueserver.protocols import codec_class
from queueserver.protocols import ordering
from queueserver.protocols.base import BY_NAME, BY_NUMBER, LOCAL, MAX_PAYLOAD, SERVER_ID
from queueserver.protocols.goqueue import (
    MAX_NAME, GoqueueCodec, render_added, render_deleted, render_reserved,
)

INVALID_NAME = "Invalid queue name: 1 to 255 bytes of UTF-8, no whitespace or control characters"


# ------------------------------------------------------------------ helpers
def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def s(text) -> bytes:
    return (text.encode() if isinstance(text, str) else text) + b"\0"


def add(queue="q", priority=0, ttp=60, data=b"123") -> bytes:
    return s("ADD") + s(queue) + u32(priority) + u32(ttp) + u32(len(data)) + data


def reserve(queue="q", timeout=0) -> bytes:
    return s("RESERVE") + s(queue) + u32(timeout)


def delete(id: int) -> bytes:
    return s("DELETE") + u64(id)


CONNECT = b"CONNECT\0"


def err(message: str) -> bytes:
    return b"ERROR\0" + message.encode() + b"\0"


def describe(cmd):
    """Everything about a command except its render function, comparably."""
    return (cmd.op, tuple(tuple(a) if isinstance(a, list) else a for a in cmd.args), cmd.route,
            tuple(cmd.key) if isinstance(cmd.key, list) else cmd.key, cmd.reply, cmd.close,
            cmd.new_id)


def one(data: bytes, codec=None):
    return only_command((codec or GoqueueCodec()).receive(data))


def view(number=7, priority=-3, ttr=60000, payload=b"123", id="a-uuid", name="q"):
    """An engine lease view: [id, name, payload, number, priority, ttr_ms, attempts, order]."""
    return [id, name, payload, number, priority, ttr, 1, (0, 0, 0, number)]


# ------------------------------------------------------------------ CONNECT
def test_connect_is_answered_locally():
    cmd = one(CONNECT)
    assert cmd.route == LOCAL and cmd.reply == b"OK\0" and not cmd.close


def test_registry_finds_the_codec_and_unknown_options_are_ignored():
    cls = codec_class("goqueue")
    assert cls is GoqueueCodec
    codec = cls(allow_dups=True, reservation_timeout=5, whatever="x")
    assert one(CONNECT, codec).reply == b"OK\0"


# ---------------------------------------------------------------------- ADD
def test_add_becomes_an_engine_add_with_a_server_made_id():
    cmd = one(add("queue1", priority=1, ttp=60, data=b"123"))
    assert cmd.op == "add"
    assert tuple(cmd.args) == (None, "queue1", b"123", -1, 60000, 0, UNLIMITED_ATTEMPTS, 0, None, False)
    assert cmd.route == BY_NAME and cmd.key == "queue1"
    assert cmd.new_id == SERVER_ID


def test_add_priority_maps_lowest_first_and_ttp_zero_never_releases():
    cmd = one(add("q", priority=2 ** 32 - 1, ttp=0, data=b""))
    assert tuple(cmd.args) == (None, "q", b"", -(2 ** 32 - 1), 0, 0, UNLIMITED_ATTEMPTS, 0, None, False)
    assert one(add("q", priority=0)).args[3] == 0


def test_added_reply_carries_the_job_number():
    cmd = one(add())
    assert cmd.render([OK, ["some-uuid", 1]]) == b"ADDED\0" + u64(1)
    assert cmd.render([OK, ["some-uuid", 2 ** 40 + 5]]) == b"ADDED\0\x05\x00\x00\x00\x00\x01\x00\x00"
    assert render_added([OK, ["x", 3]]) == b"ADDED\0\x03\x00\x00\x00\x00\x00\x00\x00"


def test_add_failures_render_as_errors():
    cmd = one(add("jobs"))
    assert cmd.render([CLIENT_ERROR, "Duplicate job"]) == err("Error adding new job to queue jobs")
    assert cmd.render([SERVER_ERROR, "Shard 1 unavailable"]) == err("Shard 1 unavailable")


def test_add_to_the_empty_queue_name_is_the_original_error():
    cmd = one(add(""))
    assert cmd.route == LOCAL and not cmd.close
    assert cmd.reply == b"ERROR\0Error adding new job to queue \0"


def test_add_with_a_utf8_queue_name_and_binary_data():
    data = bytes(range(256))
    cmd = one(add("очередь", data=data))
    assert cmd.key == "очередь" and cmd.args[2] == data


def test_add_with_invalid_utf8_name_is_skipped_and_the_stream_continues():
    codec = GoqueueCodec()
    cmds = codec.receive(add(b"\xff\xfe") + CONNECT)
    assert [c.reply for c in cmds] == [err(INVALID_NAME), b"OK\0"]
    assert not cmds[0].close


BAD_NAMES = [b"\xff\xfe", b"n" * 256, b"a b", b"a\tb", b"a\r\nb", b"\x7f", b"\x01", "a\u00a0b".encode(),
             "a\u2029b".encode(), b"n" * MAX_NAME]


@pytest.mark.parametrize("raw", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_invalid_names_are_refused_and_the_whole_request_consumed(raw):
    codec = GoqueueCodec()
    data = bytes(range(256)) + b"ADD\0q\0RESERVE\0"   # data that looks like requests
    cmds = codec.receive(add(raw, data=data) + reserve(raw, 5) + CONNECT)
    assert [c.reply for c in cmds] == [err(INVALID_NAME), err(INVALID_NAME), b"OK\0"]
    assert not any(c.close for c in cmds)


@pytest.mark.parametrize("raw", BAD_NAMES[:4], ids=range(4))
def test_invalid_names_byte_by_byte(raw):
    codec = GoqueueCodec()
    stream = add(raw, data=b"x\0y") + reserve(raw, 5) + CONNECT
    cmds = []
    for i in range(len(stream)):
        cmds += codec.receive(stream[i:i + 1])
    assert [c.reply for c in cmds] == [err(INVALID_NAME), err(INVALID_NAME), b"OK\0"]


@pytest.mark.parametrize("name", ["n" * 255, "é" * 127, "a/b:c!", "😀"])
def test_names_up_to_255_bytes_are_accepted(name):
    assert one(add(name)).key == name
    assert one(reserve(name)).key == name


def test_add_data_at_the_limit_is_accepted():
    data = b"x" * MAX_PAYLOAD
    cmd = one(add(data=data))
    assert cmd.op == "add" and cmd.args[2] == data


def test_add_data_over_the_limit_errors_then_closes():
    codec = GoqueueCodec()
    head = s("ADD") + s("q") + u32(0) + u32(0) + u32(MAX_PAYLOAD + 1)
    cmds = codec.receive(head)  # rejected from the header alone
    assert len(cmds) == 1
    assert cmds[0].reply == err("Malformed ADD command: job data longer than 1048576 bytes")
    assert cmds[0].close
    assert codec.receive(CONNECT) == []  # nothing after a fatal error


def test_queue_name_at_the_scan_limit_is_refused_without_closing():
    cmd = one(add("n" * MAX_NAME))
    assert cmd.reply == err(INVALID_NAME) and not cmd.close


def test_queue_name_over_the_limit_errors_then_closes():
    codec = GoqueueCodec()
    assert codec.receive(s("ADD") + b"n" * MAX_NAME) == []   # may still end here
    cmds = codec.receive(b"n")
    assert len(cmds) == 1 and cmds[0].close
    assert cmds[0].reply == err("Malformed ADD command: queue name longer than 65536 bytes")
    assert codec.receive(CONNECT) == []


def test_limits_are_configurable():
    codec = GoqueueCodec(max_name=4, max_payload=8)
    cmds = codec.receive(add("abcd", data=b"8 bytes!") + add("abcde"))
    assert cmds[0].op == "add"
    assert cmds[1].close and cmds[1].reply == err("Malformed ADD command: queue name longer than 4 bytes")
    codec = GoqueueCodec(max_payload=8)
    cmd = one(add(data=b"9 bytes!!"), codec)
    assert cmd.close and cmd.reply == err("Malformed ADD command: job data longer than 8 bytes")


@pytest.mark.parametrize("limit", [0, 3, MAX_PAYLOAD])
def test_data_at_max_payload_accepted_one_more_fatal(limit):
    codec = GoqueueCodec(max_payload=limit)
    assert one(add(data=b"x" * limit), codec).args[2] == b"x" * limit
    cmd = one(add(data=b"x" * (limit + 1)), codec)
    assert cmd.close and cmd.reply == err(f"Malformed ADD command: job data longer than {limit} bytes")


# ------------------------------------------------------------------- DELETE
def test_delete_routes_by_job_number():
    cmd = one(delete(42))
    assert cmd.op == "delete_number" and tuple(cmd.args) == (42,)
    assert cmd.route == BY_NUMBER and cmd.key == 42


def test_delete_replies():
    cmd = one(delete(42))
    assert cmd.render([OK, "the-uuid"]) == b"OK\0"
    assert cmd.render([NOT_FOUND, ""]) == b"ERROR\0Job 42 already deleted\0"
    assert cmd.render([SERVER_ERROR, "Shard 0 unavailable"]) == err("Shard 0 unavailable")
    assert render_deleted([NOT_FOUND, ""], id=2 ** 64 - 1) == err(f"Job {2 ** 64 - 1} already deleted")


def test_delete_full_u64_range():
    assert one(delete(2 ** 64 - 1)).key == 2 ** 64 - 1
    assert one(delete(0)).key == 0


# ------------------------------------------------------------------ RESERVE
def test_reserve_timeout_zero_waits_without_limit():
    cmd = one(reserve("q", 0))
    assert cmd.op == "lease" and cmd.args[0] == ["q"] and cmd.args[1] is None
    assert cmd.route == BY_NAME and cmd.key == "q"


def test_reserve_timeout_is_in_seconds():
    assert one(reserve("q", 1)).args[1] == 1000
    assert one(reserve("q", 2 ** 32 - 1)).args[1] == (2 ** 32 - 1) * 1000


def test_reserve_of_the_empty_name_is_an_invalid_name():
    cmds = GoqueueCodec().receive(reserve("", 1) + CONNECT)
    assert [c.reply for c in cmds] == [err(INVALID_NAME), b"OK\0"]


def test_reserve_with_invalid_utf8_name():
    cmds = GoqueueCodec().receive(reserve(b"\xc3", 1) + CONNECT)
    assert [c.reply for c in cmds] == [err(INVALID_NAME), b"OK\0"]


def test_reserve_over_long_name_closes():
    cmd = one(s("RESERVE") + b"n" * (MAX_NAME + 1))
    assert cmd.close and cmd.reply == err("Malformed RESERVE command: queue name longer than 65536 bytes")


def test_reserved_reply_bytes():
    cmd = one(reserve())
    got = cmd.render([OK, view(number=1, priority=-1, ttr=60000, payload=b"123")])
    assert got == (b"RESERVED\0" + u64(1) + u32(1) + u32(60) + b"reserved\0" + u32(3) + b"123")
    assert got == (b"RESERVED\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00<\x00\x00\x00"
                   b"reserved\x00\x03\x00\x00\x00123")


def reserved_fields(reply: bytes):
    """(id, priority, ttp) of a RESERVED reply."""
    assert reply.startswith(b"RESERVED\0")
    return struct.unpack("<QII", reply[9:25])


def test_reserved_ttp_is_whole_seconds_of_the_ttr():
    assert reserved_fields(render_reserved([OK, view(ttr=1500)]))[2] == 1
    assert reserved_fields(render_reserved([OK, view(ttr=999)]))[2] == 0
    assert reserved_fields(render_reserved([OK, view(ttr=0)]))[2] == 0
    assert reserved_fields(render_reserved([OK, view(ttr=86400000)]))[2] == 86400


def test_reserved_priority_of_other_protocols_jobs_is_clamped():
    def prio(engine_priority):
        return reserved_fields(render_reserved([OK, view(priority=engine_priority)]))[1]

    assert prio(5) == 0                    # a workq job with priority 5
    assert prio(0) == 0
    assert prio(-7) == 7
    assert prio(-(2 ** 32 - 1)) == 2 ** 32 - 1
    assert prio(-(2 ** 40)) == 2 ** 32 - 1  # a TaskFlux key beyond u32


def test_reserve_timeout_and_errors():
    cmd = one(reserve())
    assert cmd.render([TIMEOUT, ""]) == b"TIMEOUT\0"
    assert cmd.render([SERVER_ERROR, "Shard 2 unavailable"]) == err("Shard 2 unavailable")
    assert cmd.render([SERVER_ERROR, ""]) == err("Failed to reserve job")


def test_ordering_module():
    assert ordering.from_goqueue(3) == -3 and ordering.to_goqueue(-3) == 3
    assert ordering.to_goqueue(1) == 0 and ordering.to_goqueue(-(2 ** 33)) == 2 ** 32 - 1
    assert ordering.from_taskflux(-5) == 5 and ordering.to_taskflux(5) == -5
    assert ordering.to_taskflux(-(2 ** 63)) == 2 ** 63 - 1   # -(-2**63) = 2**63 clamps
    assert ordering.to_taskflux(ordering.from_taskflux(-(2 ** 63))) == -(2 ** 63)
    assert ordering.to_taskflux(2 ** 70) == -(2 ** 63)


# ----------------------------------------------------------- unknown / junk
def test_unknown_uppercase_command_keeps_the_connection():
    codec = GoqueueCodec()
    cmds = codec.receive(b"STATS\0" + CONNECT)
    assert cmds[0].reply == b"ERROR\0Unknown Command STATS\0" and not cmds[0].close
    assert cmds[1].reply == b"OK\0"


@pytest.mark.parametrize("word", [b"add", b"Add", b"ADD1", b"HELLO WORLD", b"\x01\x02"])
def test_a_word_that_is_not_uppercase_errors_then_closes(word):
    codec = GoqueueCodec()
    cmds = codec.receive(word + b"\0" + CONNECT)
    assert len(cmds) == 1 and cmds[0].close
    assert cmds[0].reply == b"ERROR\0Unknown Command " + word + b"\0"
    assert codec.receive(CONNECT) == []


def test_an_empty_command_word_closes():
    cmd = one(b"\0CONNECT\0")
    assert cmd.close and cmd.reply == b"ERROR\0Unknown Command \0"


def test_invalid_utf8_word_is_reported_readably():
    cmd = one(b"\xff\0")
    assert cmd.close and cmd.reply == "ERROR\0Unknown Command \ufffd\0".encode()


def test_no_nul_within_64_bytes_closes():
    codec = GoqueueCodec()
    assert codec.receive(b"G" * 64) == []
    cmds = codec.receive(b"G")
    assert len(cmds) == 1 and cmds[0].close
    assert cmds[0].reply == err("Malformed command: no NUL within 64 bytes")


def test_http_request_is_rejected():
    cmd = one(b"GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8.0\r\nAccept: */*\r\n\r\n")
    assert cmd.close and cmd.reply.startswith(b"ERROR\0") and cmd.reply.endswith(b"\0")


# -------------------------------------------------- streaming and pipelining
MIXED = (CONNECT + add("q1", 5, 10, b"hello") + reserve("q1", 3) + delete(9) + b"NOPE\0"
         + add("", 1, 1, b"x") + add(b"\xff") + add("q2", 0, 0, b"") + reserve("q2", 0)
         + delete(2 ** 63) + CONNECT)


def test_pipelined_requests_all_decoded_in_order():
    cmds = GoqueueCodec().receive(MIXED)
    assert [c.op for c in cmds] == [None, "add", "lease", "delete_number", None, None, None,
                                    "add", "lease", "delete_number", None]
    assert cmds[1].args[1:5] == ("q1", b"hello", -5, 10000)
    assert cmds[4].reply == err("Unknown Command NOPE")
    assert cmds[5].reply == err("Error adding new job to queue ")
    assert cmds[9].key == 2 ** 63


def test_byte_by_byte_equals_all_at_once():
    whole = [describe(c) for c in GoqueueCodec().receive(MIXED)]
    codec = GoqueueCodec()
    split = []
    for i in range(len(MIXED)):
        split.extend(describe(c) for c in codec.receive(MIXED[i:i + 1]))
    assert split == whole


@pytest.mark.parametrize("size", [2, 3, 5, 7, 64])
def test_any_chunking_equals_all_at_once(size):
    whole = [describe(c) for c in GoqueueCodec().receive(MIXED)]
    codec = GoqueueCodec()
    split = []
    for i in range(0, len(MIXED), size):
        split.extend(describe(c) for c in codec.receive(MIXED[i:i + size]))
    assert split == whole


def test_incomplete_requests_wait_for_more():
    codec = GoqueueCodec()
    for partial in (b"ADD", b"\0q", b"ueue\0", u32(1), u32(2), u32(3), b"ab"):
        assert codec.receive(partial) == []
    cmds = codec.receive(b"c" + b"DEL")
    assert len(cmds) == 1 and cmds[0].args[1:5] == ("queue", b"abc", -1, 2000)
    assert codec.receive(b"ETE\0" + u64(5)[:7]) == []
    assert codec.receive(u64(5)[7:])[0].key == 5


def test_large_data_split_over_many_reads():
    data = bytes(range(256)) * 4096   # exactly 1 MiB
    stream = add("big", data=data)
    codec = GoqueueCodec()
    cmds = []
    for i in range(0, len(stream), 65536):
        cmds.extend(codec.receive(stream[i:i + 65536]))
    assert len(cmds) == 1 and cmds[0].args[2] == data


def test_errors_then_resync():
    codec = GoqueueCodec()
    stream = b"BAD\0" + add("") + add(b"\x80abc") + b"ALSOBAD\0" + add("ok") + CONNECT
    cmds = codec.receive(stream)
    assert [c.reply for c in cmds[:4]] == [
        err("Unknown Command BAD"), err("Error adding new job to queue "),
        err(INVALID_NAME), err("Unknown Command ALSOBAD")]
    assert cmds[4].op == "add" and cmds[4].key == "ok"
    assert cmds[5].reply == b"OK\0"
    assert not any(c.close for c in cmds)


def test_commands_before_a_fatal_error_are_kept():
    cmds = GoqueueCodec().receive(CONNECT + add("a") + b"lower\0" + CONNECT)
    assert [c.op for c in cmds] == [None, "add", None]
    assert cmds[2].close and not cmds[0].close
