"""The goqueue protocol codec (sans-I/O).

Binary, little-endian. ``<string>`` is UTF-8 ending in a NUL byte; ``<data>``
is a u32 length then that many bytes. Requests::

    CONNECT\\0                                   -> OK\\0
    ADD\\0 <queue>\\0 <priority u32> <ttp u32> <data> -> ADDED\\0 <id u64>
    DELETE\\0 <id u64>                           -> OK\\0
    RESERVE\\0 <queue>\\0 <timeout u32>             -> RESERVED\\0 <id u64> <priority u32>
                                                   <ttp u32> reserved\\0 <data>
                                                 | TIMEOUT\\0

Mapping onto the shared store:

* ``<id>`` is the job's 64-bit number (server-made, from 1, increasing), so
  ``DELETE`` reaches a job on any shard, whichever protocol added it.
* ``<priority>`` is served lowest first, FIFO within one priority; see
  :mod:`.ordering` for how it maps onto the engine and how other protocols'
  jobs are shown (clamped into 0..2**32-1).
* ``<ttp>`` seconds become the lease's TTR: a reserved job not deleted in
  time returns to ready (0: never), as often as it happens (no attempt
  limit). RESERVED shows ``ttr_ms // 1000``. Jobs never expire (no TTL).
* RESERVE ``<timeout>`` is in seconds; 0 waits without limit.
* A queue name follows the shared rule (:func:`.base.valid_queue_name`:
  1 to 255 bytes of UTF-8, no whitespace or control characters), so neither
  ADD nor RESERVE reaches TaskFlux's always-present queue ``""``.

Every error is ``ERROR\\0<message>\\0``. Messages:

* ``Unknown Command <X>``: ``X`` is an uppercase word (``[A-Z]+``) that is
  no command; the connection stays usable (the next byte starts a request).
  If the word is not an uppercase word (lowercase, digits, binary, empty)
  the framing is lost: same message, then the connection is closed.
* ``Malformed command: no NUL within 64 bytes``: no command word ends within
  64 bytes; closes the connection.
* ``Error adding new job to queue <queue>``: ADD with an empty queue name
  (the original's text), or an ADD the store refused.
* ``Invalid queue name: 1 to 255 bytes of UTF-8, no whitespace or control
  characters``: any other name breaking the rule (RESERVE of the empty name
  too). The whole request (ADD's fixed fields and data included) is
  consumed and the connection stays usable.
* ``Malformed ADD command: queue name longer than 65536 bytes`` (likewise for
  RESERVE: no NUL within 65536 bytes) and ``Malformed ADD command: job data
  longer than <max_payload> bytes`` (1048576 by default): the framing is
  lost, the connection is closed after the error.
* ``Job <id> already deleted``: DELETE of an id that does not exist.
* A server-side failure (a shard down) answers ``ERROR\\0<its message>\\0``.

Unlike the original, which lost whatever followed the first request in one
read, pipelined requests are all answered, in order.
"""
from __future__ import annotations

import re
import struct
from functools import partial
from typing import Any, Final, Optional, Sequence

from ..engine import status as S
from ..engine.status import Reply
from ..engine.views import as_lease
from . import ordering
from .base import (BY_NAME, BY_NUMBER, MAX_PAYLOAD, QUEUE_NAME_RULE, Command, InputBuffer,
                   StreamCodec, new_job, renderer, valid_queue_name)

MAX_WORD: Final = 64             # a command word longer than this is not one
MAX_NAME: Final = 65536          # bytes scanned for a queue name's NUL before the framing is lost

INVALID_NAME = "Invalid queue name: " + QUEUE_NAME_RULE

_WORD: Final = re.compile(rb"\A[A-Z]+\Z")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_ADD_FIXED: Final = struct.Struct("<III")   # priority, ttp, data length
_REQUESTS: Final = frozenset((b"ADD", b"DELETE", b"RESERVE"))

OK_REPLY: Final = b"OK\0"
TIMEOUT_REPLY: Final = b"TIMEOUT\0"
STATUS_RESERVED: Final = b"reserved"
#: RESERVED's head: the word, id, priority, ttp, the status and the data length.
_RESERVED: Final = struct.Struct(f"<9sQII{len(STATUS_RESERVED) + 1}sI")


# ---------------------------------------------------------------- rendering
def error(message: str) -> bytes:
    """``ERROR\\0<message>\\0``; a NUL inside ``message`` would break framing."""
    return b"ERROR\0" + message.replace("\0", "").encode() + b"\0"


def _failure(reply: Reply, fallback: str) -> bytes:
    if (reply[0] == S.SERVER_ERROR or reply[0] == S.FORBIDDEN) and reply[1]:
        return error(str(reply[1]))
    return error(fallback)


def _add_failure(reply: Reply, name: str = "") -> bytes:
    return _failure(reply, f"Error adding new job to queue {name}")


def _delete_failure(reply: Reply, id: int = 0) -> bytes:
    if reply[0] == S.NOT_FOUND:
        return error(f"Job {id} already deleted")
    return _failure(reply, f"Failed to delete job {id}")


def _reserve_failure(reply: Reply) -> bytes:
    return TIMEOUT_REPLY if reply[0] == S.TIMEOUT else _failure(reply, "Failed to reserve job")


def _reserved(value: Sequence[Any]) -> bytes:
    """A leased job (a :class:`~queueserver.engine.views.LeaseView`, or its msgpack array)."""
    view = as_lease(value)
    payload = view.payload
    ttp = min(max(view.ttr // 1000, 0), ordering.U32_MAX)
    return _RESERVED.pack(b"RESERVED\0", view.number, ordering.to_goqueue(view.priority), ttp,
                          STATUS_RESERVED + b"\0", len(payload)) + payload


#: ``ADDED\0`` and the new job's number (the value is ``[id, number]``);
#: called with the queue's ``name`` for the error.
render_added: Final = renderer(lambda added: b"ADDED\0" + _U64.pack(added[1]), _add_failure)
#: Called with the job number ``id`` for the error.
render_deleted: Final = renderer(lambda _: OK_REPLY, _delete_failure)
render_reserved: Final = renderer(_reserved, _reserve_failure)


# ------------------------------------------------------------------ parsing
class _Fatal(Exception):
    """The stream cannot be followed any further: answer, then close."""


class _TooLong(Exception):
    """No NUL within a string's length limit."""


class GoqueueCodec(StreamCodec):
    """Decodes one connection's goqueue byte stream into :class:`Command` objects.

    The decoder is incremental: a request split over any number of reads is
    decoded once it is whole, and no byte is scanned twice. A reservation
    belongs to its connection: when the connection closes, the jobs it still
    holds are ready again (with TTP 0 nothing else would ever free them).
    """

    leases_end_with_connection = True

    @staticmethod
    def refusal(message: str) -> bytes:
        return error(message)

    def __init__(self, max_name: int = MAX_NAME, *, max_payload: int = MAX_PAYLOAD,
                 **options: object) -> None:
        super().__init__()
        self.max_name = max_name
        self.max_payload = max_payload
        self._word: Optional[bytes] = None   # the request being decoded
        self._name: Optional[bytes] = None   # its queue name, once read
        self._scanned = 0                    # bytes already searched for a NUL

    def decode_next(self, buf: InputBuffer) -> Optional[Command]:
        try:
            return self._next(buf)
        except _Fatal as err:  # the framing is lost: answer, then close
            return Command.local(error(str(err)), close=True)

    # -- pieces
    def _string(self, buf: InputBuffer, limit: int) -> Optional[bytes]:
        """The next NUL-terminated string (NUL consumed), ``None`` while incomplete.

        Raises :class:`_TooLong` once ``limit`` bytes have come without a NUL.
        """
        data, pos = buf.data, buf.pos
        left = len(data) - pos
        end = left if left <= limit else limit + 1
        i = data.find(b"\0", pos + self._scanned, pos + end)
        if i < 0:
            if left > limit:
                raise _TooLong()
            self._scanned = end
            return None
        self._scanned = 0
        buf.pos = i + 1
        return bytes(data[pos:i])

    def _next(self, buf: InputBuffer) -> Optional[Command]:
        if self._word is None:
            buf.mark = buf.pos
            try:
                word = self._string(buf, MAX_WORD)
            except _TooLong:
                raise _Fatal(f"Malformed command: no NUL within {MAX_WORD} bytes") from None
            if word is None:
                return None
            if word not in _REQUESTS:
                if not _WORD.match(word):
                    raise _Fatal("Unknown Command " + word.decode("utf-8", "replace"))
                if word == b"CONNECT":
                    return Command.local(OK_REPLY)
                return Command.local(error("Unknown Command " + word.decode()))
            self._word = word
        word = self._word
        if word == b"DELETE":
            data, pos = buf.data, buf.pos
            if len(data) - pos < 8:
                return None
            self._word = None
            (number,) = _U64.unpack_from(data, pos)
            buf.pos = pos + 8
            return Command("delete_number", (number,), BY_NUMBER, number,
                           partial(render_deleted, id=number))
        raw = self._name
        if raw is None:
            try:
                raw = self._string(buf, self.max_name)
            except _TooLong:
                raise _Fatal(f"Malformed {word.decode()} command: queue name longer than "
                             f"{self.max_name} bytes") from None
            if raw is None:
                return None
            self._name = raw
        if word == b"ADD":
            return self._add(buf, raw)
        return self._reserve(buf, raw)

    def _done(self) -> None:
        """The request is consumed: ready for the next one."""
        self._word = self._name = None

    def _add(self, buf: InputBuffer, raw: bytes) -> Optional[Command]:
        """ADD's fixed fields and data, after its raw queue name ``raw``."""
        data, pos = buf.data, buf.pos
        left = len(data) - pos
        if left < _ADD_FIXED.size:
            return None
        priority, ttp, size = _ADD_FIXED.unpack_from(data, pos)
        if size > self.max_payload:
            raise _Fatal(f"Malformed ADD command: job data longer than {self.max_payload} bytes")
        if left < _ADD_FIXED.size + size:
            return None
        start = pos + _ADD_FIXED.size
        buf.pos = start + size
        payload = bytes(data[start:start + size])
        self._done()
        if not raw:
            return Command.local(error("Error adding new job to queue "))
        name = valid_queue_name(raw)
        if name is None:
            return Command.local(error(INVALID_NAME))
        return new_job(name, payload, partial(render_added, name=name),
                       priority=ordering.from_goqueue(priority), ttr=ttp * 1000)

    def _reserve(self, buf: InputBuffer, raw: bytes) -> Optional[Command]:
        """RESERVE's timeout, after its raw queue name ``raw``."""
        data, pos = buf.data, buf.pos
        if len(data) - pos < 4:
            return None
        (timeout,) = _U32.unpack_from(data, pos)
        buf.pos = pos + 4
        self._done()
        name = valid_queue_name(raw)
        if name is None:
            return Command.local(error(INVALID_NAME))
        return Command("lease", ([name], timeout * 1000 if timeout else None), BY_NAME, name,
                       render_reserved)
