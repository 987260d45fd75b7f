"""The workq protocol codec (sans-I/O).

Text lines ending in CRLF (a bare LF is tolerated); ``add``, ``schedule``,
``run``, ``complete`` and ``fail`` carry a length-prefixed block after their
line. Error texts and validation order follow the original server's.

One request, one reply. Unlike the original, which lost pipelined input
after a bad payload, a refused block command never lets its block be read
as a command of its own:

* The right number of positional arguments (``-key=value`` flags aside):
  the size is the ``<payload-size>`` (``<result-size>``) argument. Over
  ``max_payload`` it is answered ``Invalid payload size`` (``Invalid result
  size``) and its bytes are skipped; otherwise the block and its CRLF are
  read and the command answered once (``Invalid command flags`` first when
  a ``-key=value`` flag is malformed, as the original checked flags first).
* More positional arguments than that (``-priority 5`` for
  ``-priority=5``, a stray token at the end): the size is still readable at
  its place, so the block is read (or skipped) as above and the request is
  answered once, ``Invalid command args``.
* Fewer (a missing size): the size is not readable. ``Invalid command
  args`` is answered at once and parsing resumes at the next line, which
  may be the block. A client that sent just such a line is never left
  waiting for a block nobody will send.
* A size that is not a decimal number: its error is answered at once and
  parsing resumes at the next line.
* A block whose declared size does not match (no CRLF right after it) is
  skipped through the first CRLF after its start and answered once.

Names are checked by the shared rule (:func:`.base.valid_queue_name`) and
workq's own charset ``[A-Za-z0-9_.-]`` on top (``Invalid Name``). Replies
print names through :func:`.base.name_token`, so a name that came from
another protocol cannot break a reply's lines.

Why one module, though over 600 lines: each protocol's codec is one module
(its requests' parsing, their validation order and its replies' text, as
the original server has them), and workq has the most commands.
"""
from __future__ import annotations

import calendar
import re
import time
from typing import Any, Callable, Dict, Final, List, NamedTuple, Optional, Sequence, Set, Tuple

from ..engine import status as S
from ..engine.requests import RunRequest
from ..engine.status import Reply
from ..engine.views import as_lease
from .base import (ALL, BY_ID, BY_NAME, BY_NAMES, MAX_PAYLOAD, NAME_MEMO, Command, InputBuffer, parse_int,
                   name_token, new_job, renderer)
from .lines import LineCodec

MAX_LINE: Final = 65536
MAX_TTR: Final = 86400000
MAX_TTL: Final = 2 ** 64 - 1
MAX_WAIT: Final = 86400000
MAX_LIMIT: Final = 100

_UUID_RE: Final = rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_UUID: Final = re.compile(rb"\A" + _UUID_RE + rb"\Z")
#: workq's own charset within the shared rule's 255 bytes (the charset is
#: printable ASCII, so the shared rule adds only the length).
_NAME: Final = re.compile(rb"[a-zA-Z0-9_.-]{1,255}")
_NAMES: Final[Dict[bytes, str]] = {}    # names found valid, raw -> decoded
#: A job's cycle as clients send it, matched in one go: single spaces, a
#: valid id and name, plain numbers (at most 20 digits), no flags. Any
#: other line takes the general path, which decodes these the same way.
_CYCLE: Final = re.compile(
    rb"(?:add (" + _UUID_RE + rb") ([a-zA-Z0-9_.-]{1,255}) ([0-9]{1,20}) ([0-9]{1,20}) ([0-9]{1,20})"
    rb"|lease ([a-zA-Z0-9_.-]{1,255}) ([0-9]{1,20})"
    rb"|complete (" + _UUID_RE + rb") ([0-9]{1,20}))\r?\n")
# the last group of each, as ``Match.lastindex``
_ADD: Final = 5
_LEASE: Final = 7
_COMPLETE: Final = 9
_UINT: Final = re.compile(rb"\A\+?[0-9]+\Z")
_INT: Final = re.compile(rb"\A[+-]?[0-9]+\Z")
_TIME: Final = re.compile(rb"\A(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)Z\Z")

class _BlockSpec(NamedTuple):
    """The line of a command with a data block."""
    arg_count: int             # positional arguments (``count`` would hide tuple.count)
    size_at: int               # index of the block size among them
    size_error: str


_BLOCKS: Final[Dict[bytes, _BlockSpec]] = {
    b"add": _BlockSpec(5, 4, "Invalid payload size"),
    b"schedule": _BlockSpec(6, 5, "Invalid payload size"),
    b"run": _BlockSpec(5, 4, "Invalid payload size"),
    b"complete": _BlockSpec(2, 1, "Invalid result size"),
    b"fail": _BlockSpec(2, 1, "Invalid result size"),
}
_JOB_FLAGS: Final = {b"priority", b"max-attempts", b"max-fails"}
_FLAGS: Final = {b"add": _JOB_FLAGS, b"schedule": _JOB_FLAGS, b"run": {b"priority"}}


class Invalid(Exception):
    """A request the codec answers itself with ``-CLIENT-ERROR <message>``."""


# ---------------------------------------------------------------- rendering
OK_REPLY: Final = b"+OK\r\n"
_STATUS_FORMS: Final = {
    S.NOT_FOUND: b"-NOT-FOUND\r\n",
    S.TIMEOUT: b"-TIMEOUT\r\n",
}


def client_error(message: str) -> bytes:
    return b"-CLIENT-ERROR " + message.encode() + b"\r\n"


def _error(reply: Reply) -> bytes:
    status = reply[0]
    if status == S.CLIENT_ERROR or status == S.FORBIDDEN:   # refused by the access rules: the client's fault
        return client_error(reply[1])
    if status == S.SERVER_ERROR:
        return b"-SERVER-ERROR " + str(reply[1]).encode() + b"\r\n"
    return _STATUS_FORMS[status]


def _with_data(id: str, word: object, data: bytes) -> bytes:
    """``+OK 1`` and one ``<id> <word> <size>`` block carrying ``data``."""
    return b"".join((b"+OK 1\r\n", f"{id} {word} {len(data)}\r\n".encode(), data, b"\r\n"))


render_ok: Final = renderer(lambda _: OK_REPLY, _error)
#: A lease view ``[id, name, payload, ...]``: ``<id> <name> <payload-size>``.
def _leased(value: Sequence[Any]) -> bytes:
    view = as_lease(value)
    return _with_data(view.id, name_token(view.name), view.payload)


render_lease: Final = renderer(_leased, _error)
#: ``[id, success, result]`` (result, run): ``<id> <success> <result-size>``.
render_result: Final = renderer(lambda outcome: _with_data(*outcome), _error)


def format_time(us: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(us // 1000000))


# A view is a named tuple here, a msgpack array from a router.
def _job_block(view: Sequence[Any]) -> bytes:
    (id, name, ttr, ttl, payload, max_attempts, attempts, max_fails, fails, priority,
     state, created, sched) = view
    lines = [
        f"name {name_token(name)}", f"ttr {ttr}", f"ttl {ttl}", f"payload-size {len(payload)}",
    ]
    head: bytes = "\r\n".join(lines).encode() + b"\r\npayload " + payload + b"\r\n"
    tail = [
        f"max-attempts {max_attempts}", f"attempts {attempts}", f"max-fails {max_fails}",
        f"fails {fails}", f"priority {priority}", f"state {state}", f"created {format_time(created)}",
    ]
    if sched is not None:
        tail.append(f"time {format_time(sched)}")
    count = len(lines) + 1 + len(tail)
    return f"{id} {count}\r\n".encode() + head + "\r\n".join(tail).encode() + b"\r\n"


def _queue_block(view: Sequence[Any]) -> bytes:
    name, ready, scheduled = view
    return f"{name_token(name)} 2\r\nready-len {ready}\r\nscheduled-len {scheduled}\r\n".encode()


def _one(block: Callable[[Sequence[Any]], bytes]) -> Callable[[Reply], bytes]:
    """A renderer for ``+OK 1`` and one block (inspect job, inspect queue)."""
    return renderer(lambda view: b"+OK 1\r\n" + block(view), _error)


def _many(block: Callable[[Sequence[Any]], bytes]) -> Callable[[Reply], bytes]:
    """A renderer for ``+OK <n>`` and n blocks (inspect jobs, inspect queues)."""
    def blocks(views: Sequence[Sequence[Any]]) -> bytes:
        return f"+OK {len(views)}\r\n".encode() + b"".join(block(v) for v in views)
    return renderer(blocks, _error)


render_job = _one(_job_block)
render_jobs = _many(_job_block)
render_queue = _one(_queue_block)
render_queues = _many(_queue_block)


def _server(info: Dict[str, Any]) -> bytes:
    """The merged keys: active-clients, evicted-jobs, started (µs)."""
    keys = [("active-clients", info["active-clients"]), ("evicted-jobs", info["evicted-jobs"]),
            ("started", format_time(info["started"]))]
    body = "".join(f"{k} {v}\r\n" for k, v in keys)
    return f"+OK 1\r\nserver {len(keys)}\r\n{body}".encode()


render_server: Final = renderer(_server, _error)


# ------------------------------------------------------------------ parsing
def _uint(token: bytes, high: int, message: str, low: int = 0) -> int:
    if token.isdigit():  # the common case, without the regex
        value = parse_int(token)
    elif _UINT.match(token):
        value = parse_int(token)
    else:
        raise Invalid(message)
    if not low <= value <= high:
        raise Invalid(message)
    return value


def _id(token: bytes) -> str:
    if not _UUID.match(token):
        raise Invalid("Invalid ID")
    return token.decode().lower()


def _name(token: bytes) -> str:
    """The shared queue-name rule, and workq's own charset on top."""
    name = _NAMES.get(token)
    if name is None:
        if not _NAME.fullmatch(token):
            raise Invalid("Invalid Name")
        name = token.decode("ascii")
        if len(_NAMES) >= NAME_MEMO:
            _NAMES.clear()
        _NAMES[token] = name
    return name


def _time(token: bytes) -> int:
    m = _TIME.match(token)
    if not m:
        raise Invalid("Invalid Time")
    year, month, day, hour, minute, second = (int(g) for g in m.groups())
    try:
        stamp = calendar.timegm((year, month, day, hour, minute, second))
        time.strptime(token.decode(), "%Y-%m-%dT%H:%M:%SZ")  # rejects 02-30, 25:00 ...
    except (ValueError, OverflowError):
        raise Invalid("Invalid Time") from None
    return stamp * 1000000


def _split(line: bytes) -> Tuple[List[bytes], Optional[Dict[bytes, bytes]]]:
    """Positional tokens and ``-key=value`` flags of a command line; flags are
    ``None`` when malformed (reported once the command's block is consumed)."""
    if b" -" not in line:  # no flags: the common case, split at C speed
        args = line.split(b" ")
        if b"" in args:
            args = [token for token in args if token]
        return args, {}
    args = []
    flags: Dict[bytes, bytes] = {}
    bad_flags = False
    for token in line.split(b" "):
        if not token:
            continue
        if token[:1] == b"-" and b"=" in token and args:
            key, _, value = token[1:].partition(b"=")
            if not key or not value or b"=" in value or key in flags:
                bad_flags = True
            flags[key] = value
        else:
            args.append(token)
    return args, (None if bad_flags else flags)


def _job_flags(flags: Dict[bytes, bytes], allowed: Set[bytes]) -> Tuple[int, int, int]:
    if not flags:
        return 0, 0, 0
    if len(flags) > len(allowed):
        raise Invalid("Invalid command args")
    if not set(flags) <= allowed:
        raise Invalid("Invalid command flags")
    max_attempts = max_fails = priority = 0
    if b"max-attempts" in flags:
        max_attempts = _uint(flags[b"max-attempts"], 255, "Invalid Max Attempts")
    if b"max-fails" in flags:
        max_fails = _uint(flags[b"max-fails"], 255, "Invalid Max Fails")
    if b"priority" in flags:
        token = flags[b"priority"]
        if not _INT.match(token) or not -2 ** 31 <= parse_int(token) < 2 ** 31:
            raise Invalid("Invalid Priority")
        priority = parse_int(token)
    return priority, max_attempts, max_fails


def _offset_limit(off: bytes, lim: bytes) -> Tuple[int, int]:
    offset = _uint(off, 2 ** 32 - 1, "Invalid cursor offset")
    limit = _uint(lim, MAX_LIMIT, "Invalid limit", low=1)
    return offset, limit


def _refuse(message: str) -> Command:
    """The codec's own ``-CLIENT-ERROR`` answer."""
    return Command.local(client_error(message))


class _Pending(NamedTuple):
    """A block command whose line is read and whose block is still to come."""
    name: bytes
    args: List[bytes]
    flags: Optional[Dict[bytes, bytes]]
    size: int
    refusal: Optional[str]     # the answer once the block is read, when the line was already wrong


def _size(token: Optional[bytes]) -> Optional[int]:
    """A block size token as a number, or ``None`` when it is unreadable."""
    if token is None or not _UINT.match(token):
        return None
    return parse_int(token)


class WorkqCodec(LineCodec):
    """Decodes one connection's workq byte stream into :class:`Command` objects."""

    @staticmethod
    def refusal(message: str) -> bytes:
        return render_ok([S.SERVER_ERROR, message])

    def __init__(self, max_payload: int = MAX_PAYLOAD, max_line: int = MAX_LINE) -> None:
        super().__init__(max_line)
        self.max_payload = max_payload
        self._discard = 0                        # bytes of an oversized block still to drop
        self._pending: Optional[_Pending] = None

    def decode_next(self, buf: InputBuffer) -> Optional[Command]:
        if self._discard or self._pending is not None or self._resync:
            return self._resume(buf)
        data, pos = buf.data, buf.pos
        m = _CYCLE.match(data, pos)
        if m is not None:
            command = self._cycle(buf, m)
            if command is not None:
                return command
        # The common case inline: a whole line of at most max_line bytes and,
        # for a block command with the right argument count, its whole block.
        # Anything else takes the general path from the line's start.
        data, pos = buf.data, buf.pos
        end = data.find(b"\n", pos)
        if end < 0:
            if len(data) - pos > self.max_line:
                return self._resume(buf)
            buf.mark = pos
            return None
        if end - pos > self.max_line:
            return self._resume(buf)
        start = end + 1
        if end > pos and data[end - 1] == 13:  # CR before the LF
            end -= 1
        line = bytes(data[pos:end])
        args, flags = _split(line)
        if not args:
            buf.mark, buf.pos = pos, start
            return _refuse("Unknown command")
        name = args[0]
        spec = _BLOCKS.get(name)
        if spec is None:
            buf.mark, buf.pos = pos, start
            return self._command(name, args[1:], flags, None)
        if flags is not None and len(args) == spec.arg_count + 1:
            token = args[spec.size_at + 1]
            if token.isdigit():
                size = parse_int(token)
                stop = start + size
                if size <= self.max_payload and data[stop:stop + 2] == b"\r\n":
                    buf.mark, buf.pos = pos, stop + 2
                    return self._command(name, args[1:], flags, bytes(data[start:stop]))
        return self._resume(buf)

    def _cycle(self, buf: InputBuffer, m: "re.Match[bytes]") -> Optional[Command]:
        """A request :data:`_CYCLE` matched, checked in the general path's
        order; ``None`` while its block is not all there (or is too big)."""
        pos, start = buf.pos, m.end()
        if start - 1 - pos > self.max_line:
            return None    # a line limit below what the pattern allows
        kind = m.lastindex
        assert kind is not None   # the pattern matched: one alternative's groups did
        if kind == _LEASE:
            buf.mark, buf.pos = pos, start
            timeout = int(m.group(7))
            if timeout > MAX_WAIT:
                return _refuse("Invalid wait timeout")
            names = [_name(m.group(6))]
            return Command("lease", (names, timeout), BY_NAMES, names, render_lease)
        size = int(m.group(kind))
        stop = start + size
        data = buf.data
        if size > self.max_payload or data[stop:stop + 2] != b"\r\n":
            return None
        buf.mark, buf.pos = pos, stop + 2
        block = bytes(data[start:stop])
        if kind == _COMPLETE:
            id = m.group(8).decode().lower()
            return Command("complete", (id, block), BY_ID, id, render_ok)
        raw_id, raw_name, raw_ttr, raw_ttl, _ = m.group(1, 2, 3, 4, 5)
        ttr, ttl = int(raw_ttr), int(raw_ttl)
        if not 1 <= ttr <= MAX_TTR:
            return _refuse("Invalid TTR")
        if not 1 <= ttl <= MAX_TTL:
            return _refuse("Invalid TTL")
        return new_job(_name(raw_name), block, render_ok, id=raw_id.decode().lower(),
                       priority=0, ttr=ttr, ttl=ttl, max_attempts=0, max_fails=0)

    def _resume(self, buf: InputBuffer) -> Optional[Command]:
        """The general path: resynchronising, dropping an oversized block,
        waiting for a block, or a block command's line read afresh."""
        if self._discard and not self._discarded(buf):
            return None
        if self._pending is None:
            command = super().decode_next(buf)   # a line: a command, or a block's head
            if not self._block_ahead():
                return command
        return self._block(buf)

    def _block_ahead(self) -> bool:
        """Whether a block command's line was read and its block is to come.
        (A method, not ``self._pending is None`` again: the check above
        narrows the attribute, and compiled code would trust that narrowing
        across the call that sets it.)"""
        return self._pending is not None

    def line_too_long(self) -> Command:
        return _refuse("Invalid command args")

    def decode_line(self, line: bytes) -> Optional[Command]:
        """A command, or ``None`` once a block command's line is read (its block follows)."""
        args, flags = _split(line)
        if not args:
            return _refuse("Unknown command")
        name, args = args[0], args[1:]
        spec = _BLOCKS.get(name)
        if spec is None:
            return self._command(name, args, flags, None)
        return self._block_head(name, args, flags, spec)

    def _discarded(self, buf: InputBuffer) -> bool:
        """Drop what is left of an oversized block; True once it is all gone."""
        self._discard -= buf.skip(self._discard)
        buf.mark = buf.pos   # nothing dropped is kept for a move
        return not self._discard

    def _block_head(self, name: bytes, args: List[bytes],
                    flags: Optional[Dict[bytes, bytes]], spec: _BlockSpec) -> Optional[Command]:
        """Find the size of the block that follows (see the module docstring)."""
        count, at, size_error = spec
        bad_flags = "Invalid command flags" if flags is None else None  # reported first
        if len(args) < count:   # no readable size: the next line is a command of its own
            return _refuse(bad_flags or "Invalid command args")
        # Too many arguments still leave the size readable at its place: the
        # block is read (or dropped) and the request answered once.
        refusal = bad_flags or ("Invalid command args" if len(args) > count else None)
        size = _size(args[at])
        if size is None:
            return _refuse(refusal or size_error)
        if size > self.max_payload:
            self._discard = size + 2  # keep the stream in step: drop the block
            return _refuse(refusal or size_error)
        self._pending = _Pending(name, args, flags, size, refusal)
        return None

    def _block(self, buf: InputBuffer) -> Optional[Command]:
        """The pending command once its block and CRLF have arrived."""
        pending = self._pending
        assert pending is not None   # called only while a block is awaited
        size = pending.size
        if len(buf) < size + 2:
            return None
        if buf.peek(size, size + 2) != b"\r\n":
            # Resynchronise at the first CRLF after the block's start.
            end = buf.find(b"\r\n")
            if end < 0:
                return None
            buf.skip(end + 2)
            self._pending = None
            return _refuse(pending.refusal or _BLOCKS[pending.name].size_error)
        self._pending = None
        block = buf.take(size)
        buf.skip(2)
        if pending.refusal is not None:
            return _refuse(pending.refusal)
        return self._command(pending.name, pending.args, pending.flags, block)

    @staticmethod
    def _command(name: bytes, args: List[bytes], flags: Optional[Dict[bytes, bytes]],
                 block: Optional[bytes]) -> Command:
        try:
            if flags is None:
                raise Invalid("Invalid command flags")
            build = _BUILDERS.get(name)
            if build is None:
                raise Invalid("Unknown command")
            if name not in _FLAGS and flags:
                raise Invalid("Invalid command args")
            return build(args, flags, block)
        except Invalid as err:
            return _refuse(str(err))


# ----------------------------------------------------------------- builders
#: ``build(args, flags, block)``: the block is there for the commands of
#: ``_BLOCKS`` and only for them.
Builder = Callable[[List[bytes], Dict[bytes, bytes], Optional[bytes]], Command]


def _build_add(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    assert block is not None
    id = _id(args[0])
    name = _name(args[1])
    ttr = _uint(args[2], MAX_TTR, "Invalid TTR", low=1)
    ttl = _uint(args[3], MAX_TTL, "Invalid TTL", low=1)
    priority, max_attempts, max_fails = _job_flags(flags, _JOB_FLAGS)
    return new_job(name, block, render_ok, id=id, priority=priority, ttr=ttr, ttl=ttl,
                   max_attempts=max_attempts, max_fails=max_fails)


def _build_schedule(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    assert block is not None
    id = _id(args[0])
    name = _name(args[1])
    ttr = _uint(args[2], MAX_TTR, "Invalid TTR", low=1)
    ttl = _uint(args[3], MAX_TTL, "Invalid TTL", low=1)
    sched = _time(args[4])
    priority, max_attempts, max_fails = _job_flags(flags, _JOB_FLAGS)
    return new_job(name, block, render_ok, id=id, priority=priority, ttr=ttr, ttl=ttl,
                   max_attempts=max_attempts, max_fails=max_fails, sched=sched)


def _build_run(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    assert block is not None
    id = _id(args[0])
    name = _name(args[1])
    ttr = _uint(args[2], MAX_TTR, "Invalid TTR", low=1)
    timeout = _uint(args[3], MAX_WAIT, "Invalid wait timeout")
    priority, _, _ = _job_flags(flags, {b"priority"})
    return Command("run", RunRequest(id, name, block, priority, ttr, timeout), BY_NAME, name,
                   render_result, new_id=id)


def _build_result(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    if len(args) != 2:
        raise Invalid("Invalid command args")
    id = _id(args[0])
    timeout = _uint(args[1], MAX_WAIT, "Invalid wait timeout")
    return Command("result", (id, timeout), BY_ID, id, render_result)


def _build_lease(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    if len(args) < 2:
        raise Invalid("Invalid command args")
    timeout = _uint(args[-1], MAX_WAIT, "Invalid wait timeout")
    if len(args) == 2:
        names = [_name(args[0])]
    else:
        names = list(dict.fromkeys(_name(a) for a in args[:-1]))
    return Command("lease", (names, timeout), BY_NAMES, names, render_lease)


def _build_finish(op: str) -> Builder:
    def build(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
        id = _id(args[0])
        return Command(op, (id, block), BY_ID, id, render_ok)
    return build


def _build_delete(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    if len(args) != 1:
        raise Invalid("Invalid command args")
    id = _id(args[0])
    return Command("delete", (id,), BY_ID, id, render_ok)


def _build_inspect(args: List[bytes], flags: Dict[bytes, bytes], block: Optional[bytes]) -> Command:
    if not args:
        raise Invalid("Invalid command args")
    sub, rest = args[0], args[1:]
    if sub == b"server":
        if rest:
            raise Invalid("Invalid command args")
        return Command("inspect_server", (), ALL, None, render_server)
    if sub == b"queues":
        if len(rest) != 2:
            raise Invalid("Invalid command args")
        offset, limit = _offset_limit(rest[0], rest[1])
        return Command("inspect_queues", (offset, limit), ALL, None, render_queues)
    if sub == b"queue":
        if len(rest) != 1:
            raise Invalid("Invalid command args")
        name = _name(rest[0])
        return Command("inspect_queue", (name,), BY_NAME, name, render_queue)
    if sub in (b"jobs", b"scheduled-jobs"):
        if len(rest) != 3:
            raise Invalid("Invalid command args")
        name = _name(rest[0])
        offset, limit = _offset_limit(rest[1], rest[2])
        op = "inspect_jobs" if sub == b"jobs" else "inspect_scheduled"
        return Command(op, (name, offset, limit), BY_NAME, name, render_jobs)
    if sub == b"job":
        if len(rest) != 1:
            raise Invalid("Invalid command args")
        id = _id(rest[0])
        return Command("inspect_job", (id,), BY_ID, id, render_job)
    raise Invalid("Unknown command")


_BUILDERS: Final[Dict[bytes, Builder]] = {
    b"add": _build_add,
    b"schedule": _build_schedule,
    b"run": _build_run,
    b"result": _build_result,
    b"lease": _build_lease,
    b"complete": _build_finish("complete"),
    b"fail": _build_finish("fail"),
    b"delete": _build_delete,
    b"inspect": _build_inspect,
}
