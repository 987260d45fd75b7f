"""The secrets of a process's TLS handshakes, where a session can take its own.

Python's ``ssl`` cannot export a session, but an :class:`ssl.SSLContext`
can log each handshake's secrets (the NSS key log format, what
``SSLKEYLOGFILE`` writes for Wireshark). A :class:`KeyLog` points that log
at a memory file (no disk, private to the process) and hands each
session the lines of its own handshake, found by its ClientHello's random;
what it read is cut from the file at once. With its traffic secrets, a
TLS 1.3 session can move to another process (:mod:`.tlscontinued`).
"""
from __future__ import annotations

import logging
import os
import ssl
from typing import Dict, Final, Optional

log: Final = logging.getLogger("queueserver.tls")

#: where a ClientHello's random lies in its first record: record header (5),
#: handshake header (4), legacy version (2)
_RANDOM_AT: Final = 11
_RANDOM_LENGTH: Final = 32


class KeyLog:
    """The key log of the contexts :meth:`attach` was given."""

    def __init__(self) -> None:
        self._fd = os.memfd_create("tls-secrets", os.MFD_CLOEXEC)

    def attach(self, context: ssl.SSLContext) -> None:
        """Log ``context``'s handshakes here (each context opens the file anew)."""
        context.keylog_filename = f"/proc/self/fd/{self._fd}"

    def take(self, client_random: bytes) -> Dict[str, bytes]:
        """The secrets logged for the handshake of ``client_random``, by
        label (``CLIENT_TRAFFIC_SECRET_0``, ...). Handshakes run one step at
        a time in this process's one thread, so what the file holds after a
        step is that step's: it is read whole and emptied."""
        size = os.fstat(self._fd).st_size
        if not size:
            return {}
        data = os.pread(self._fd, size, 0)
        os.ftruncate(self._fd, 0)   # (OpenSSL appends: its next line starts the file again)
        wanted = client_random.hex().encode()
        secrets: Dict[str, bytes] = {}
        for line in data.split(b"\n"):
            fields = line.split()
            if len(fields) == 3 and fields[1].lower() == wanted:
                try:
                    secrets[fields[0].decode("ascii")] = bytes.fromhex(fields[2].decode("ascii"))
                except ValueError:
                    continue
        return secrets

    def close(self) -> None:
        os.close(self._fd)


def client_random(first: bytes) -> Optional[bytes]:
    """The random of the ClientHello that ``first`` (a connection's first
    bytes) starts with; None if they do not hold it."""
    if len(first) < _RANDOM_AT + _RANDOM_LENGTH or first[0] != 0x16 or first[5] != 0x01:
        return None
    return first[_RANDOM_AT:_RANDOM_AT + _RANDOM_LENGTH]


def key_log_of(context: ssl.SSLContext) -> Optional[KeyLog]:
    """A key log for ``context``'s handshakes; None (one warning line) where
    the platform has none to give (no ``memfd_create`` or no ``/proc``): its
    TLS connections are then relayed when they must move."""
    try:
        keylog = KeyLog()
    except (OSError, AttributeError) as err:
        log.warning("TLS sessions cannot move between processes here (%s): TLS connections that must "
                    "move are relayed", err)
        return None
    try:
        keylog.attach(context)
    except (OSError, ValueError) as err:
        keylog.close()
        log.warning("TLS sessions cannot move between processes here (%s): TLS connections that must "
                    "move are relayed", err)
        return None
    return keylog
