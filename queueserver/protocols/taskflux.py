"""The TaskFlux protocol codec (sans-I/O).

Everything is big-endian. ``String`` is an Int32 byte length then UTF-8;
``Buffer`` an Int32 length then bytes. Packets::

    request    'D' Int32(length) body       (Data Request)
    response   'R' Int32(length) body       (Data Response)
    error      'e' Int32(length) message    (transport-level failure, UTF-8)

Request bodies and their response bodies::

    'E' String(queue) Int64(key) Buffer(data)   -> 'e' Byte(1)
    'D' String(queue)                           -> 'd' Byte(1) Int64(key) Buffer(data)
                                                 | 'd' Byte(0)              (queue empty)
    'C' String(queue)                           -> 'c' Int32(count)

Enqueue creates the queue (a record has no TTR, no TTL and no attempt limit,
should another protocol lease it); Dequeue removes the record (no acknowledgement);
Count counts ready records. Records are served smallest ``key`` first and FIFO
within a key (see :mod:`.ordering`; jobs added over other protocols show
their negated priority as key). The empty queue name ``""`` is valid and
always exists.

Business errors are a response body ``'E' Byte(type) String(message)``:

* type 1 ``Invalid queue name: at most 255 characters, ASCII 33 to 126 only``
  (the shared rule of :func:`.base.valid_queue_name`, ASCII only, and the
  empty name allowed)
* type 2 ``Queue <name> does not exist`` (Dequeue or Count of a missing queue)
* type 0 ``Data too large: at most <max_payload> bytes`` (Enqueue data over
  ``max_payload``, 1048576 by default), or any other failure, e.g.
  ``Shard 2 unavailable`` (a shard down).

Transport errors are ``'e'`` packets. For a well-framed request whose body
cannot be parsed the connection stays usable; messages:
``Malformed request: empty body``,
``Malformed request: unknown command marker 0x<hex>``,
``Malformed request: truncated <field>``,
``Malformed request: negative length <n> of <field>``,
``Malformed request: <n> unexpected bytes after the <command> request``
(``<field>`` is ``queue name``, ``key`` or ``data``). The framing itself
is lost, and the connection closed after the ``'e'`` packet, on
``Unknown packet marker 0x<hex>`` (the byte where a packet should start is
not ``'D'``), ``Invalid packet length <n>`` (negative) and
``Packet length <n> exceeds the limit of 1114112 bytes`` (``max_payload`` +
64 KiB).
"""
from __future__ import annotations

import struct
from functools import partial
from typing import Any, Final, Optional, Sequence, Tuple

from ..engine import status as S
from ..engine.status import Reply
from ..engine.views import as_lease
from . import ordering
from .base import (BY_NAME, MAX_PAYLOAD, Command, InputBuffer, StreamCodec, new_job, renderer,
                   valid_queue_name)

PACKET_SLACK: Final = 65536      # a packet's bytes besides an Enqueue's data
MAX_BODY: Final = MAX_PAYLOAD + PACKET_SLACK

REQUEST: Final = 0x44        # 'D'
RESPONSE: Final = b"R"
TRANSPORT_ERROR: Final = b"e"

# Business error types.
UNKNOWN_ERROR: Final = 0
INVALID_QUEUE_NAME: Final = 1
QUEUE_NOT_FOUND: Final = 2

INVALID_NAME_MESSAGE = "Invalid queue name: at most 255 characters, ASCII 33 to 126 only"

_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_HEAD: Final = struct.Struct(">ci")   # marker, body length
_I32_MAX: Final = 2 ** 31 - 1


# ---------------------------------------------------------------- rendering
def _string(value: bytes) -> bytes:
    return _I32.pack(len(value)) + value


def response(body: bytes) -> bytes:
    """A Data Response packet carrying ``body``."""
    return RESPONSE + _I32.pack(len(body)) + body


def transport_error(message: str) -> bytes:
    """An ``'e'`` packet: a failure below the command level."""
    return TRANSPORT_ERROR + _string(message.encode())


def business_error(kind: int, message: str) -> bytes:
    """A Data Response whose body is the ``'E'`` business error."""
    return response(b"E" + bytes((kind,)) + _string(message.encode()))


def _failure(reply: Reply, name: str = "") -> bytes:
    if reply[0] == S.NOT_FOUND:
        return business_error(QUEUE_NOT_FOUND, f"Queue {name} does not exist")
    return business_error(UNKNOWN_ERROR, str(reply[1] or "Internal error"))


def _dequeue_failure(reply: Reply, name: str = "") -> bytes:
    return response(b"d\x00") if reply[0] == S.TIMEOUT else _failure(reply, name)


def _dequeued(value: Sequence[Any]) -> bytes:
    """A taken job (a :class:`~queueserver.engine.views.LeaseView`, or its msgpack array)."""
    view = as_lease(value)
    return response(b"d\x01" + _I64.pack(ordering.to_taskflux(view.priority)) + _string(view.payload))


# Each is called with the command's queue ``name`` (for ``Queue <name> does not exist``).
render_enqueued: Final = renderer(lambda added: response(b"e\x01" if added else b"e\x00"), _failure)
render_dequeued: Final = renderer(_dequeued, _dequeue_failure)
render_count: Final = renderer(lambda count: response(b"c" + _I32.pack(min(int(count), _I32_MAX))),
                        _failure)


# ------------------------------------------------------------------ parsing
class _Malformed(Exception):
    """The body of a well-framed request cannot be parsed."""


class _Body:
    """Reads the fields of one request body."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 1  # after the command marker

    def int64(self, field: str) -> int:
        data, pos = self.data, self.pos
        if pos + 8 > len(data):
            raise _Malformed(f"Malformed request: truncated {field}")
        self.pos = pos + 8
        value: int = _I64.unpack_from(data, pos)[0]
        return value

    def sized(self, field: str) -> bytes:
        data, pos = self.data, self.pos
        if pos + 4 > len(data):
            raise _Malformed(f"Malformed request: truncated {field}")
        (n,) = _I32.unpack_from(data, pos)
        if n < 0:
            raise _Malformed(f"Malformed request: negative length {n} of {field}")
        pos += 4
        if pos + n > len(data):
            raise _Malformed(f"Malformed request: truncated {field}")
        self.pos = pos + n
        return data[pos:pos + n]

    def end(self, command: str) -> None:
        extra = len(self.data) - self.pos
        if extra:
            raise _Malformed(f"Malformed request: {extra} unexpected bytes after the {command} request")


def queue_name(raw: bytes) -> Optional[str]:
    """The queue name, or ``None``: the shared rule in ASCII (so at most 255
    characters of ASCII 33..126), and the empty name, TaskFlux's own queue."""
    if not raw:
        return ""
    name = valid_queue_name(raw)
    return name if name is not None and name.isascii() else None


def _parse(body: bytes) -> Tuple[str, bytes, Optional[Tuple[int, bytes]]]:
    """``(command, queue name, (key, data) or None)``; raises :class:`_Malformed`."""
    if not body:
        raise _Malformed("Malformed request: empty body")
    marker = body[0]
    reader = _Body(body)
    if marker == 0x45:    # 'E' Enqueue
        name = reader.sized("queue name")
        key = reader.int64("key")
        data = reader.sized("data")
        reader.end("Enqueue")
        return "E", name, (key, data)
    if marker == 0x44:    # 'D' Dequeue
        name = reader.sized("queue name")
        reader.end("Dequeue")
        return "D", name, None
    if marker == 0x43:    # 'C' Count
        name = reader.sized("queue name")
        reader.end("Count")
        return "C", name, None
    raise _Malformed(f"Malformed request: unknown command marker 0x{marker:02x}")


class TaskFluxCodec(StreamCodec):
    """Decodes one connection's TaskFlux byte stream into :class:`Command` objects.

    ``max_body``, the longest packet, defaults to ``max_payload`` and room
    for the rest of an Enqueue.
    """

    @staticmethod
    def refusal(message: str) -> bytes:
        return transport_error(message)

    def __init__(self, max_body: Optional[int] = None, *, max_payload: int = MAX_PAYLOAD,
                 **options: object) -> None:
        super().__init__()
        self.max_payload = max_payload
        self.max_body = max_payload + PACKET_SLACK if max_body is None else max_body

    def _fatal(self, message: str) -> Command:
        return Command.local(transport_error(message), close=True)

    def decode_next(self, buf: InputBuffer) -> Optional[Command]:
        data, pos = buf.data, buf.pos
        left = len(data) - pos
        if not left:
            return None
        buf.mark = pos
        marker = data[pos]
        if marker != REQUEST:
            return self._fatal(f"Unknown packet marker 0x{marker:02x}")
        if left < _HEAD.size:
            return None
        _, size = _HEAD.unpack_from(data, pos)
        if size < 0:
            return self._fatal(f"Invalid packet length {size}")
        if size > self.max_body:
            return self._fatal(f"Packet length {size} exceeds the limit of {self.max_body} bytes")
        if left < _HEAD.size + size:
            return None
        start = pos + _HEAD.size
        buf.pos = start + size
        body = bytes(data[start:start + size])
        try:
            command, name, extra = _parse(body)
        except _Malformed as err:
            return Command.local(transport_error(str(err)))
        return self._command(command, name, extra)

    def _command(self, command: str, raw_name: bytes,
                 extra: Optional[Tuple[int, bytes]]) -> Command:
        name = queue_name(raw_name)
        if name is None:
            return Command.local(business_error(INVALID_QUEUE_NAME, INVALID_NAME_MESSAGE))
        if command == "E":
            assert extra is not None   # an Enqueue has its key and data
            key, data = extra
            if len(data) > self.max_payload:
                return Command.local(business_error(
                    UNKNOWN_ERROR, f"Data too large: at most {self.max_payload} bytes"))
            return new_job(name, data, partial(render_enqueued, name=name),
                           priority=ordering.from_taskflux(key))
        must_exist = name != ""
        if command == "D":
            return Command("take", (name, must_exist), BY_NAME, name,
                           partial(render_dequeued, name=name))
        return Command("size", (name, must_exist), BY_NAME, name, partial(render_count, name=name))
