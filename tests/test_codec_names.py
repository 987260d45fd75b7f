"""The shared queue-name rule (protocols/base.py) and the reply-token escaping
that keeps a name from breaking a reply's framing.

Decisions file, "Every protocol": where a seed is silent a queue name is 1 to
255 bytes, without control characters or whitespace, and no reply ever
carries a name that breaks its framing. workq (seed charset) and TaskFlux
(ASCII 33..126, empty allowed) are stricter; every name they accept must also
pass the shared rule (the empty TaskFlux name aside).
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec_helpers import only_command

from queueserver.protocols.base import LOCAL, name_token, valid_queue_name
from queueserver.protocols.taskflux import TaskFluxCodec, queue_name
from queueserver.protocols.workq import WorkqCodec

FAST = settings(max_examples=200, deadline=None)


@pytest.mark.parametrize("name", ["q", "x" * 255, "a.b-c_d", "a/b:c!{}", "очередь", "é" * 127, "😀" * 63,
                                  "~", "a\u200bb"])
def test_valid_names(name):
    assert valid_queue_name(name.encode()) == name


@pytest.mark.parametrize("raw", [
    b"", b"x" * 256, "é".encode() * 128, b"a b", b"a\tb", b"a\r", b"\n", b"a\x00", b"\x7f", b"\x1b",
    "a\u0085b".encode(), "a\u00a0b".encode(), "a\u2028b".encode(), "a\u3000b".encode(), "\u0080".encode(),
    b"\xff", b"\xc3", b"\xed\xa0\x80",   # invalid UTF-8, an encoded surrogate
], ids=repr)
def test_invalid_names(raw):
    assert valid_queue_name(raw) is None


def test_length_counts_bytes_not_characters():
    assert valid_queue_name("é".encode() * 127 + b"x") is not None     # 255 bytes
    assert valid_queue_name("é".encode() * 128) is None                # 256 bytes


@pytest.mark.parametrize("name, token", [
    ("ping", "ping"), ("", '""'), ("a b", "a\\x20b"), ("a\r\nb", "a\\x0d\\x0ab"), ("\x00\x7f", "\\x00\\x7f"),
    ("a\u2028", "a\\u2028"), ("a\u00a0", "a\\xa0"), ("очередь", "очередь"), ("x\ty", "x\\x09y"),
])
def test_name_token(name, token):
    assert name_token(name) == token


@FAST
@given(st.text(max_size=40))
def test_name_token_is_always_one_safe_token(name):
    token = name_token(name)
    assert token
    assert valid_queue_name(token.encode()) is not None or len(token.encode()) > 255
    assert not any(c.isspace() for c in token)
    if valid_queue_name(name.encode()) is not None:
        assert token == name        # a valid name is printed as it is


def workq_accepts(raw: bytes) -> bool:
    if b"\n" in raw or b" " in raw:   # not one token of a line
        return False
    cmd = only_command(WorkqCodec().receive(b"inspect queue " + raw + b"\r\n"))
    return cmd.route != LOCAL


def taskflux_accepts(raw: bytes) -> bool:
    body = b"C" + struct.pack(">i", len(raw)) + raw
    cmd = only_command(TaskFluxCodec().receive(b"D" + struct.pack(">i", len(body)) + body))
    return cmd.route != LOCAL


NAMES = st.one_of(st.binary(max_size=300), st.text(max_size=260).map(str.encode),
                  st.from_regex(rb"\A[a-zA-Z0-9_.-]{1,260}\Z"))


@FAST
@given(NAMES)
def test_stricter_protocol_rules_imply_the_shared_rule(raw):
    if workq_accepts(raw):
        assert valid_queue_name(raw) == raw.decode()
    if taskflux_accepts(raw):
        assert raw == b"" or valid_queue_name(raw) == raw.decode()
        assert queue_name(raw) == raw.decode()
