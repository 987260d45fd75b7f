"""What can go wrong with a shard's log, as exceptions an operator can read.

Every message is one line that names the file and, where it matters, the
byte offset, and says what the server does about it.
"""
from __future__ import annotations

from typing import Optional


class StoreError(Exception):
    """Base class: the log cannot be read or written as asked."""


class CorruptLog(StoreError):
    """A record that is neither valid nor a torn tail: refusing to start."""


class UnknownVersion(StoreError):
    """A segment written in a format this build does not read."""


class WrongShard(StoreError):
    """A segment that belongs to another shard or another shard count."""


class WriteFailed(StoreError):
    """Appended records could not be made durable (ENOSPC, EIO, EFBIG, ...).

    The records are kept in memory and written again once the disk allows;
    an error answer means "not known to be on disk", not "not done".
    """

    def __init__(self, path: str, error: OSError) -> None:
        self.path = path
        self.errno: Optional[int] = error.errno
        self.strerror = error.strerror or str(error)
        super().__init__(f"{path}: cannot write the log: {self.strerror}"
                         + (f" (errno {error.errno})" if error.errno else ""))
