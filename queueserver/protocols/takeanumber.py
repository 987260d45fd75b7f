"""The takeanumber protocol codec (sans-I/O).

A RESP-like text protocol: one command per line (``\\r\\n`` or a bare
``\\n``), replies ``+<string>``, ``:<integer>`` or ``-ERR <message>``, each
ending in ``\\r\\n``. Commands are case-sensitive. Queues are FIFO; ids are
server-made UUIDv4 strings.

Where the protocol's description says nothing, the codec's choices
(docs/protocols.md records them):

* Trailing spaces and tabs of a line are stripped before it is parsed (the
  original trimmed its lines), so a body of only spaces or tabs is an empty
  body: ``ADD q 1 \\r\\n`` and ``ADD q 1\\r\\n`` both answer
  ``-ERR No body provided.`` (the protocol's documented answer).
* Tokens are separated by spaces; leading and repeated spaces are ignored,
  except after ``ADD``: its name, retries and body are separated by exactly
  one space each and the body is the rest of the line, byte for byte but
  for the trailing spaces and tabs. Only the space separates: ``LEN\\tq`` is
  no command.
* ``LEN``/``RESERVE`` need exactly one argument and ``RETRY``/``DONE``
  exactly two, else ``-ERR Missing <CMD> parameters.`` (the original's
  texts, also for too many arguments). ``CLOSE`` ignores arguments.
* ``retries`` is a signed decimal integer; a negative count means 0, and
  counts above 2**31-1 are capped there; anything else (or a value beyond
  64 bits) is ``-ERR Invalid number of retries.``
* A queue name follows the shared rule (:func:`.base.valid_queue_name`:
  1 to 255 bytes of UTF-8, no whitespace or control characters); any other
  name answers ``-ERR Invalid queue name.`` on every command.
* An ``ADD`` body longer than ``max_payload`` (1 MiB) answers
  ``-ERR Body too large.``; a line longer than ``max_payload`` + 1 KiB
  answers ``-ERR Line too long.`` and is skipped up to its newline.
* RESERVE on an empty queue answers ``:-1`` (as the protocol is documented); with
  ``empty_reserve_error`` it answers the original server's
  ``-ERR No items available to reserve.``, which the original Python client
  needs (it fails on ``:-1``).
* Nothing pipelined after ``CLOSE`` is executed.
"""
from __future__ import annotations

import re
from functools import partial
from typing import Any, Final, Optional, Sequence

from ..engine import status as S
from ..engine.status import Reply
from ..engine.views import as_lease
from .base import BY_NAME, MAX_PAYLOAD, Command, new_job, parse_int, renderer, valid_queue_name
from .lines import LineCodec, utf8

LINE_SLACK: Final = 1024                 # a line's bytes besides an ADD body
MAX_LINE: Final = MAX_PAYLOAD + LINE_SLACK
MAX_RETRIES: Final = 2 ** 31 - 1

_INT: Final = re.compile(rb"\A[+-]?[0-9]+\Z")

OK_REPLY: Final = b"+OK\r\n"
EMPTY_REPLY: Final = b":-1\r\n"
NO_SUCH_ID: Final = b"-ERR No such Id.\r\n"


def error(message: str) -> bytes:
    return b"-ERR " + message.encode() + b"\r\n"


UNRECOGNIZED: Final = error("Unrecognized command.")
NO_BODY: Final = error("No body provided.")
BAD_RETRIES: Final = error("Invalid number of retries.")
BAD_NAME: Final = error("Invalid queue name.")
LINE_TOO_LONG: Final = error("Line too long.")
BODY_TOO_LARGE: Final = error("Body too large.")
NO_ITEMS: Final = error("No items available to reserve.")   # the original's empty RESERVE


def _missing(command: str) -> Command:
    return Command.local(error(f"Missing {command} parameters."))


# ---------------------------------------------------------------- rendering
def _error(reply: Reply) -> bytes:
    status = reply[0]
    if status == S.NOT_FOUND:
        return NO_SUCH_ID
    if status == S.TIMEOUT:
        return EMPTY_REPLY
    return error(str(reply[1]) or "Internal error")


def _reserve_error(reply: Reply, empty: bytes = EMPTY_REPLY) -> bytes:
    return empty if reply[0] == S.TIMEOUT else _error(reply)


#: ``size`` -> ``:<n>``.
render_len: Final = renderer(lambda size: b":%d\r\n" % size, _error)
#: ``add`` -> ``+<id>``.
render_add: Final = renderer(lambda added: b"+" + added[0].encode() + b"\r\n", _error)
#: ``lease`` -> ``+<id> <body>``, or ``empty`` (``:-1``; a keyword argument)
#: when the queue is empty.
def _reserved(value: Sequence[Any]) -> bytes:
    view = as_lease(value)
    return b"".join((b"+", view.id.encode(), b" ", view.payload, b"\r\n"))


render_reserve: Final = renderer(_reserved, _reserve_error)
#: ``retry``/``done`` -> ``+OK``; an unknown id -> ``-ERR No such Id.``
render_ok: Final = renderer(lambda _: OK_REPLY, _error)


# ------------------------------------------------------------------ codec
class TakeANumberCodec(LineCodec):
    """Decodes one connection's takeanumber byte stream into :class:`Command` objects.

    ``reservation_timeout`` (ms) returns a reserved job to its queue when it
    is neither retried nor done in time; 0 (the default) never does.
    ``empty_reserve_error`` answers RESERVE on an empty queue as the
    original server did, for clients written against it. ``max_line``
    defaults to ``max_payload`` plus the rest of an ADD line.
    """

    @staticmethod
    def refusal(message: str) -> bytes:
        return error(message)

    def __init__(self, reservation_timeout: int = 0, max_line: Optional[int] = None, *,
                 max_payload: int = MAX_PAYLOAD, empty_reserve_error: bool = False) -> None:
        super().__init__(max_payload + LINE_SLACK if max_line is None else max_line)
        self.reservation_timeout = max(0, int(reservation_timeout or 0))
        self.max_payload = max_payload
        self._render_reserve = (partial(render_reserve, empty=NO_ITEMS) if empty_reserve_error
                                else render_reserve)

    def line_too_long(self) -> Command:
        return Command.local(LINE_TOO_LONG)

    def decode_line(self, line: bytes) -> Command:
        line = line.rstrip(b" \t").lstrip(b" ")
        head, _, rest = line.partition(b" ")
        if head == b"ADD":
            return self._add(rest)
        args = line.split(b" ")
        if b"" in args:   # repeated spaces
            args = [token for token in args if token]
        command = args[0] if args else b""
        if command == b"LEN" or command == b"RESERVE":
            if len(args) != 2:
                return _missing(command.decode())
            name = valid_queue_name(args[1])
            if name is None:
                return Command.local(BAD_NAME)
            if command == b"LEN":
                return Command("size", (name,), BY_NAME, name, render_len)
            return Command("lease", ([name], 0), BY_NAME, name, self._render_reserve)
        if command == b"RETRY" or command == b"DONE":
            if len(args) != 3:
                return _missing(command.decode())
            name, id = valid_queue_name(args[1]), utf8(args[2])
            if name is None:
                return Command.local(BAD_NAME)
            if id is None:
                return Command.local(NO_SUCH_ID)
            op = "retry" if command == b"RETRY" else "done"
            return Command(op, (id, name), BY_NAME, name, render_ok)
        if command == b"CLOSE":
            return Command.local(b"", close=True)
        return Command.local(UNRECOGNIZED)

    def _add(self, rest: bytes) -> Command:
        parts = rest.split(b" ", 2)
        if len(parts) < 2 or not parts[0]:
            return _missing("ADD")
        raw_name, raw_retries, body = parts if len(parts) == 3 else (*parts, b"")
        if not _INT.match(raw_retries):
            return Command.local(BAD_RETRIES)
        retries = parse_int(raw_retries)
        if not -2 ** 63 <= retries < 2 ** 64:
            return Command.local(BAD_RETRIES)
        retries = min(max(retries, 0), MAX_RETRIES)
        if not body:
            return Command.local(NO_BODY)
        name = valid_queue_name(raw_name)
        if name is None:
            return Command.local(BAD_NAME)
        if len(body) > self.max_payload:
            return Command.local(BODY_TOO_LARGE)
        return new_job(name, body, render_add, ttr=self.reservation_timeout, max_fails=retries)
