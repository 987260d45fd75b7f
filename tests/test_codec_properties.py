"""Property tests for every codec (hypothesis).

For each protocol:

* any split of a byte stream into chunks decodes to the same commands as the
  whole stream at once;
* a sequence mixing well-formed requests with invalid ones that keep the
  framing (garbage lines; packets with garbage bodies; refused names and
  sizes) gives exactly one command per request, in order, and never raises;
* arbitrary bytes never raise, and once a command closes the connection
  nothing more is decoded.
"""
from __future__ import annotations

import base64
import hashlib
import re
import struct
from typing import Callable, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec_helpers import shape

from queueserver.protocols.goqueue import GoqueueCodec
from queueserver.protocols.queued import QueuedCodec
from queueserver.protocols.takeanumber import TakeANumberCodec
from queueserver.protocols.taskflux import TaskFluxCodec
from queueserver.protocols.workq import WorkqCodec

FAST = settings(max_examples=200, deadline=None)
MAX_PAYLOAD = 16        # small limits, so that refusals are reached often
MAX_LINE = 96


def make_codecs() -> dict:
    """A fresh codec per protocol, with small limits."""
    return {
        "workq": WorkqCodec(max_payload=MAX_PAYLOAD, max_line=MAX_LINE),
        "takeanumber": TakeANumberCodec(max_payload=MAX_PAYLOAD, max_line=MAX_LINE),
        "queued": QueuedCodec(max_payload=MAX_PAYLOAD, max_line=MAX_LINE),
        "goqueue": GoqueueCodec(max_name=MAX_LINE, max_payload=MAX_PAYLOAD),
        "taskflux": TaskFluxCodec(max_payload=MAX_PAYLOAD),
    }


# ------------------------------------------------------------- strategies
# Built once at import: strategies made inside a draw are slow to validate.
def without(forbidden: bytes, strategy: st.SearchStrategy) -> st.SearchStrategy:
    """``strategy``'s bytes with the ``forbidden`` ones replaced (no rejections)."""
    table = bytes(ord("?") if i in forbidden else i for i in range(256))
    return strategy.map(lambda b: b.translate(table))


NAME = st.from_regex(rb"\A[a-zA-Z0-9_.-]{1,12}\Z")
ANY_NAME = st.one_of(NAME, without(b"\0\n", st.binary(max_size=20)))    # no NUL, no newline
ID = st.uuids().map(lambda u: str(u).encode())
PAYLOAD = st.binary(max_size=MAX_PAYLOAD + 8)
NUMBER = st.integers(0, 100000).map(lambda n: str(n).encode())
GARBAGE_LINE = without(b"\n", st.binary(max_size=MAX_LINE + 8))
EOL = st.sampled_from([b"\n", b"\r\n"])
WORD = st.from_regex(rb"\A[a-z][a-zA-Z0-9:_.=+-]{0,8}\Z")   # neither a number nor a flag
BLOCK_WORD = st.sampled_from([b"add", b"schedule", b"run", b"complete", b"fail"])
BLOCK_ARGS = {b"add": 5, b"schedule": 6, b"run": 5, b"complete": 2, b"fail": 2}
FLAG_TOKENS = st.lists(st.sampled_from([b"-priority=1", b"-priority", b"5", b"-x=", b"-Max", b"-=", b"-1"]),
                       max_size=3)


def line(*tokens: bytes) -> bytes:
    return b" ".join(tokens) + b"\r\n"


def block(data: bytes) -> bytes:
    return data + b"\r\n"


def with_block(head: bytes, data: bytes, flags: bytes = b"") -> bytes:
    """``head`` (a line without its end) with its size and flags, and the
    block its line makes readable (see :func:`framed`)."""
    return framed(head + b" " + str(len(data)).encode() + flags, data)


def framed(line_: bytes, data: bytes) -> bytes:
    """A block command's line and what the codec reads as its block: none
    when the size is unreadable (the block's lines would be requests of
    their own), ``data`` when the readable size is its length, else that
    many bytes (a miscounted line's size is read where the size belongs)."""
    size = readable_size(line_)
    if size is None:
        return line_ + b"\r\n"
    return line_ + b"\r\n" + block(data if size == len(data) else b"x" * size)


def readable_size(line_: bytes):
    """The size a block command's line gives, or None: at least the right
    number of positional tokens (``-key=value`` flags aside), the one at the
    size's place a number."""
    positional = positional_tokens(line_)
    count = BLOCK_ARGS[line_.split(b" ", 1)[0]]
    if len(positional) < count or re.fullmatch(rb"\+?[0-9]+", positional[count - 1]) is None:
        return None
    return int(positional[count - 1])


def positional_tokens(line_: bytes) -> list:
    """A command line's tokens after its word, ``-key=value`` flags aside."""
    tokens = [t for t in line_.rstrip(b"\r\n").split(b" ") if t]
    return [t for t in tokens[1:] if not (t.startswith(b"-") and b"=" in t)]


def odd_block(word: bytes, words: list, flags: list, data: bytes) -> bytes:
    """A block command with any argument count, flags (well-formed or not)
    after its size. One request: whatever its line's readable size (see
    :func:`framed`) is followed by that block, an unreadable one by none."""
    while flags and not flags[0][1:2].isalpha():   # flags start with a flag-like token
        flags = flags[1:]
    if word in (b"add", b"schedule", b"run"):
        words = [b"id", b"name"] + words            # a block command names its job first
    return framed(line(word, *words, str(len(data)).encode(), *flags).rstrip(b"\r\n"), data)


def no_workq_block(garbage: bytes) -> bytes:
    """A garbage line that is no block command (whose size would swallow what follows)."""
    garbage = garbage.rstrip(b"\r")
    tokens = [t for t in garbage.split(b" ") if t]
    return b"x" + garbage if tokens and tokens[0] in BLOCK_ARGS else garbage


# any name, spaces included, but no token that looks like a flag
WORKQ_NAME = st.one_of(NAME, without(b"-\0\n", st.binary(max_size=20)))
WORKQ_REQUEST = st.one_of(
    st.builds(lambda w, id, n, ttr, ttl, flags, data: with_block(b" ".join((w, id, n, ttr, ttl)), data, flags),
              st.sampled_from([b"add", b"run"]), ID, WORKQ_NAME, NUMBER, NUMBER,
              st.sampled_from([b"", b" -priority=5", b" -max-fails=1", b" -k=", b" -max-attempts=300",
                               b" -priority 5"]),
              st.binary(max_size=MAX_PAYLOAD)),   # over it, a miscounted line's size is not trusted
    st.builds(lambda id, n, t, data: with_block(b" ".join((b"schedule", id, n, b"1000", b"60000", t)), data),
              ID, NAME, st.sampled_from([b"2030-01-01T00:00:00Z", b"2016-02-30T00:00:00Z", b"soon"]), PAYLOAD),
    st.builds(lambda w, id, data: with_block(w + b" " + id, data),
              st.sampled_from([b"complete", b"fail"]), ID, PAYLOAD),
    st.builds(lambda names, t: line(b"lease", *names, t), st.lists(NAME, min_size=1, max_size=3), NUMBER),
    st.builds(lambda id, t: line(b"result", id, t), ID, NUMBER),
    st.builds(lambda id: line(b"delete", id), st.one_of(ID, WORD)),
    st.sampled_from([b"inspect server\r\n", b"inspect queues 0 10\r\n", b"inspect queue ping\r\n",
                     b"inspect jobs ping 0 101\r\n", b"inspect job nope\r\n", b"inspect\r\n"]),
    st.builds(odd_block, BLOCK_WORD, st.lists(WORD, max_size=5), FLAG_TOKENS,
              st.binary(max_size=MAX_PAYLOAD)),
    # a block command whose size cannot be read: no block follows
    st.builds(lambda w, words: line(w, *words), BLOCK_WORD, st.lists(WORD, max_size=7)),
    st.builds(lambda g, eol: no_workq_block(g) + eol, GARBAGE_LINE, EOL),
)

TAN_REQUEST = st.builds(
    lambda request, blanks, eol: request + blanks + eol,
    st.one_of(
        ANY_NAME.map(lambda n: b"LEN " + n), ANY_NAME.map(lambda n: b"RESERVE " + n),
        st.builds(lambda n, r, body: b"ADD " + n + b" " + r + b" " + body, ANY_NAME,
                  st.sampled_from([b"3", b"-1", b"x"]), without(b"\n", st.binary(max_size=MAX_PAYLOAD + 8))),
        st.builds(lambda verb, n, id: verb + b" " + n + b" " + id, st.sampled_from([b"RETRY", b"DONE"]),
                  ANY_NAME, ID),
        ANY_NAME.map(lambda n: b"ADD " + n + b" 1 \t "), st.just(b"CLOSE"), GARBAGE_LINE),
    st.sampled_from([b"", b" ", b"\t "]), EOL)

QUEUED_REQUEST = st.builds(
    lambda request, eol: request + eol,
    st.one_of(
        PAYLOAD.map(lambda item: b"ENQUE " + base64.b64encode(item)),
        st.sampled_from([b"DEQUE", b"SIZE", b"DEQUE x", b"USE", b"USE  "]),
        PAYLOAD.map(lambda item: b"HAS " + base64.b64encode(hashlib.sha256(item).digest())),
        PAYLOAD.map(lambda item: b"HAS " + base64.b64encode(item)),
        ANY_NAME.map(lambda n: b"USE " + n), GARBAGE_LINE),
    EOL)

# goqueue: requests that keep the framing (fatal ones are in the arbitrary-bytes test)
U32 = st.integers(0, 2 ** 32 - 1)
GOQUEUE_REQUEST = st.one_of(
    st.just(b"CONNECT\0"),
    st.builds(lambda n, p, data: b"ADD\0" + n + b"\0" + struct.pack("<III", p, 60, len(data)) + data,
              ANY_NAME, U32, st.binary(max_size=MAX_PAYLOAD)),
    st.builds(lambda n, t: b"RESERVE\0" + n + b"\0" + struct.pack("<I", t), ANY_NAME, U32),
    st.integers(0, 2 ** 64 - 1).map(lambda id: b"DELETE\0" + struct.pack("<Q", id)),
    st.from_regex(rb"\A[A-Z]{1,10}\Z").map(lambda word: word + b"\0"),
)


def tf_packet(body: bytes) -> bytes:
    return b"D" + struct.pack(">i", len(body)) + body


def tf_string(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


# TaskFlux: well-framed packets, with valid requests or bodies of any bytes
TF_NAME = st.one_of(NAME, st.just(b""), st.binary(max_size=20))
TASKFLUX_REQUEST = st.one_of(
    st.builds(lambda n, key, data: b"E" + tf_string(n) + struct.pack(">q", key) + tf_string(data),
              TF_NAME, st.integers(-2 ** 63, 2 ** 63 - 1), PAYLOAD),
    TF_NAME.map(lambda n: b"D" + tf_string(n)),
    TF_NAME.map(lambda n: b"C" + tf_string(n)),
    st.binary(max_size=40),
).map(tf_packet)

REQUESTS = {
    "workq": WORKQ_REQUEST,
    "takeanumber": TAN_REQUEST,
    "queued": QUEUED_REQUEST,
    "goqueue": GOQUEUE_REQUEST,
    "taskflux": TASKFLUX_REQUEST,
}
PROTOCOLS = sorted(REQUESTS)
ARBITRARY = st.binary(max_size=400)
ARBITRARY_AFTER = {  # well-formed requests, then junk
    protocol: st.builds(lambda valid, junk: b"".join(valid) + junk, st.lists(strategy, max_size=4),
                        st.binary(max_size=100))
    for protocol, strategy in REQUESTS.items()
}


# ---------------------------------------------------------------- helpers
def decode_in_chunks(codec, stream: bytes, cuts: List[int]) -> list:
    """Feed ``stream`` cut at ``cuts``; every command decoded."""
    commands = []
    start = 0
    for cut in sorted(set(cuts)) + [len(stream)]:
        commands += codec.receive(stream[start:cut])
        start = cut
    return commands


def each_protocol(test: Callable) -> Callable:
    """``test(protocol, data)`` as one hypothesis test per protocol."""
    return pytest.mark.parametrize("protocol", PROTOCOLS)(FAST(given(data=st.data())(test)))


# ------------------------------------------------------------- properties
@each_protocol
def test_one_command_per_request_and_any_split_alike(protocol, data):
    """Requests fed one by one give one command each (nothing after a close);
    the same bytes cut anywhere decode to the same commands."""
    requests = data.draw(st.lists(REQUESTS[protocol], min_size=1, max_size=6), label="requests")
    codec = make_codecs()[protocol]
    expected = []
    for request in requests:
        commands = codec.receive(request)
        if expected and expected[-1].close:
            assert commands == []
            continue
        assert len(commands) == 1, (request, [shape(c) for c in commands])
        expected += commands
    assert not expected[-1].close or protocol == "takeanumber"   # only CLOSE closes a framed request
    stream = b"".join(requests)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12), label="cuts")
    got = decode_in_chunks(make_codecs()[protocol], stream, cuts)
    assert [shape(c) for c in got] == [shape(c) for c in expected]


@each_protocol
def test_arbitrary_bytes_never_raise_and_nothing_follows_a_close(protocol, data):
    """Any bytes, cut anywhere, decode without an exception; a closing
    command is the last one."""
    raw = data.draw(st.one_of(ARBITRARY, ARBITRARY_AFTER[protocol]), label="bytes")
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=8), label="cuts")
    codec = make_codecs()[protocol]
    commands = decode_in_chunks(codec, raw, cuts)
    if any(c.close for c in commands):
        assert [c.close for c in commands].index(True) == len(commands) - 1
        assert codec.receive(raw) == []
