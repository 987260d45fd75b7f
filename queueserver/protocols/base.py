"""What every protocol codec shares: the command object the router routes,
and the input buffer line protocols read from.

A codec turns bytes into :class:`Command` objects and renders each reply
with the command's own ``render``. Codecs hold no sockets and read no clock.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Final, List, Optional, Sequence, Union

from ..engine.job import UNLIMITED_ATTEMPTS
from ..engine.requests import AddRequest
from ..engine.status import OK, Reply

# How the router finds the shard(s) for a command.
LOCAL: Final = 0      # answered by the codec itself (``reply`` is ready)
BY_NAME: Final = 1    # ``key`` is a queue name
BY_NAMES: Final = 2   # ``key`` is a list of queue names (a lease on several queues)
BY_ID: Final = 3      # ``key`` is a job UUID
BY_NUMBER: Final = 4  # ``key`` is a job's 64-bit number
ALL: Final = 5        # every shard answers; the router merges the answers

Render = Callable[[Reply], bytes]
#: What a codec remembers between commands (:meth:`StreamCodec.state_at`):
#: plain data, handed to another process as msgpack.
CodecState = Dict[str, Any]


def renderer(on_ok: Callable[[Any], bytes], on_error: Callable[..., bytes]) -> Callable[..., bytes]:
    """A command's ``render``: an OK reply's value goes to ``on_ok``, any other
    reply to ``on_error``, the protocol's error form for it.

    Keyword arguments the renderer is called with (what the command knew,
    e.g. its queue name, bound with :func:`functools.partial`) go to
    ``on_error`` along with the reply.
    """
    def render(reply: Reply, **context: Any) -> bytes:
        if reply[0] == OK:
            return on_ok(reply[1])
        return on_error(reply, **context)
    return render


#: ``Command.new_id`` of a command whose job id the server makes (a UUIDv4):
#: the router fills it in as the first argument.
SERVER_ID = ""

#: The one payload limit of every protocol (``max_payload``'s default: 1 MiB).
MAX_PAYLOAD: Final = 1048576

#: Bytes of a queue name, where a protocol's own rule does not say otherwise.
MAX_QUEUE_NAME: Final = 255
#: The queue-name rule in words, for error messages.
QUEUE_NAME_RULE = "1 to 255 bytes of UTF-8, no whitespace or control characters"

_PLAIN_NAME: Final = re.compile(rb"[!-~]{1,255}")   # printable ASCII without the space
#: Whitespace (``str.isspace``: ``\s`` of a str pattern) or a control
#: character (category Cc): either can break a reply's framing.
_UNSAFE: Final = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")

#: Names already found valid, raw -> decoded: most requests name a queue
#: named before, and a dict lookup costs a tenth of the check.
_VALID_NAMES: Final[Dict[bytes, str]] = {}
NAME_MEMO: Final = 4096    # entries kept; the memo starts over when full


def valid_queue_name(raw: bytes) -> Optional[str]:
    """The decoded queue name, or ``None`` when ``raw`` breaks the shared rule.

    One rule for every protocol that sets none of its own: 1 to 255 bytes of
    UTF-8 with no whitespace (any Unicode whitespace) and no control
    character, so that no reply carrying the name can break its framing.
    Protocols with a stricter rule of their own (workq, TaskFlux) check it on top.
    """
    name = _VALID_NAMES.get(raw)
    if name is not None:
        return name
    if _PLAIN_NAME.fullmatch(raw):
        name = raw.decode("ascii")
    else:
        if not 0 < len(raw) <= MAX_QUEUE_NAME:
            return None
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if _UNSAFE.search(name):
            return None
    if len(_VALID_NAMES) >= NAME_MEMO:
        _VALID_NAMES.clear()
    _VALID_NAMES[raw] = name
    return name


def _escape(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 256 else f"\\u{code:04x}"


def name_token(name: str) -> str:
    """``name`` as one token of a space-separated reply line.

    Input checks keep bad names out, but a name may come from another
    protocol or an older store: whitespace and control characters are
    written as ``\\xNN`` (``\\uNNNN`` beyond Latin-1) and the empty name as
    ``""``, so the reply keeps its shape.
    """
    if name.isascii() and name.isprintable() and " " not in name and name:
        return name
    if not name:
        return '""'
    return _UNSAFE.sub(_escape, name)


class Command:
    """One decoded request: an engine operation, where to send it, how to answer."""

    __slots__ = ("op", "args", "route", "key", "render", "reply", "close", "new_id", "start")

    def __init__(self, op: Optional[str], args: Sequence[Any] = (), route: int = LOCAL,
                 key: Any = None, render: Optional[Render] = None, reply: bytes = b"",
                 close: bool = False, new_id: Optional[str] = None) -> None:
        self.op = op
        self.args = args            # the engine request's arguments (each op its own)
        self.route = route
        self.key = key              # what ``route`` says: a name, names, an id, a number
        self.render = render
        self.reply = reply          # the answer of a LOCAL command
        self.close = close          # close the connection after answering
        self.new_id = new_id        # the UUID this command creates, or SERVER_ID
        self.start = 0              # stream offset of its first byte (set by StreamCodec)

    @classmethod
    def local(cls, reply: bytes, close: bool = False) -> "Command":
        return cls(None, reply=reply, close=close)

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"<Command {self.op} {self.args!r} route={self.route} key={self.key!r}>"


#: Beyond every limit any protocol has (a 64-bit value has 20 digits).
HUGE: Final = 10 ** 30


def parse_int(token: bytes) -> int:
    """A checked decimal token (``[+-]?[0-9]+``) as an int. One with more
    significant digits than any limit allows is :data:`HUGE` (or -HUGE):
    Python refuses to parse over 4300 digits, and a client may send more."""
    if len(token) <= 24:
        return int(token)
    sign = -1 if token[:1] == b"-" else 1
    digits = token.lstrip(b"+-").lstrip(b"0") or b"0"
    return sign * (int(digits) if len(digits) <= 24 else HUGE)


def new_job(name: str, payload: bytes, render: Render, *, id: Optional[str] = None,
            priority: int = 0, ttr: int = 0, ttl: int = 0, max_attempts: int = UNLIMITED_ATTEMPTS,
            max_fails: int = 0, sched: Optional[int] = None, unique: bool = False) -> Command:
    """The ``add`` command every protocol uses to create a job.

    ``id`` None lets the server make a UUIDv4. Durations are milliseconds
    (``ttr`` 0: a lease never runs out; ``ttl`` 0: the job never expires);
    ``sched`` is microseconds since the epoch. Attempts are unlimited unless
    a protocol says otherwise (workq caps them). The engine answers
    ``[OK, [id, number]]``, or ``[OK, None]`` when ``unique`` dropped a
    payload the queue already holds.
    """
    args = tuple.__new__(AddRequest, (id, name, payload, priority, ttr, ttl, max_attempts, max_fails, sched,
                                      unique))
    return Command("add", args, BY_NAME, name, render, new_id=SERVER_ID if id is None else id)


class StreamCodec(ABC):
    """The read loop every codec shares: buffer what arrives, decode commands
    until one is incomplete. A command that closes the connection ends
    decoding for good; nothing pipelined after it runs."""

    #: Whether a job leased over this protocol goes back to ready when the
    #: connection that leased it closes (goqueue, as beanstalkd does).
    leases_end_with_connection = False

    @staticmethod
    @abstractmethod
    def refusal(message: str) -> bytes:
        """The error a connection the server will not serve gets before it is
        closed (too many clients, no descriptor left), in the protocol's form."""

    def __init__(self) -> None:
        self.buffer = InputBuffer()
        self._closed = False

    def receive(self, data: bytes) -> List[Command]:
        """Feed received bytes; returns every command now complete, in order."""
        if self._closed:
            return []
        buf = self.buffer
        buf.feed(data)
        commands: List[Command] = []
        while True:
            command = self.decode_next(buf)
            if command is None:
                return commands
            command.start = buf.base + buf.mark
            commands.append(command)
            if command.close:
                self._closed = True
                buf.skip(len(buf))
                return commands
            if buf.pos == len(buf.data):
                # All read (one request per read, the common case): the next
                # byte to come starts a request, or goes on dropping what a
                # refused one left; no need to ask the codec.
                buf.mark = buf.pos
                return commands

    @abstractmethod
    def decode_next(self, buf: "InputBuffer") -> Optional[Command]:
        """The next whole command at the front of ``buf`` (consumed), or ``None``.

        Where a command's own bytes begin (after any bytes skipped to
        resynchronise), the codec sets ``buf.mark = buf.pos``: a connection
        can then be moved to another process from that command on
        (:meth:`unread`)."""

    def unread(self, command: Command) -> bytes:
        """Every byte received from ``command``'s first one on: what another
        process's codec decodes, from :meth:`state_at`, to go on exactly here."""
        buf = self.buffer
        return bytes(buf.data[command.start - buf.base:])

    def state_at(self, command: Command) -> CodecState:
        """What this codec remembers between commands, as it was before
        ``command`` (plain data, for :meth:`restore`); most remember nothing."""
        return {}

    def restore(self, state: CodecState) -> None:
        """Take up the state :meth:`state_at` gave."""


class InputBuffer:
    """Bytes received but not yet decoded, consumed from the front.

    ``data`` is ``bytes`` while it holds one received chunk and nothing
    older, and becomes a ``bytearray`` once a chunk has to be appended."""

    __slots__ = ("data", "pos", "mark", "base")

    def __init__(self) -> None:
        self.data: Union[bytes, bytearray] = bytearray()
        self.pos = 0
        self.mark = 0    # where the command being decoded began: kept until it is whole
        self.base = 0    # stream offset of ``data[0]``

    def feed(self, chunk: bytes) -> None:
        data = self.data
        cut = min(self.pos, self.mark)
        if cut == len(data) and type(chunk) is bytes:
            # Everything before is decoded (one request per read, the common
            # case): the chunk itself becomes the buffer, uncopied.
            self.data = chunk
            self.pos = self.mark = 0
            self.base += cut
            return
        if type(data) is not bytearray:
            data = self.data = bytearray(data)
        if cut and cut >= len(data) // 2:
            del data[:cut]
            self.pos -= cut
            self.mark -= cut
            self.base += cut
        data += chunk

    def __len__(self) -> int:
        return len(self.data) - self.pos

    def find(self, sep: bytes, start: int = 0) -> int:
        """Offset of ``sep`` from the read position, or -1."""
        i = self.data.find(sep, self.pos + start)
        return -1 if i < 0 else i - self.pos

    def take(self, n: int) -> bytes:
        chunk = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return chunk

    def peek(self, start: int, end: int) -> bytes:
        return bytes(self.data[self.pos + start:self.pos + end])

    def skip(self, n: int) -> int:
        """Drop up to ``n`` bytes; returns how many were dropped."""
        n = min(n, len(self))
        self.pos += n
        return n

    def drop_line(self) -> bool:
        """Discard through the next ``\\n``; False if it has not arrived yet."""
        end = self.find(b"\n")
        if end < 0:
            self.pos = len(self.data)
            return False
        self.pos += end + 1
        return True
