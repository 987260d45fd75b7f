"""The queued protocol codec (sans-I/O).

``COMMAND DATA`` lines ending in ``\\n`` (a ``\\r`` before it is tolerated);
replies ``OK``, ``ITEM <b64>``, ``TRUE``, ``FALSE``, ``SIZE <n>`` or
``ERROR <b64(message)>``, each ending in ``\\n``. Base64 is the standard
alphabet with padding. A connection starts on queue ``default``; ``USE``
switches it, and the switch takes effect for every command decoded after it,
so pipelined commands land on the queue that was current when they were sent.

Parsing follows the original server: the command is the text before the
first space (surrounding whitespace trimmed), the data everything after it.
Where the protocol's description says nothing, the codec's choices
(docs/protocols.md records them):

* ``ENQUE `` with an empty argument enqueues the empty item (the empty
  string is valid base64); ``ENQUE`` with no argument at all is
  ``bad line ''``.
* ``DEQUE`` followed by data is ``recieved msg data when none was expected``
  and ``USE`` with a blank name ``Must supply a (non-blank) queue name``
  (both the original's texts); ``SIZE`` ignores data.
* A queue name is the trimmed argument of ``USE`` and follows the shared
  rule (:func:`.base.valid_queue_name`: 1 to 255 bytes of UTF-8, no
  whitespace or control characters); any other is ``bad line '<name>'`` and
  the queue stays as it was.
* ``bad line '<arg>'`` echoes at most 64 bytes of its argument (then
  ``...``), so a huge argument is not sent back.
* An ``ENQUE`` item longer than ``max_payload`` (1 MiB) once decoded is
  ``item too large``. A line longer than ``max_line`` (base64 of
  ``max_payload`` plus 1 KiB) answers ``ERROR <b64("line too long")>`` and
  is skipped up to its newline.
"""
from __future__ import annotations

import base64
import binascii
from typing import Final, Optional

from ..engine import status as S
from ..engine.status import Reply
from ..engine.views import as_lease
from .base import BY_NAME, MAX_PAYLOAD, CodecState, Command, new_job, renderer, valid_queue_name
from .lines import LineCodec


def line_limit(max_payload: int) -> int:
    """The longest line: an ENQUE of ``max_payload`` bytes in base64, and 1 KiB."""
    return 4 * ((max_payload + 2) // 3) + 1024


MAX_LINE: Final = line_limit(MAX_PAYLOAD)
MAX_ECHO: Final = 64             # bytes of a bad argument sent back in an error
DEFAULT_QUEUE = "default"
HASH_SIZE: Final = 32


def error(message: bytes) -> bytes:
    return b"ERROR " + base64.b64encode(message) + b"\n"


OK_REPLY: Final = b"OK\n"
TRUE_REPLY: Final = b"TRUE\n"
FALSE_REPLY: Final = b"FALSE\n"
QUEUE_EMPTY: Final = error(b"queue is empty")   # b"ERROR cXVldWUgaXMgZW1wdHk=\n"
LINE_TOO_LONG: Final = error(b"line too long")
ITEM_TOO_LARGE: Final = error(b"item too large")


def _bad_line(arg: bytes) -> Command:
    """The original's ``bad line '<arg>'``, echoing at most ``MAX_ECHO`` bytes."""
    if len(arg) > MAX_ECHO:
        arg = arg[:MAX_ECHO] + b"..."
    return Command.local(error(b"bad line '" + arg + b"'"))


def _decode_b64(arg: bytes) -> Optional[bytes]:
    """Standard base64 with padding (``\\r`` ignored, as Go's decoder does), or None."""
    try:
        return base64.b64decode(arg.replace(b"\r", b""), validate=True)
    except (binascii.Error, ValueError):
        return None


# ---------------------------------------------------------------- rendering
def _error(reply: Reply) -> bytes:
    if reply[0] == S.TIMEOUT:
        return QUEUE_EMPTY
    return error((str(reply[1]) or "internal error").encode())


#: ``add`` (kept or dropped as a duplicate) and ``create_queue`` -> ``OK``.
render_ok: Final = renderer(lambda _: OK_REPLY, _error)
#: ``take`` -> ``ITEM <b64>``, or the queue-is-empty error.
render_item: Final = renderer(lambda value: b"ITEM " + base64.b64encode(as_lease(value).payload) + b"\n", _error)
render_has: Final = renderer(lambda held: TRUE_REPLY if held else FALSE_REPLY, _error)
render_size: Final = renderer(lambda size: b"SIZE %d\n" % size, _error)


# ------------------------------------------------------------------ codec
class QueuedCodec(LineCodec):
    """Decodes one connection's queued byte stream into :class:`Command` objects.

    Without ``allow_dups`` (the default) an ENQUE of an item the queue
    already holds is dropped and still answered ``OK``. ``max_line``
    defaults to what an item of ``max_payload`` bytes needs.
    """

    @staticmethod
    def refusal(message: str) -> bytes:
        return error(message.encode())

    def __init__(self, allow_dups: bool = False, max_line: Optional[int] = None, *,
                 max_payload: int = MAX_PAYLOAD) -> None:
        super().__init__(line_limit(max_payload) if max_line is None else max_line)
        self.max_payload = max_payload
        self.unique = not allow_dups
        self.queue = DEFAULT_QUEUE

    def line_too_long(self) -> Command:
        return Command.local(LINE_TOO_LONG)

    def decode_line(self, line: bytes) -> Command:
        head, space, rest = line.partition(b" ")
        command = head.strip()
        data = rest if space else None
        name = self.queue
        if command == b"ENQUE" or command == b"HAS":
            if data is None:
                return _bad_line(b"")
            arg = data.strip()
            item = _decode_b64(arg)
            if item is None:
                return _bad_line(arg)
            if command == b"HAS":
                if len(item) != HASH_SIZE:
                    message = f"Expected a hash of size {HASH_SIZE} got {len(item)}"
                    return Command.local(error(message.encode()))
                return Command("has", (name, item), BY_NAME, name, render_has)
            if len(item) > self.max_payload:
                return Command.local(ITEM_TOO_LARGE)
            return new_job(name, item, render_ok, unique=self.unique)
        if command == b"DEQUE":
            if data is not None:
                return Command.local(error(b"recieved msg data when none was expected"))
            return Command("take", (name,), BY_NAME, name, render_item)
        if command == b"SIZE":
            return Command("size", (name,), BY_NAME, name, render_size)
        if command == b"USE":
            return self._use(data)
        return Command.local(error(b"bad command recieved, '" + command + b"'"))

    def state_at(self, command: Command) -> CodecState:
        """The queue in use: every queue command names it (``USE`` names the
        one it switches to, and sets it again when decoded anew)."""
        return {"queue": command.key}

    def restore(self, state: CodecState) -> None:
        self.queue = state.get("queue", DEFAULT_QUEUE)

    def _use(self, data: Optional[bytes]) -> Command:
        if data is None:
            return Command.local(error(b"Must supply a queue name"))
        raw = data.strip()
        if not raw:
            return Command.local(error(b"Must supply a (non-blank) queue name"))
        name = valid_queue_name(raw)
        if name is None:
            return _bad_line(raw)
        self.queue = name
        return Command("create_queue", (name,), BY_NAME, name, render_ok)
