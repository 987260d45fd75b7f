"""A connection can move to another process at any command: the bytes from
that command on, decoded by a fresh codec restored to the state the first
codec had before it, give the same commands (this is what the direct path
hands over with a client socket)."""
from __future__ import annotations

import struct

import pytest

from codec_helpers import shape
from queueserver.protocols import codec_class

STREAMS = {
    "workq": (b"add 6ba7b810-9dad-11d1-80b4-00c04fd430c8 q 1000 60000 4\r\nping\r\n"
              + b"x" * 70000 + b"\r\n"                                # an overlong line
              + b"lease q 1000\r\nadd 6ba7b811-9dad-11d1-80b4-00c04fd430c8 r 1000 60000 3\r\nabc\r\n"
              + b"delete 6ba7b811-9dad-11d1-80b4-00c04fd430c8\r\n"),
    "takeanumber": b"ADD q 0 body\r\nLEN q\r\nRESERVE q\r\nDONE q 1234\r\n",
    "goqueue": (b"CONNECT\0ADD\0q\0" + struct.pack("<III", 0, 0, 3) + b"abc"
                + b"RESERVE\0q\0" + struct.pack("<I", 1) + b"DELETE\0" + struct.pack("<Q", 7)),
    "queued": b"ENQUE YQ==\nUSE other\nENQUE Yg==\nSIZE\nDEQUE\nUSE third\nHAS " + b"A" * 44 + b"\n",
    "taskflux": b"".join(b"D" + struct.pack(">i", len(body)) + body for body in (
        b"E" + struct.pack(">i", 1) + b"q" + struct.pack(">q", 5) + struct.pack(">i", 2) + b"xy",
        b"C" + struct.pack(">i", 1) + b"q",
        b"D" + struct.pack(">i", 1) + b"q")),
}


@pytest.mark.parametrize("protocol", sorted(STREAMS))
@pytest.mark.parametrize("chunk", [1, 7, 1 << 20])
def test_a_fresh_codec_goes_on_from_any_command(protocol, chunk):
    stream = STREAMS[protocol]
    cls = codec_class(protocol)
    first = cls()
    commands = []
    for i in range(0, len(stream), chunk):
        commands += first.receive(stream[i:i + chunk])
    assert len(commands) >= 3
    for k, command in enumerate(commands):
        if command.op is None:
            continue   # answered by the codec itself: never moved
        moved = cls()
        moved.restore(first.state_at(command))
        rest = moved.receive(stream[command.start:])
        assert [shape(c) for c in rest] == [shape(c) for c in commands[k:]], (protocol, k)


def test_unread_is_what_follows_a_command_while_it_is_buffered():
    codec = codec_class("takeanumber")()
    stream = STREAMS["takeanumber"]
    commands = codec.receive(stream)
    assert codec.unread(commands[2]) == b"RESERVE q\r\nDONE q 1234\r\n"
