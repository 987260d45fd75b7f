"""What a TLS relay's client has acknowledged, shared with the process
that serves the connection.

A relayed connection (:mod:`.tlsrelay`) is served over a Unix socket pair,
where no TCP acknowledgement can be seen; the relay sees them on the
client's socket. It writes here, in a few bytes of shared memory (a memfd
that travels with the connection wherever it moves), up to which byte of
the plaintext stream the client's kernel has acknowledged the TLS records,
and whether the client reset. The serving process reads them to apply the
same delivery rules as on a TCP socket (:mod:`.connection`). Offsets count
the bytes written into the pair since the relay began, by every process
that served it (each notes where it stopped when it moves the connection on).
"""
from __future__ import annotations

import mmap
import os
import struct
from typing import Final

_FIELD: Final = struct.Struct("<Q")
_ACKNOWLEDGED: Final = 0      # the plaintext offset the client's kernel acknowledged, whole records only
_RESET: Final = 8             # 1 once the client reset (or its TLS failed): unacknowledged answers are lost
_WRITTEN: Final = 16          # bytes written into the pair by the processes that served it before
_SIZE: Final = 24


class RelayAcks:
    """One relayed connection's shared counters (``fd``: the memfd, to pass on)."""

    __slots__ = ("fd", "_map")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SIZE)

    @classmethod
    def create(cls) -> "RelayAcks":
        fd = os.memfd_create("queueserver-relay-acks", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _SIZE)
            return cls(fd)
        except OSError:
            os.close(fd)
            raise

    def acknowledged(self) -> int:
        value: int = _FIELD.unpack_from(self._map, _ACKNOWLEDGED)[0]
        return value

    def client_reset(self) -> bool:
        return bool(_FIELD.unpack_from(self._map, _RESET)[0])

    def written_before(self) -> int:
        value: int = _FIELD.unpack_from(self._map, _WRITTEN)[0]
        return value

    def note_acknowledged(self, offset: int) -> None:
        _FIELD.pack_into(self._map, _ACKNOWLEDGED, offset)

    def note_reset(self) -> None:
        _FIELD.pack_into(self._map, _RESET, 1)

    def note_written(self, offset: int) -> None:
        _FIELD.pack_into(self._map, _WRITTEN, offset)

    def keep_mapping_only(self) -> None:
        """Close the descriptor (it went to the served side), keeping the
        memory mapped: the relay only writes, and never passes it on."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """This process's copy (the memory lives while another holds it)."""
        try:
            self._map.close()
        finally:
            self.keep_mapping_only()


def adopt(fd: int) -> "RelayAcks | None":
    """The counters whose descriptor came with a moved connection (None
    for -1: not a relayed one); a descriptor that cannot be mapped is closed."""
    if fd < 0:
        return None
    try:
        return RelayAcks(fd)
    except (OSError, ValueError):
        os.close(fd)
        return None
