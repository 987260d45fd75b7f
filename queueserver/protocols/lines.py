"""What the newline-delimited text codecs (workq, takeanumber, queued) share.

:class:`LineCodec` cuts the input into lines ending in
``\\n`` (a ``\\r`` before it is dropped), hands each to :meth:`decode_line`,
answers an overlong line with :meth:`line_too_long` and resynchronises at
the next newline, and stops decoding once a command asks to close the
connection (nothing pipelined after it runs).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Optional

from .base import Command, InputBuffer, StreamCodec


class LineCodec(StreamCodec):
    """Base class: subclasses decode one line into one :class:`Command`."""

    def __init__(self, max_line: int) -> None:
        super().__init__()
        self.max_line = max_line
        self._resync = False     # dropping the rest of an overlong line

    def decode_next(self, buf: InputBuffer) -> Optional[Command]:
        if self._resync:
            dropped = buf.drop_line()
            buf.mark = buf.pos   # nothing dropped is kept for a move
            if not dropped:
                return None
            self._resync = False
        data, pos = buf.data, buf.pos
        buf.mark = pos
        end = data.find(b"\n", pos)
        if (len(data) if end < 0 else end) - pos > self.max_line:
            self._resync = True
            return self.line_too_long()
        if end < 0:
            return None
        buf.pos = end + 1
        if end > pos and data[end - 1] == 13:  # CR before the LF
            end -= 1
        return self.decode_line(bytes(data[pos:end]))

    @abstractmethod
    def decode_line(self, line: bytes) -> Optional[Command]:
        """The command one complete line (without its line ending) asks for.

        ``None`` only from a codec whose command goes on past its line
        (workq's data blocks); that codec reads the rest itself.
        """

    @abstractmethod
    def line_too_long(self) -> Command:
        """The answer to a line longer than ``max_line``."""


def utf8(token: bytes) -> Optional[str]:
    """``token`` as text, or ``None`` when it is not valid UTF-8."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return None
