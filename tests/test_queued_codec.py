"""Unit tests for the sans-I/O queued codec: bytes in, Command objects out,
replies rendered to exact bytes. No sockets.

The rules checked are those of the codec's docstring
(:mod:`queueserver.protocols.queued`) and docs/protocols.md: replies end
with ``\\n``, ``\\r`` tolerated on input, standard padded base64, the
original's messages, duplicates dropped unless ``--allow-dups``, a
connection starts on ``default``.
"""
from __future__ import annotations

import base64
import hashlib

import pytest

from codec_helpers import local_reply, only_command, shape

from queueserver.engine.status import CLIENT_ERROR, OK, SERVER_ERROR, TIMEOUT
from queueserver.protocols import codec_class
from queueserver.protocols.base import BY_NAME, SERVER_ID
from queueserver.protocols.queued import (
    MAX_LINE, QueuedCodec, render_has, render_item, render_ok, render_size,
)

ITEM_HASH = b"SjPqzV+mXysuKHHNExKGtTxBWxMWZtcRc7tuP+WTYbM="   # the protocol's example: sha256(b"item")


def b64(data: bytes) -> bytes:
    return base64.b64encode(data)


def err(message: bytes) -> bytes:
    return b"ERROR " + b64(message) + b"\n"


# ------------------------------------------------------------------ helpers
def decode(data: bytes, **options):
    return QueuedCodec(**options).receive(data)


def one(data: bytes, **options):
    return only_command(decode(data, **options))


def local(data: bytes, **options) -> bytes:
    return local_reply(one(data, **options))


def add_args(name, item, unique=True):
    return [None, name, item, 0, 0, 0, -1, 0, None, unique]  # -1: attempts unlimited


# ------------------------------------------------------------------ options
def test_registered_under_its_protocol_name():
    assert codec_class("queued") is QueuedCodec


def test_duplicates_are_dropped_by_default():
    assert QueuedCodec().unique is True
    assert one(b"ENQUE aXRlbQ==\n").args[9] is True


def test_allow_dups_keeps_duplicates():
    assert one(b"ENQUE aXRlbQ==\n", allow_dups=True).args[9] is False


def test_connection_starts_on_default():
    assert QueuedCodec().queue == "default"
    assert one(b"SIZE\n").key == "default"


# ------------------------------------------------------------------- ENQUE
def test_enque():
    cmd = one(b"ENQUE aXRlbQ==\n")
    assert shape(cmd) == ("add", add_args("default", b"item"), BY_NAME, "default", SERVER_ID)
    assert cmd.render([OK, ["6ba7b810-9dad-41d1-80b4-00c04fd430c4", 1]]) == b"OK\n"
    assert cmd.render([OK, None]) == b"OK\n"   # dropped as a duplicate: still OK


def test_enque_binary_item_round_trips():
    data = bytes(range(256))
    assert one(b"ENQUE " + b64(data) + b"\n").args[2] == data


def test_enque_crlf_and_surrounding_whitespace_tolerated():
    assert one(b"ENQUE aXRlbQ==\r\n").args[2] == b"item"
    assert one(b"ENQUE  aXRlbQ== \t\r\n").args[2] == b"item"


def test_enque_empty_argument_is_the_empty_item():
    assert one(b"ENQUE \n").args[2] == b""


@pytest.mark.parametrize("arg", [b"aXRlbQ", b"a", b"!!!!", b"aXRl bQ==", b"aXRlbQ==aXRlbQ==", b"=",
                                 b"aXRlbQ-_", b"\xff\xfe"])
def test_enque_bad_base64(arg):
    assert local(b"ENQUE " + arg + b"\n") == err(b"bad line '" + arg + b"'")


def test_enque_bad_base64_message_is_trimmed():
    assert local(b"ENQUE  nope! \r\n") == err(b"bad line 'nope!'")


def test_enque_without_data():
    assert local(b"ENQUE\n") == err(b"bad line ''")
    assert local(b"ENQUE\r\n") == err(b"bad line ''")


def test_enque_render_errors():
    cmd = one(b"ENQUE aXRlbQ==\n")
    assert cmd.render([SERVER_ERROR, "Shard 1 unavailable"]) == err(b"Shard 1 unavailable")
    assert cmd.render([CLIENT_ERROR, "Duplicate job"]) == err(b"Duplicate job")


# ------------------------------------------------------------------- DEQUE
def test_deque():
    cmd = one(b"DEQUE\n")
    assert shape(cmd) == ("take", ["default"], BY_NAME, "default", None)
    view = ["6ba7b810-9dad-41d1-80b4-00c04fd430c4", "default", b"item", 1, 0, 0, 0, None]
    assert cmd.render([OK, view]) == b"ITEM aXRlbQ==\n"


def test_deque_empty_queue_seed_bytes():
    assert one(b"DEQUE\n").render([TIMEOUT, ""]) == b"ERROR cXVldWUgaXMgZW1wdHk=\n"


def test_deque_empty_item():
    assert render_item([OK, ["x", "default", b"", 1, 0, 0, 0, None]]) == b"ITEM \n"


def test_deque_with_data_is_an_error():
    expected = err(b"recieved msg data when none was expected")
    assert local(b"DEQUE x\n") == expected
    assert local(b"DEQUE \n") == expected


def test_deque_crlf():
    assert shape(one(b"DEQUE\r\n")) == ("take", ["default"], BY_NAME, "default", None)


# --------------------------------------------------------------------- HAS
def test_has_seed_example():
    assert base64.b64encode(hashlib.sha256(b"item").digest()) == ITEM_HASH
    cmd = one(b"HAS " + ITEM_HASH + b"\n")
    assert shape(cmd) == ("has", ["default", hashlib.sha256(b"item").digest()], BY_NAME, "default", None)
    assert cmd.render([OK, True]) == b"TRUE\n"
    assert cmd.render([OK, False]) == b"FALSE\n"
    assert cmd.render([SERVER_ERROR, "Shard 0 unavailable"]) == err(b"Shard 0 unavailable")


@pytest.mark.parametrize("size", [0, 1, 31, 33, 64])
def test_has_wrong_hash_size(size):
    arg = b64(b"h" * size)
    assert local(b"HAS " + arg + b"\n") == err(f"Expected a hash of size 32 got {size}".encode())


def test_has_bad_base64_and_missing_data():
    assert local(b"HAS nop!\n") == err(b"bad line 'nop!'")
    assert local(b"HAS\n") == err(b"bad line ''")


# -------------------------------------------------------------------- SIZE
def test_size():
    cmd = one(b"SIZE\n")
    assert shape(cmd) == ("size", ["default"], BY_NAME, "default", None)
    assert cmd.render([OK, 9231]) == b"SIZE 9231\n"   # the protocol's example
    assert cmd.render([OK, 0]) == b"SIZE 0\n"
    assert cmd.render([SERVER_ERROR, "Shard 2 unavailable"]) == err(b"Shard 2 unavailable")


def test_size_ignores_data():
    assert shape(one(b"SIZE whatever\n")) == ("size", ["default"], BY_NAME, "default", None)


# --------------------------------------------------------------------- USE
def test_use_switches_the_queue_for_later_commands():
    codec = QueuedCodec()
    cmds = codec.receive(b"USE jobs\nENQUE aXRlbQ==\nDEQUE\nSIZE\nHAS " + ITEM_HASH + b"\n")
    assert shape(cmds[0]) == ("create_queue", ["jobs"], BY_NAME, "jobs", None)
    assert cmds[0].render([OK, None]) == b"OK\n"
    assert [c.key for c in cmds] == ["jobs"] * 5
    assert cmds[1].args[1] == "jobs" and cmds[2].args == ("jobs",)
    assert codec.queue == "jobs"


def test_use_applies_at_decode_time_when_pipelined():
    cmds = decode(b"ENQUE YQ==\nUSE one\nENQUE Yg==\nUSE two\nENQUE Yw==\nUSE default\nDEQUE\n")
    assert [(c.op, c.key) for c in cmds] == [
        ("add", "default"), ("create_queue", "one"), ("add", "one"), ("create_queue", "two"),
        ("add", "two"), ("create_queue", "default"), ("take", "default")]


def test_use_without_a_name():
    assert local(b"USE\n") == err(b"Must supply a queue name")
    assert local(b"USE\n") == b"ERROR TXVzdCBzdXBwbHkgYSBxdWV1ZSBuYW1l\n"
    assert local(b"USE \n") == err(b"Must supply a (non-blank) queue name")
    assert local(b"USE  \t \r\n") == err(b"Must supply a (non-blank) queue name")


def test_use_name_is_trimmed_utf8():
    assert one(b"USE  jobs \r\n").key == "jobs"
    assert one("USE очередь-ü\n".encode()).key == "очередь-ü"
    assert one(b"USE a/b:c.d!\n").key == "a/b:c.d!"


@pytest.mark.parametrize("raw", [b"a b", b"a\tb", b"\xff\xfe", "a\u00a0b".encode()])
def test_use_bad_name_keeps_the_current_queue(raw):
    codec = QueuedCodec()
    cmds = codec.receive(b"USE " + raw + b"\nSIZE\n")
    assert shape(cmds[0]) == ("local", err(b"bad line '" + raw + b"'"), False)
    assert cmds[1].key == "default" and codec.queue == "default"


def test_failed_use_does_not_switch():
    codec = QueuedCodec()
    codec.receive(b"USE jobs\n")
    codec.receive(b"USE\n")
    assert codec.queue == "jobs"


# ---------------------------------------------------------- unknown commands
@pytest.mark.parametrize("command", [b"enque", b"Deque", b"FOO", b"PUSH", b"ITEM", b"OK"])
def test_unknown_command(command):
    assert local(command + b" aXRlbQ==\n") == err(b"bad command recieved, '" + command + b"'")


def test_unknown_command_sic_bytes():
    assert local(b"FOO\n") == b"ERROR YmFkIGNvbW1hbmQgcmVjaWV2ZWQsICdGT08n\n"


def test_empty_line_is_an_unknown_command():
    assert local(b"\n") == err(b"bad command recieved, ''")
    assert local(b"\r\n") == err(b"bad command recieved, ''")


def test_command_word_is_trimmed():
    assert shape(one(b"\tSIZE\n")) == ("size", ["default"], BY_NAME, "default", None)


# ----------------------------------------------------------------- framing
STREAM = (b"ENQUE aXRlbQ==\nSIZE\r\nBOGUS\nDEQUE\nENQUE !!\r\nHAS " + ITEM_HASH + b"\n"
          b"USE other\nHAS YQ==\nDEQUE\nUSE\nSIZE\n")
EXPECTED = [
    ("add", add_args("default", b"item"), BY_NAME, "default", SERVER_ID),
    ("size", ["default"], BY_NAME, "default", None),
    ("local", err(b"bad command recieved, 'BOGUS'"), False),
    ("take", ["default"], BY_NAME, "default", None),
    ("local", err(b"bad line '!!'"), False),
    ("has", ["default", hashlib.sha256(b"item").digest()], BY_NAME, "default", None),
    ("create_queue", ["other"], BY_NAME, "other", None),
    ("local", err(b"Expected a hash of size 32 got 1"), False),
    ("take", ["other"], BY_NAME, "other", None),
    ("local", err(b"Must supply a queue name"), False),
    ("size", ["other"], BY_NAME, "other", None),
]


def test_pipelined_commands_decode_in_order():
    assert [shape(c) for c in decode(STREAM)] == EXPECTED


def test_byte_by_byte_streaming():
    codec = QueuedCodec()
    cmds = []
    for i in range(len(STREAM)):
        cmds += codec.receive(STREAM[i:i + 1])
    assert [shape(c) for c in cmds] == EXPECTED


@pytest.mark.parametrize("size", [2, 5, 13])
def test_arbitrary_chunking(size):
    codec = QueuedCodec()
    cmds = []
    for i in range(0, len(STREAM), size):
        cmds += codec.receive(STREAM[i:i + size])
    assert [shape(c) for c in cmds] == EXPECTED


def test_incomplete_line_waits():
    codec = QueuedCodec()
    assert codec.receive(b"ENQUE aXRl") == []
    assert codec.receive(b"bQ==\r") == []
    assert codec.receive(b"\n")[0].args[2] == b"item"


# --------------------------------------------------------- overlong lines
def test_default_line_limit_fits_a_mebibyte_item():
    item = bytes(range(256)) * 4096
    assert one(b"ENQUE " + b64(item) + b"\n").args[2] == item
    assert MAX_LINE >= len(b"ENQUE " + b64(item))


def test_overlong_line_is_an_error_and_resyncs():
    codec = QueuedCodec(max_line=16)
    cmds = codec.receive(b"ENQUE " + b64(b"x" * 40) + b"\nSIZE\n")
    assert [shape(c) for c in cmds] == [("local", err(b"line too long"), False),
                                        ("size", ["default"], BY_NAME, "default", None)]


def test_overlong_line_in_pieces_answers_once():
    codec = QueuedCodec(max_line=16)
    cmds = codec.receive(b"SIZE\nENQUE " + b"A" * 30)
    assert [shape(c) for c in cmds] == [("size", ["default"], BY_NAME, "default", None),
                                        ("local", err(b"line too long"), False)]
    assert codec.receive(b"A" * 100) == []
    cmds = codec.receive(b"AA==\nDEQUE\n")
    assert [shape(c) for c in cmds] == [("take", ["default"], BY_NAME, "default", None)]


# --------------------------------------------------------------- rendering
def test_render_functions_directly():
    assert render_ok([OK, None]) == b"OK\n"
    assert render_item([OK, ["i", "q", b"\x00\xff", 1, 0, 0, 0, None]]) == b"ITEM AP8=\n"
    assert render_item([TIMEOUT, ""]) == b"ERROR cXVldWUgaXMgZW1wdHk=\n"
    assert render_has([OK, True]) == b"TRUE\n"
    assert render_has([OK, False]) == b"FALSE\n"
    assert render_size([OK, 3]) == b"SIZE 3\n"
    for render in (render_ok, render_item, render_has, render_size):
        assert render([SERVER_ERROR, "Internal error"]) == err(b"Internal error")
        assert render([SERVER_ERROR, ""]) == err(b"internal error")


# ------------------------------------------------------------ queue names
@pytest.mark.parametrize("raw", [b"a\x00b", b"del\x7f", b"\x1b[31m", "a\u2028b".encode(), "a\u3000b".encode(),
                                 b"x" * 256, b"q\xc3"])
def test_use_refuses_names_breaking_the_shared_rule(raw):
    codec = QueuedCodec()
    cmds = codec.receive(b"USE jobs\nUSE " + raw + b"\nSIZE\n")
    assert shape(cmds[1]) == ("local", err(b"bad line '" + raw[:64] + (b"..." if len(raw) > 64 else b"")
                                             + b"'"), False)
    assert cmds[2].key == "jobs" and codec.queue == "jobs"


@pytest.mark.parametrize("name", ["x" * 255, "ü" * 127, "a.b/c:d", "😀"])
def test_use_accepts_names_up_to_255_bytes(name):
    assert one(b"USE " + name.encode() + b"\n").key == name


def test_a_mebibyte_name_is_refused_and_not_echoed():
    reply = local(b"USE " + b"n" * 1048576 + b"\n")
    assert reply == err(b"bad line '" + b"n" * 64 + b"...'")


def test_bad_line_echo_is_bounded():
    assert local(b"ENQUE " + b"!" * 100 + b"\n") == err(b"bad line '" + b"!" * 64 + b"...'")
    assert local(b"ENQUE " + b"!" * 64 + b"\n") == err(b"bad line '" + b"!" * 64 + b"'")


# ---------------------------------------------------------- payload limit
@pytest.mark.parametrize("limit", [1, 4, 1048576])
def test_item_at_max_payload_accepted_one_more_refused(limit):
    codec = QueuedCodec(max_payload=limit)
    assert codec.max_line >= len(b"ENQUE " + b64(b"x" * (limit + 1)))
    cmds = codec.receive(b"ENQUE " + b64(b"x" * limit) + b"\nENQUE " + b64(b"y" * (limit + 1))
                         + b"\nSIZE\n")
    assert cmds[0].op == "add" and cmds[0].args[2] == b"x" * limit
    assert [shape(c) for c in cmds[1:]] == [("local", err(b"item too large"), False),
                                            ("size", ["default"], BY_NAME, "default", None)]


def test_line_limit_is_derived_from_max_payload():
    assert QueuedCodec().max_line == MAX_LINE == 4 * ((1048576 + 2) // 3) + 1024
    assert QueuedCodec(max_payload=3).max_line == 4 + 1024
    cmds = QueuedCodec(max_payload=3).receive(b"ENQUE " + b"A" * 1100 + b"\nSIZE\n")
    assert [shape(c) for c in cmds] == [("local", err(b"line too long"), False),
                                        ("size", ["default"], BY_NAME, "default", None)]
