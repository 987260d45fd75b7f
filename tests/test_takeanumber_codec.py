"""Unit tests for the sans-I/O takeanumber codec: bytes in, Command objects out,
replies rendered to exact bytes. No sockets.

The rules checked are those of the codec's docstring
(:mod:`queueserver.protocols.takeanumber`): RESERVE on an empty queue is
``:-1``, an empty body is ``No body provided.``, the original's error texts,
``\\n`` or ``\\r\\n`` line ends.
"""
from __future__ import annotations

import pytest

from codec_helpers import local_reply, only_command, shape

from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT
from queueserver.protocols import codec_class
from queueserver.protocols.base import BY_NAME, SERVER_ID
from queueserver.protocols.takeanumber import (
    MAX_LINE, TakeANumberCodec, render_add, render_len, render_ok, render_reserve,
)

SEED_ID = "0269073f-f624-4cf9-8c53-ab3d194137b3"
SEED_BODY = b'{"thing": 1, "also": "abc"}'


# ------------------------------------------------------------------ helpers
def decode(data: bytes, **options):
    return TakeANumberCodec(**options).receive(data)


def one(data: bytes, **options):
    return only_command(decode(data, **options))


def local(data: bytes, **options) -> bytes:
    return local_reply(one(data, **options))


def add_args(name, body, retries=0, ttr=0):
    return [None, name, body, 0, ttr, 0, -1, retries, None, False]  # -1: attempts unlimited


# ------------------------------------------------------------------ options
def test_registered_under_its_protocol_name():
    assert codec_class("takeanumber") is TakeANumberCodec


def test_reservation_timeout_defaults_to_never():
    assert TakeANumberCodec().reservation_timeout == 0
    assert one(b"ADD q 1 x\r\n").args[4] == 0


def test_reservation_timeout_becomes_the_jobs_ttr():
    cmd = one(b"ADD q 1 x\r\n", reservation_timeout=300)
    assert shape(cmd) == ("add", add_args("q", b"x", 1, ttr=300), BY_NAME, "q", SERVER_ID)


# --------------------------------------------------------------------- LEN
def test_len():
    cmd = one(b"LEN my_queue\r\n")
    assert shape(cmd) == ("size", ["my_queue"], BY_NAME, "my_queue", None)
    assert cmd.render([OK, 15]) == b":15\r\n"          # seed: existing queue
    assert cmd.render([OK, 0]) == b":0\r\n"            # seed: empty/non-existent queue


@pytest.mark.parametrize("line", [b"LEN\r\n", b"LEN \r\n", b"LEN a b\r\n"])
def test_len_parameter_count(line):
    assert local(line) == b"-ERR Missing LEN parameters.\r\n"


# --------------------------------------------------------------------- ADD
def test_add_seed_example():
    cmd = one(b'ADD my_queue 3 {"thing": 1, "also": "abc"}\r\n')
    assert shape(cmd) == ("add", add_args("my_queue", SEED_BODY, 3), BY_NAME, "my_queue", SERVER_ID)
    assert cmd.new_id == SERVER_ID  # the router makes the UUIDv4
    assert cmd.render([OK, [SEED_ID, 7]]) == b"+0269073f-f624-4cf9-8c53-ab3d194137b3\r\n"


def test_add_empty_body_seed_example():
    assert local(b"ADD nopenopenope 1 \r\n") == b"-ERR No body provided.\r\n"


@pytest.mark.parametrize("body", [b"a b  c", b" leading", b"\ttab", b"x", b"-ERR +OK :1",
                                  b"\xff\x00binary", b"a\t \tb"])
def test_add_body_is_the_rest_of_the_line_verbatim(body):
    assert one(b"ADD q 2 " + body + b"\r\n").args[2] == body


@pytest.mark.parametrize("body, kept", [(b"trailing  ", b"trailing"), (b"\ttab\t", b"\ttab"),
                                        (b"x \t \t", b"x"), (b"x\r", b"x\r")])
def test_trailing_spaces_and_tabs_of_a_line_are_stripped(body, kept):
    """As the original server trimmed its lines."""
    assert one(b"ADD q 2 " + body + b"\r\n").args[2] == kept
    assert one(b"LEN q" + body[len(body.rstrip(b" \t")):] + b"\n").key == "q"


@pytest.mark.parametrize("line", [b"ADD q 1 \r\n", b"ADD q 1\r\n", b"ADD q 1    \r\n",
                                  b"ADD q 1 \t\t \n", b"ADD q 1\t\r\n"])
def test_add_whitespace_only_body_is_an_empty_body(line):
    assert local(line) == b"-ERR No body provided.\r\n"


def test_add_bare_newline_line_end():
    assert one(b"ADD q 2 body\n").args[2] == b"body"


def test_add_only_one_cr_is_the_line_end():
    assert one(b"ADD q 2 body\r\r\n").args[2] == b"body\r"


@pytest.mark.parametrize("line", [b"ADD\r\n", b"ADD q\r\n", b"ADD  q 1 x\r\n",
                                  b"ADD \r\n", b"ADD q1\r\n", b"ADD q \t\r\n"])
def test_add_missing_parameters(line):
    assert local(line) == b"-ERR Missing ADD parameters.\r\n"


@pytest.mark.parametrize("retries", [b"x", b"1.5", b"", b"1e3", b"0x10", b"--1", b"9" * 30])
def test_add_invalid_retries(retries):
    assert local(b"ADD q " + retries + b" body\r\n") == b"-ERR Invalid number of retries.\r\n"


@pytest.mark.parametrize("retries,count", [(b"0", 0), (b"3", 3), (b"+4", 4), (b"-1", 0), (b"-99", 0),
                                           (b"007", 7), (b"4294967296", 2 ** 31 - 1)])
def test_add_retries_become_max_fails(retries, count):
    assert one(b"ADD q " + retries + b" body\r\n").args[7] == count


def test_add_retries_are_checked_before_the_body():
    assert local(b"ADD q x \r\n") == b"-ERR Invalid number of retries.\r\n"


def test_add_queue_name_must_be_utf8():
    assert local(b"ADD q\xff 1 body\r\n") == b"-ERR Invalid queue name.\r\n"
    assert one("ADD qü 1 body\r\n".encode()).key == "qü"


def test_empty_reserve_answers_minus_one_by_default():
    assert TakeANumberCodec().receive(b"RESERVE q\r\n")[0].render([TIMEOUT, ""]) == b":-1\r\n"


def test_empty_reserve_error_option_answers_as_the_original_server():
    cmd = one(b"RESERVE q\r\n", empty_reserve_error=True)
    assert cmd.render([TIMEOUT, ""]) == b"-ERR No items available to reserve.\r\n"
    view = [SEED_ID, "q", b"body", 1, 0, 0, 1, None]
    assert cmd.render([OK, view]) == f"+{SEED_ID} body\r\n".encode()
    assert cmd.render([SERVER_ERROR, "Shard 0 unavailable"]) == b"-ERR Shard 0 unavailable\r\n"
    # the other commands are unchanged by it
    assert one(b"LEN q\r\n", empty_reserve_error=True).render([OK, 0]) == b":0\r\n"


# ---------------------------------------------------------- payload limit
@pytest.mark.parametrize("limit", [1, 10, 1048576])
def test_body_at_max_payload_accepted_one_more_refused(limit):
    codec = TakeANumberCodec(max_payload=limit)
    assert codec.max_line == limit + 1024
    cmds = codec.receive(b"ADD q 0 " + b"x" * limit + b"\r\nADD q 0 " + b"y" * (limit + 1) + b"\r\n"
                         + b"LEN q\r\n")
    assert cmds[0].op == "add" and cmds[0].args[2] == b"x" * limit
    assert [shape(c) for c in cmds[1:]] == [("local", b"-ERR Body too large.\r\n", False),
                                            ("size", ["q"], BY_NAME, "q", None)]


def test_line_over_max_payload_plus_slack_is_too_long():
    codec = TakeANumberCodec(max_payload=10)
    cmds = codec.receive(b"ADD q 0 " + b"z" * 1100 + b"\r\nLEN q\r\n")
    assert [shape(c) for c in cmds] == [("local", b"-ERR Line too long.\r\n", False),
                                        ("size", ["q"], BY_NAME, "q", None)]


def test_add_render_errors():
    cmd = one(b"ADD q 1 body\r\n")
    assert cmd.render([SERVER_ERROR, "Shard 2 unavailable"]) == b"-ERR Shard 2 unavailable\r\n"
    assert cmd.render([CLIENT_ERROR, "Duplicate job"]) == b"-ERR Duplicate job\r\n"


# ----------------------------------------------------------------- RESERVE
def test_reserve():
    cmd = one(b"RESERVE my_queue\r\n")
    assert shape(cmd) == ("lease", [["my_queue"], 0], BY_NAME, "my_queue", None)
    view = [SEED_ID, "my_queue", SEED_BODY, 1, 0, 0, 1, (0, 0, 0, 1)]
    assert cmd.render([OK, view]) == \
        b'+0269073f-f624-4cf9-8c53-ab3d194137b3 {"thing": 1, "also": "abc"}\r\n'  # seed
    assert cmd.render([TIMEOUT, ""]) == b":-1\r\n"   # seed: empty queue
    assert cmd.render([SERVER_ERROR, "Shard 0 unavailable"]) == b"-ERR Shard 0 unavailable\r\n"


@pytest.mark.parametrize("line", [b"RESERVE\r\n", b"RESERVE a b\r\n"])
def test_reserve_parameter_count(line):
    assert local(line) == b"-ERR Missing RESERVE parameters.\r\n"


BAD_NAMES = [b"\xff", b"q\xc3", b"a\tb", b"x" * 256, b"a\x00b", b"del\x7f", "a\u00a0b".encode(),
             "a\u3000b".encode(), b"a\x0bb", b"\x1f"]


@pytest.mark.parametrize("raw", BAD_NAMES)
def test_invalid_queue_name_is_refused_by_every_command(raw):
    for line in (b"ADD " + raw + b" 1 body", b"LEN " + raw, b"RESERVE " + raw,
                 b"RETRY " + raw + b" " + SEED_ID.encode(), b"DONE " + raw + b" " + SEED_ID.encode()):
        assert local(line + b"\r\n") == b"-ERR Invalid queue name.\r\n", line


@pytest.mark.parametrize("name", ["q", "x" * 255, "очередь", "a/b:c!", "😀"])
def test_valid_queue_names(name):
    raw = name.encode()
    assert one(b"LEN " + raw + b"\r\n").key == name
    assert one(b"RESERVE " + raw + b"\r\n").key == name
    assert one(b"ADD " + raw + b" 0 x\r\n").key == name


def test_a_mebibyte_name_is_refused_by_the_name_check():
    raw = b"n" * 1048576
    assert local(b"LEN " + raw + b"\r\n") == b"-ERR Invalid queue name.\r\n"
    assert local(b"ADD " + raw + b" 0 x\r\n") == b"-ERR Invalid queue name.\r\n"


# ------------------------------------------------------------ RETRY / DONE
def test_retry():
    cmd = one(b"RETRY my_queue 0269073f-f624-4cf9-8c53-ab3d194137b3\r\n")
    assert shape(cmd) == ("retry", [SEED_ID, "my_queue"], BY_NAME, "my_queue", None)
    assert cmd.render([OK, None]) == b"+OK\r\n"                                     # seed
    assert cmd.render([CLIENT_ERROR, "No retries remaining."]) == b"-ERR No retries remaining.\r\n"
    assert cmd.render([NOT_FOUND, ""]) == b"-ERR No such Id.\r\n"
    assert cmd.render([SERVER_ERROR, "Shard 1 unavailable"]) == b"-ERR Shard 1 unavailable\r\n"


def test_done():
    cmd = one(b"DONE my_queue 0269073f-f624-4cf9-8c53-ab3d194137b3\r\n")
    assert shape(cmd) == ("done", [SEED_ID, "my_queue"], BY_NAME, "my_queue", None)
    assert cmd.render([OK, None]) == b"+OK\r\n"                                     # seed
    assert cmd.render([NOT_FOUND, ""]) == b"-ERR No such Id.\r\n"                   # seed
    assert cmd.render([SERVER_ERROR, "Shard 1 unavailable"]) == b"-ERR Shard 1 unavailable\r\n"


def test_done_seed_example_without_line_end_waits_for_it():
    codec = TakeANumberCodec()
    assert codec.receive(b"DONE nopenopenope 0269073f-ffff-4444-8888-ab3d194137b3") == []
    cmd, = codec.receive(b"\r\n")
    assert shape(cmd) == ("done", ["0269073f-ffff-4444-8888-ab3d194137b3", "nopenopenope"],
                          BY_NAME, "nopenopenope", None)
    assert cmd.render([NOT_FOUND, ""]) == b"-ERR No such Id.\r\n"


@pytest.mark.parametrize("verb", [b"RETRY", b"DONE"])
@pytest.mark.parametrize("args", [b"", b" q", b" q ", b" q id extra"])
def test_retry_done_missing_parameters(verb, args):
    assert local(verb + args + b"\r\n") == b"-ERR Missing " + verb + b" parameters.\r\n"


@pytest.mark.parametrize("verb", [b"RETRY", b"DONE"])
def test_retry_done_with_an_id_that_cannot_exist(verb):
    assert local(verb + b" q \xff\xfe\r\n") == b"-ERR No such Id.\r\n"


def test_extra_spaces_between_tokens_are_ignored():
    assert shape(one(b"  LEN q\r\n")) == ("size", ["q"], BY_NAME, "q", None)
    assert one(b" ADD q 1 x\r\n").args[2] == b"x"
    assert shape(one(b"DONE  q   id  \r\n")) == ("done", ["id", "q"], BY_NAME, "q", None)
    assert shape(one(b"LEN q \r\n")) == ("size", ["q"], BY_NAME, "q", None)


# ------------------------------------------------------------------- CLOSE
def test_close_answers_nothing_and_closes():
    cmd = one(b"CLOSE\r\n")
    assert shape(cmd) == ("local", b"", True)


def test_nothing_after_close_is_decoded():
    codec = TakeANumberCodec()
    cmds = codec.receive(b"LEN q\r\nCLOSE\r\nADD q 1 x\r\n")
    assert [c.op for c in cmds] == ["size", None]
    assert cmds[1].close
    assert codec.receive(b"ADD q 1 y\r\n") == []


# ------------------------------------------------------------ unrecognized
@pytest.mark.parametrize("line", [b"FOO\r\n", b"len q\r\n", b"Add q 1 x\r\n", b"LENX q\r\n", b"\r\n",
                                  b"\n", b"LEN\tq\r\n", b"ADD\tq 1 x\r\n", b"close\r\n", b"RESERVEq\r\n",
                                  b"\xff\r\n"])
def test_unrecognized_command(line):
    assert local(line) == b"-ERR Unrecognized command.\r\n"


# ----------------------------------------------------------------- framing
def test_line_ends_lf_and_crlf_are_alike():
    assert shape(one(b"LEN q\n")) == shape(one(b"LEN q\r\n"))
    assert shape(one(b"ADD q 1 x\n")) == shape(one(b"ADD q 1 x\r\n"))


def test_incomplete_line_waits():
    codec = TakeANumberCodec()
    assert codec.receive(b"LEN q") == []
    assert codec.receive(b"\r") == []
    assert shape(codec.receive(b"\n")[0]) == ("size", ["q"], BY_NAME, "q", None)


STREAM = (b"LEN a\r\nADD a 2 hello world\r\nRESERVE a\nRETRY a id1\r\nBAD\r\nDONE a id2\r\n"
          b"ADD a 1 \r\nADD a x y\r\nRETRY a\r\nLEN b\n")
EXPECTED = [
    ("size", ["a"], BY_NAME, "a", None),
    ("add", add_args("a", b"hello world", 2), BY_NAME, "a", SERVER_ID),
    ("lease", [["a"], 0], BY_NAME, "a", None),
    ("retry", ["id1", "a"], BY_NAME, "a", None),
    ("local", b"-ERR Unrecognized command.\r\n", False),
    ("done", ["id2", "a"], BY_NAME, "a", None),
    ("local", b"-ERR No body provided.\r\n", False),
    ("local", b"-ERR Invalid number of retries.\r\n", False),
    ("local", b"-ERR Missing RETRY parameters.\r\n", False),
    ("size", ["b"], BY_NAME, "b", None),
]


def test_pipelined_commands_decode_in_order():
    assert [shape(c) for c in decode(STREAM)] == EXPECTED


def test_byte_by_byte_streaming():
    codec = TakeANumberCodec()
    cmds = []
    for i in range(len(STREAM)):
        cmds += codec.receive(STREAM[i:i + 1])
    assert [shape(c) for c in cmds] == EXPECTED


@pytest.mark.parametrize("size", [2, 3, 7, 16])
def test_arbitrary_chunking(size):
    codec = TakeANumberCodec()
    cmds = []
    for i in range(0, len(STREAM), size):
        cmds += codec.receive(STREAM[i:i + size])
    assert [shape(c) for c in cmds] == EXPECTED


# --------------------------------------------------------- overlong lines
def test_default_line_limit_fits_a_mebibyte_body():
    body = b"x" * 1048576
    assert one(b"ADD q 1 " + body + b"\r\n").args[2] == body
    assert MAX_LINE == 1048576 + 1024


def test_overlong_line_is_an_error_and_resyncs_at_the_newline():
    codec = TakeANumberCodec(max_line=16)
    cmds = codec.receive(b"ADD q 1 " + b"x" * 40 + b"\r\nLEN q\r\n")
    assert [shape(c) for c in cmds] == [
        ("local", b"-ERR Line too long.\r\n", False),
        ("size", ["q"], BY_NAME, "q", None),
    ]


def test_overlong_line_arriving_in_pieces_answers_once():
    codec = TakeANumberCodec(max_line=16)
    cmds = codec.receive(b"LEN q\r\nADD q 1 " + b"x" * 20)
    assert [shape(c) for c in cmds] == [("size", ["q"], BY_NAME, "q", None),
                                        ("local", b"-ERR Line too long.\r\n", False)]
    assert codec.receive(b"y" * 100) == []
    assert codec.receive(b"z" * 100) == []
    cmds = codec.receive(b"zz\r\nRESERVE q\r\n")
    assert [shape(c) for c in cmds] == [("lease", [["q"], 0], BY_NAME, "q", None)]


def test_line_at_the_limit_is_accepted():
    line = b"LEN " + b"q" * 12   # 16 bytes
    assert one(line + b"\n", max_line=16).key == "q" * 12
    assert local(line + b"q\n", max_line=16) == b"-ERR Line too long.\r\n"


# --------------------------------------------------------------- rendering
def test_render_functions_directly():
    assert render_len([OK, 9231]) == b":9231\r\n"
    assert render_add([OK, [SEED_ID, 1]]) == f"+{SEED_ID}\r\n".encode()
    assert render_reserve([OK, [SEED_ID, "q", b"a b", 1, 0, 0, 1, None]]) == f"+{SEED_ID} a b\r\n".encode()
    assert render_reserve([TIMEOUT, ""]) == b":-1\r\n"
    assert render_ok([OK, None]) == b"+OK\r\n"
    assert render_ok([NOT_FOUND, ""]) == b"-ERR No such Id.\r\n"
    assert render_ok([CLIENT_ERROR, "No retries remaining."]) == b"-ERR No retries remaining.\r\n"
    for render in (render_len, render_add, render_reserve, render_ok):
        assert render([SERVER_ERROR, "Internal error"]) == b"-ERR Internal error\r\n"
        assert render([SERVER_ERROR, ""]) == b"-ERR Internal error\r\n"
